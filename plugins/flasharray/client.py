"""A thin FlashArray REST 2.x client over httpx.

It knows the protocol, not the driver's intent: version negotiation, the `api-token` login and the
`x-auth-token` session (renewed once when the array answers 401, whatever its wording), pagination by
`continuation_token`, and the error envelope. Failures come out as typed driver errors; a rejected
request keeps the array's messages (`RejectedError.messages`) so the driver can interpret them.
No retries here: a 429/503 (or 500 "Server is busy") becomes BusyError carrying `Retry-After`, and
the shared middleware decides when to try again.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from pydantic import SecretStr

from ringsnap.plugins.errors import (
    ArrayTimeoutError,
    AuthError,
    BusyError,
    ConfigurationError,
    DriverError,
    UnreachableError,
)

#: Purity's overload answer that is not a 429/503.
SERVER_BUSY = "Server is busy"
_PAGE_SIZE = 500

Params = Mapping[str, str | int | bool]


@dataclass(frozen=True)
class ApiMessage:
    """One entry of the `errors` envelope."""

    message: str
    context: str = ""
    location_context: str = ""

    def __str__(self) -> str:
        return f"{self.context}: {self.message}" if self.context else self.message


class RejectedError(DriverError):
    """The array refused the request (4xx other than auth and rate limits, or a 5xx)."""

    def __init__(
        self,
        *,
        array: str,
        method: str,
        path: str,
        status: int,
        messages: tuple[ApiMessage, ...],
        retryable: bool = False,
    ) -> None:
        self.status = status
        self.messages = messages
        text = "; ".join(str(m) for m in messages) or "no error message"
        super().__init__(
            f"{method} {path} answered HTTP {status}: {text}", array=array, retryable=retryable
        )

    def mentions(self, fragment: str) -> bool:
        """Whether any of the array's messages contains `fragment` (case-insensitive)."""
        return any(fragment.lower() in m.message.lower() for m in self.messages)


