"""Typed driver errors. `retryable` says whether trying the same call again can help.

Drivers raise these (never vendor exceptions); the middleware retries only retryable ones and the
gRPC layer maps each class to one status code.
"""

from __future__ import annotations


class DriverError(Exception):
    """A failed array operation. The message names the array and says what to do."""

    retryable = False

    def __init__(
        self,
        message: str,
        *,
        array: str = "",
        retryable: bool | None = None,
        left_on_array: tuple[str, ...] = (),
    ) -> None:
        self.array = array
        if retryable is not None:
            self.retryable = retryable
        #: Objects a failed operation could not clean up, each saying what and where; the
        #: caller must report them (empty when nothing was left behind).
        self.left_on_array = left_on_array
        text = f"array {array!r}: {message}" if array else message
        if left_on_array:
            text += "; left behind: " + ", ".join(left_on_array)
        super().__init__(text)

    def left_behind(self, left: tuple[str, ...]) -> DriverError:
        """Record what a failed operation could not clean up; keeps the type and retryability."""
        if left:
            self.left_on_array = (*self.left_on_array, *left)
            self.args = (f"{self.args[0]}; left behind: {', '.join(left)}", *self.args[1:])
        return self

    def explain(self, more: str) -> DriverError:
        """Append to the message (e.g. what was already done); keeps type and retryability."""
        self.args = (f"{self.args[0]}; {more}", *self.args[1:])
        return self


class ConfigurationError(DriverError):
    """The driver's settings are wrong (unknown driver, bad endpoint, TLS verification failure)."""


class UnreachableError(DriverError):
    """The array could not be reached; a retry may help."""

    retryable = True


class AuthError(DriverError):
    """Credentials were refused or have expired and could not be renewed."""


class NotFoundError(DriverError):
    """The volume, group or snapshot does not exist."""


class AlreadyExistsError(DriverError):
    """An object of that name exists already."""


class BusyError(DriverError):
    """The array is busy or rate limiting; a retry later may help."""

    retryable = True

    def __init__(
        self,
        message: str,
        *,
        array: str = "",
        retry_after: float | None = None,
        left_on_array: tuple[str, ...] = (),
    ) -> None:
        #: Seconds the array asked us to wait (`Retry-After`); the middleware honours it.
        self.retry_after = retry_after
        super().__init__(message, array=array, left_on_array=left_on_array)


class QuotaExceededError(DriverError):
    """A documented limit would be exceeded (snapshots per volume, volumes per group, ...)."""


class UnsupportedError(DriverError):
    """The driver or the array cannot do this."""


class ArrayTimeoutError(DriverError):
    """The array did not finish in time (a job or an asynchronous rollback)."""

    retryable = True
