"""What a failed ONTAP REST call means, as one typed `ringsnap.plugins.errors` error naming the
array and saying what to do: TLS and connection failures from `requests`, HTTP statuses and ONTAP
error codes, and failed jobs (the SDK keeps only a polled job's message, so the job is looked up
again for its code)."""

from __future__ import annotations

import requests
from netapp_ontap.error import NetAppRestError
from netapp_ontap.host_connection import HostConnection
from netapp_ontap.resources.job import Job

from ringsnap.plugins.errors import (
    AlreadyExistsError,
    ArrayTimeoutError,
    AuthError,
    BusyError,
    ConfigurationError,
    DriverError,
    NotFoundError,
    QuotaExceededError,
    UnreachableError,
)
from ringsnap.plugins.ontap.config import OntapSettings

CODE_NOT_FOUND = "4"
CODE_DUPLICATE = "1"
CODE_NOT_AUTHORIZED = "6"
CODE_VOLUME_BUSY = "524486"
CODE_CG_SNAPSHOT_EXISTS = "53411921"
_QUOTA_WORDS = ("maximum number", "at most", "limit")


class ErrorTranslator:
    """One array's translation of SDK errors into driver errors."""

    def __init__(self, array: str, settings: OntapSettings, connection: HostConnection) -> None:
        self._array = array
        self._settings = settings
        self._connection = connection

    def translate(self, error: NetAppRestError, doing: str, *, job: str = "") -> DriverError:
        """The typed error of a failed SDK call; `job` is the request line its job describes."""
        endpoint = self._settings.endpoint
        array = self._array
        cause = getattr(error, "cause", None)
        if isinstance(cause, requests.exceptions.SSLError):
            return ConfigurationError(
                f"TLS verification of {endpoint} failed while {doing}: {_reason(cause)}; set"
                " ca_file to the CA certificate that signed the array's certificate (and make"
                " sure the endpoint host name is in it)",
                array=array,
            )
        if isinstance(cause, requests.exceptions.ReadTimeout) or _is_read_timeout(cause):
            return ArrayTimeoutError(
                f"{endpoint} did not answer within {self._settings.request_timeout:g}s while"
                f" {doing}; the array may be overloaded (request_timeout sets the limit)",
                array=array,
            )
        if isinstance(cause, requests.exceptions.ConnectionError):
            return UnreachableError(
                f"cannot reach {endpoint} while {doing}: {_reason(cause)}; check the endpoint"
                " setting and that the management interface is up",
                array=array,
            )
        status = error.status_code
        if status is not None:
            body = error.response_body or {}
            details = body.get("error", {}) if isinstance(body, dict) else {}
            message = str(details.get("message") or error.response_text or "").strip()
            code = str(details.get("code", ""))
            headers = (
                error.http_err_response.http_response.headers if error.http_err_response else {}
            )
            return self._classify(status, code, message, doing, headers.get("Retry-After"))
        text = str(error)
        if text.startswith(("Job failed:", "The job to create")):
            message = text.split(":", 1)[1].strip() if ":" in text else text
            code = self._failed_job_code(job, message) if job else ""
            return self._classify(None, code, message, doing, None, from_job=True)
        if "Polling timed out" in text:
            return ArrayTimeoutError(
                f"a job did not finish within job_timeout={self._settings.job_timeout}s while"
                f" {doing}: {text}",
                array=array,
            )
        return DriverError(f"{doing} failed: {text}", array=array)

    def _classify(
        self,
        status: int | None,
        code: str,
        message: str,
        doing: str,
        retry_after: str | None,
        *,
        from_job: bool = False,
    ) -> DriverError:
        array = self._array
        where = "a job" if from_job else f"HTTP {status}"
        detail = f"{message} ({where}, code {code or 'none'})"
        if status == 401:
            return AuthError(
                f"{self._settings.endpoint} refused the credentials of user"
                f" {self._settings.username!r} while {doing}; check username and password_file",
                array=array,
            )
        if status == 403 or code == CODE_NOT_AUTHORIZED:
            return AuthError(
                f"user {self._settings.username!r} is not allowed to do this ({doing}): {detail};"
                " give its role the snapshot and volume privileges",
                array=array,
            )
        if code == CODE_NOT_FOUND or status == 404:
            return NotFoundError(f"{doing}: {detail}", array=array)
        if code in {CODE_DUPLICATE, CODE_CG_SNAPSHOT_EXISTS}:
            return AlreadyExistsError(f"{doing}: {detail}", array=array)
        if code == CODE_VOLUME_BUSY or status in {429, 503}:
            return BusyError(f"{doing}: {detail}", array=array, retry_after=_seconds(retry_after))
        if any(word in message.lower() for word in _QUOTA_WORDS):
            return QuotaExceededError(f"{doing}: {detail}", array=array)
        retryable = status is not None and status >= 500
        return DriverError(f"{doing} failed: {detail}", array=array, retryable=retryable)

    def _failed_job_code(self, description: str, message: str) -> str:
        """Recover the code of a failed job the SDK polled (it keeps only the message)."""
        try:
            jobs = list(
                Job.get_collection(
                    connection=self._connection,
                    state="failure",
                    description=description,
                    fields="uuid,code,message,end_time",
                )
            )
        except NetAppRestError:
            return ""
        for job in reversed(jobs):
            if getattr(job, "message", None) == message:
                return str(getattr(job, "code", ""))
        return ""


def _reason(error: BaseException) -> str:
    """The innermost useful message of a requests/urllib3 error chain."""
    text = str(error)
    for marker in ("certificate verify failed", "Connection refused", "Name or service not known"):
        if marker in text:
            return marker
    return text.split("Caused by", 1)[-1].strip(" ()'\"") if "Caused by" in text else text


def _is_read_timeout(error: BaseException | None) -> bool:
    """urllib3 wraps read timeouts of retried GETs in a ConnectionError."""
    return error is not None and "Read timed out" in str(error)


def _seconds(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        return None
