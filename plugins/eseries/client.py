"""A thin SANtricity Web Services client (httpx), paths relative to `/devmgr/v2`.

`netapp-santricity` (2016) is unmaintained and uses deprecated urllib3 calls, so this is written
for ringsnap: JSON in, JSON out, and every failure turned into a typed driver error that names the
array, the endpoint and what to fix. SANtricity's error envelope
`{errorMessage, developerMessage, localizedMessage, retcode, codeType}` is kept on the error as
`ApiFailure` (its `__cause__`), so the driver can tell array conditions apart by `retcode`.
"""

from __future__ import annotations

import ssl
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
    NotFoundError,
    QuotaExceededError,
    UnreachableError,
)

API = "/devmgr/v2"
LOGIN = "/devmgr/utils/login"
#: 422 retcodes that mean a documented limit was reached (SANtricity's return codes, as the
#: Web Services Java SDK documents them for createPIT, addPITConsistencyGroupMember and
#: createPITConsistencyGroup).
_LIMIT_RETCODES = (
    "maxPitsPerGroupExceeded",
    "maxPitsExceeded",
    "maxConsistencyGroupMembersExceeded",
    "maxConsistencyGroupsExceeded",
)


@dataclass(frozen=True)
class ApiFailure(Exception):
    """What SANtricity answered to a failed request."""

    status: int
    retcode: str
    message: str
    code_type: str

    def __str__(self) -> str:
        return f"HTTP {self.status} {self.retcode}: {self.message}"


def retcode_of(error: BaseException) -> str:
    """The SANtricity retcode behind a typed error raised by this client ("" if none)."""
    cause = error.__cause__
    return cause.retcode if isinstance(cause, ApiFailure) else ""


class EseriesClient:
    """One storage system's web services. Not thread-safe (one per driver, like the driver)."""

    def __init__(
        self,
        *,
        array: str,
        endpoint: str,
        username: str,
        password: SecretStr,
        auth: str = "basic",
        ca_file: Path | None = None,
        verify_tls: bool = True,
        timeout: float = 30.0,
    ) -> None:
        self._array = array
        self._endpoint = endpoint
        self._username = username
        self._password = password
        self._session_auth = auth == "session"
        verify: ssl.SSLContext | bool
        if not verify_tls:
            verify = False
        elif ca_file is not None:
            verify = ssl.create_default_context(cafile=str(ca_file))
        else:
            verify = True
        self._http = httpx.Client(
            base_url=endpoint,
            verify=verify,
            timeout=timeout,
            auth=None
            if self._session_auth
            else httpx.BasicAuth(username, password.get_secret_value()),
            headers={"Accept": "application/json"},
        )
        self._logged_in = False

    def close(self) -> None:
        self._http.close()

    # Verbs

    def get(self, path: str) -> Any:
        return self._call("GET", path)

    def post(self, path: str, body: Any = None) -> Any:
        return self._call("POST", path, body)

    def put(self, path: str, body: Any) -> Any:
        return self._call("PUT", path, body)

    def post_text(self, path: str, text: str) -> Any:
        """POST `text` itself as the body, not JSON-encoded: how the vendor's own client writes
        the key-value store (`/key-values/{key}`)."""
        return self._call("POST", path, text, raw=True)

    def delete(self, path: str) -> None:
        self._call("DELETE", path)

    # Plumbing

    def _call(self, method: str, path: str, body: Any = None, *, raw: bool = False) -> Any:
        if self._session_auth and not self._logged_in:
            self._login()
        response = self._send(method, API + path, body, raw=raw)
        if response.status_code == 401 and self._session_auth:
            # The session expired (idle timeout): log in again once and repeat.
            self._login()
            response = self._send(method, API + path, body, raw=raw)
        if response.status_code >= 400:
            raise self._error(method, path, response)
        if response.status_code == 204 or not response.content:
            return None
        try:
            return response.json()
        except ValueError:
            raise DriverError(
                f"{method} {path}: the web services answered something that is not JSON"
                f" (HTTP {response.status_code})",
                array=self._array,
                retryable=True,
            ) from None

    def _login(self) -> None:
        response = self._send(
            "POST",
            LOGIN,
            {
                "userId": self._username,
                "password": self._password.get_secret_value(),
                "xsrfProtected": False,
            },
        )
        if response.status_code >= 400:
            raise self._error("POST", LOGIN, response)
        self._logged_in = True

    def _send(self, method: str, url: str, body: Any, *, raw: bool = False) -> httpx.Response:
        try:
            if raw:
                return self._http.request(
                    method,
                    url,
                    content=str(body).encode(),
                    headers={"Content-Type": "application/json"},
                )
            return self._http.request(method, url, json=body if body is not None else None)
        except httpx.TimeoutException as exc:
            raise ArrayTimeoutError(
                f"{method} {url}: no answer from {self._endpoint} in time ({type(exc).__name__});"
                " the request may still have been carried out",
                array=self._array,
            ) from None
        except httpx.ConnectError as exc:
            if _is_certificate_failure(exc):
                raise ConfigurationError(
                    f"TLS certificate verification failed for {self._endpoint}: {_reason(exc)};"
                    " set ca_file to the CA that signed the web services' certificate",
                    array=self._array,
                ) from None
            raise UnreachableError(
                f"cannot reach {self._endpoint}: {_reason(exc)}; check endpoint and that SANtricity"
                " Web Services run there",
                array=self._array,
            ) from None
        except httpx.TransportError as exc:
            raise UnreachableError(
                f"{method} {url}: connection to {self._endpoint} failed: {_reason(exc)}",
                array=self._array,
            ) from None

    def _error(self, method: str, path: str, response: httpx.Response) -> DriverError:
        status = response.status_code
        try:
            envelope = response.json()
        except ValueError:
            envelope = {}
        if not isinstance(envelope, dict):
            envelope = {}
        message = str(envelope.get("errorMessage") or response.reason_phrase or "error")
        failure = ApiFailure(
            status, str(envelope.get("retcode") or ""), message, str(envelope.get("codeType") or "")
        )
        what = f"{method} {path}: {failure}"
        error: DriverError
        if status in (401, 403):
            error = AuthError(
                f"user {self._username!r} was refused by {self._endpoint} ({message});"
                " check username and password_file",
                array=self._array,
            )
        elif status == 404:
            error = NotFoundError(what, array=self._array)
        elif status == 422 and failure.retcode in _LIMIT_RETCODES:
            error = QuotaExceededError(what, array=self._array)
        elif status == 424:
            error = UnreachableError(
                f"{what}; the web services cannot talk to the storage system (offline?)",
                array=self._array,
            )
        elif status in (429, 503):
            error = BusyError(what, array=self._array, retry_after=_retry_after(response))
        else:
            error = DriverError(what, array=self._array, retryable=status >= 500)
        error.__cause__ = failure
        return error


def _is_certificate_failure(error: BaseException) -> bool:
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            return True
        if "CERTIFICATE_VERIFY_FAILED" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _reason(error: BaseException) -> str:
    return str(error) or type(error).__name__


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("Retry-After")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None