class FlashArrayClient:
    """One HTTPS connection pool and one session to one FlashArray."""

    def __init__(
        self,
        *,
        array: str,
        endpoint: str,
        api_token: SecretStr,
        ca_file: Path | None = None,
        verify_tls: bool = True,
        api_version: str | None = None,
        timeout: float = 30.0,
    ) -> None:
        self._array = array
        self._endpoint = endpoint
        self._token = api_token
        self._ca_file = ca_file
        self._pinned_version = api_version
        self._version: str | None = None
        self._session: str | None = None
        verify: ssl.SSLContext | bool = False
        if verify_tls:
            verify = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
        self._http = httpx.Client(base_url=endpoint, verify=verify, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    # -- session -----------------------------------------------------------------------------

    def api_versions(self) -> list[str]:
        """`GET /api/api_version` (no authentication)."""
        response = self._send("GET", "/api/api_version")
        self._raise_for_status(response, "GET", "/api/api_version")
        body = self._json(response, "GET", "/api/api_version")
        versions = body.get("version", [])
        return [str(v) for v in versions] if isinstance(versions, list) else []

    def login(self) -> None:
        """Choose the REST version and open a session; AuthError if the token is refused."""
        version = self._negotiate()
        path = f"/api/{version}/login"
        response = self._send("POST", path, headers={"api-token": self._token.get_secret_value()})
        if response.status_code in (400, 401, 403):
            raise AuthError(
                f"the API token was refused ({_summary(response)}); check that api_token_file"
                " holds a current token of an array user (pureadmin list --api-token)",
                array=self._array,
            )
        self._raise_for_status(response, "POST", path)
        session = response.headers.get("x-auth-token")
        if not session:
            raise RejectedError(
                array=self._array,
                method="POST",
                path=path,
                status=response.status_code,
                messages=(ApiMessage("login answered without an x-auth-token header"),),
            )
        self._session = session

    def _negotiate(self) -> str:
        if self._version is not None:
            return self._version
        offered = [v for v in self.api_versions() if v.startswith("2.")]
        if self._pinned_version is not None:
            if self._pinned_version not in offered:
                raise ConfigurationError(
                    f"api_version {self._pinned_version} is not offered by the array"
                    f" (it offers {', '.join(offered) or 'no 2.x version'}); remove the setting"
                    " or pick one of those",
                    array=self._array,
                )
            self._version = self._pinned_version
        elif not offered:
            raise ConfigurationError(
                "the array offers no REST 2.x version; Purity 5.3 or later is required",
                array=self._array,
            )
        else:
            self._version = max(offered, key=lambda v: tuple(int(p) for p in v.split(".")))
        return self._version

    # -- calls -------------------------------------------------------------------------------

    def get(self, resource: str, params: Params | None = None) -> dict[str, Any]:
        return self.call("GET", resource, params)

    def post(self, resource: str, params: Params | None = None, body: Any = None) -> dict[str, Any]:
        return self.call("POST", resource, params, body)

    def patch(
        self, resource: str, params: Params | None = None, body: Any = None
    ) -> dict[str, Any]:
        return self.call("PATCH", resource, params, body)

    def delete(self, resource: str, params: Params | None = None) -> dict[str, Any]:
        return self.call("DELETE", resource, params)

    def items(self, resource: str, params: Params | None = None) -> Iterator[dict[str, Any]]:
        """Every item of a listing, following `continuation_token` page by page."""
        query: dict[str, str | int | bool] = {"limit": _PAGE_SIZE, **(params or {})}
        while True:
            page = self.get(resource, query)
            items = page.get("items") or []
            yield from items
            token = page.get("continuation_token")
            if not token or not page.get("more_items_remaining", True) or not items:
                return
            query["continuation_token"] = token

    def call(
        self, method: str, resource: str, params: Params | None = None, body: Any = None
    ) -> dict[str, Any]:
        """One authenticated call to `/api/<version>/<resource>`; renews the session once."""
        if self._session is None:
            self.login()
        path = f"/api/{self._version}/{resource}"
        response = self._authenticated(method, path, params, body)
        if response.status_code == 401:
            # Whatever the 401 says ("Invalid session." after an idle hour, or other wording),
            # the session is renewed once, as Pure's own client does (py-pure-client
            # `_call_with_retries`: any 401 refreshes the auth header and retries once).
            self._session = None
            self.login()
            response = self._authenticated(method, path, params, body)
        if response.status_code == 401:
            raise AuthError(
                f"{method} {path} refused a fresh session ({_summary(response)}); check the"
                " array user's role and that the token in api_token_file is still valid",
                array=self._array,
            )
        self._raise_for_status(response, method, path)
        return self._json(response, method, path)

    def _authenticated(
        self, method: str, path: str, params: Params | None, body: Any
    ) -> httpx.Response:
        assert self._session is not None
        return self._send(
            method, path, params=params, body=body, headers={"x-auth-token": self._session}
        )

    def _send(
        self,
        method: str,
        path: str,
        *,
        params: Params | None = None,
        body: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        query = {k: _query_value(v) for k, v in (params or {}).items()}
        try:
            return self._http.request(method, path, params=query, json=body, headers=headers)
        except httpx.ConnectError as exc:
            if _is_certificate_failure(exc):
                where = f"ca_file {self._ca_file}" if self._ca_file else "the system trust store"
                raise ConfigurationError(
                    f"TLS verification of {self._endpoint} failed against {where} ({_reason(exc)});"
                    " set ca_file to the PEM bundle of the CA that signed the array's certificate"
                    " and check that the endpoint's host name is in that certificate",
                    array=self._array,
                ) from None
            raise UnreachableError(
                f"cannot connect to {self._endpoint} ({_reason(exc)}); check endpoint and that the"
                " management interface is reachable",
                array=self._array,
            ) from None
        except httpx.TimeoutException as exc:
            raise ArrayTimeoutError(
                f"{method} {path} got no answer from {self._endpoint} in time"
                f" ({type(exc).__name__}); the array may be overloaded, or raise timeout_seconds",
                array=self._array,
            ) from None
        except httpx.TransportError as exc:
            raise UnreachableError(
                f"{method} {path} to {self._endpoint} failed: {_reason(exc)}", array=self._array
            ) from None

    def _raise_for_status(self, response: httpx.Response, method: str, path: str) -> None:
        status = response.status_code
        if status < 400:
            return
        messages = _messages(response)
        busy = status == 500 and any(m.message == SERVER_BUSY for m in messages)
        if status in (429, 503) or busy:
            raise BusyError(
                f"{method} {path} answered HTTP {status} ({_summary(response)}); the array is"
                " rate limiting or busy",
                array=self._array,
                retry_after=_retry_after(response.headers),
            )
        raise RejectedError(
            array=self._array,
            method=method,
            path=path,
            status=status,
            messages=messages,
            # Every driver operation is idempotent, so a server-side failure is worth repeating;
            # a 4xx says the request itself is wrong.
            retryable=status >= 500,
        )

    def _json(self, response: httpx.Response, method: str, path: str) -> dict[str, Any]:
        if not response.content:
            return {}
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise RejectedError(
                array=self._array,
                method=method,
                path=path,
                status=response.status_code,
                messages=(ApiMessage("the answer is not a JSON object"),),
            )
        return body


def _messages(response: httpx.Response) -> tuple[ApiMessage, ...]:
    try:
        body = response.json()
    except ValueError:
        return ()
    if not isinstance(body, dict):
        return ()
    errors = body.get("errors")
    if isinstance(errors, list):
        return tuple(
            ApiMessage(
                str(e.get("message", "")),
                str(e.get("context") or ""),
                str(e.get("location_context") or ""),
            )
            for e in errors
            if isinstance(e, dict)
        )
    # The API gateway in front of Purity answers rate limits as {"message": "..."}.
    if isinstance(body.get("message"), str):
        return (ApiMessage(body["message"]),)
    return ()


def _summary(response: httpx.Response) -> str:
    text = "; ".join(str(m) for m in _messages(response))
    return f"HTTP {response.status_code}: {text}" if text else f"HTTP {response.status_code}"


def _retry_after(headers: httpx.Headers) -> float | None:
    for name in ("retry-after", "ratelimit-reset"):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value)
        except ValueError:
            continue  # an HTTP date: rare from Purity, and the middleware backs off anyway
        return max(seconds, 0.0)
    return None


def _query_value(value: str | int | bool) -> str | int:
    return ("true" if value else "false") if isinstance(value, bool) else value


def _is_certificate_failure(exc: httpx.ConnectError) -> bool:
    cause: BaseException | None = exc
    seen: set[int] = set()
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, ssl.SSLCertVerificationError):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return "CERTIFICATE_VERIFY_FAILED" in str(exc)


def _reason(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
