"""Typed driver errors. `retryable` says whether trying the same call again can help.

Drivers raise these (never vendor exceptions); the middleware retries only retryable ones and the
gRPC layer maps each class to one status code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ringsnap.plugins.types import SnapshotRef


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


class SnapshotMismatchError(DriverError):
    """A snapshot the array made does not hold exactly the volumes asked for (its group was changed
    on the array between the prepare and the snapshot): not the backup asked for, so refused.
    `snapshot` is what the array made, every volume it holds a member (to delete, or to clean up
    later); `missing` and `unexpected` are the volumes asked for and not in it, and the reverse."""

    def __init__(
        self,
        *,
        array: str,
        group: str,
        snapshot: SnapshotRef,
        missing: tuple[str, ...],
        unexpected: tuple[str, ...],
    ) -> None:
        self.snapshot = snapshot
        self.missing = missing
        self.unexpected = unexpected
        differences = [
            f"{label}: {', '.join(names)}"
            for label, names in (("missing", missing), ("unexpected", unexpected))
            if names
        ]
        super().__init__(
            f"snapshot {snapshot.snapshot_name!r} of {group} does not hold the volumes asked for"
            f" ({'; '.join(differences)}): {group} was changed on the array between the prepare"
            " and the snapshot; refused. The next backup's prepare puts the group right where the"
            f" driver can; if it is refused again, make {group} hold exactly the cluster's volumes"
            " on the array",
            array=array,
        )


def mismatch(
    *,
    array: str,
    group: str,
    snapshot: SnapshotRef,
    wanted: set[str],
    held: set[str],
) -> SnapshotMismatchError | None:
    """The refusal of `snapshot` when the volumes it `held` are not those `wanted` (else None)."""
    if held == wanted:
        return None
    return SnapshotMismatchError(
        array=array,
        group=group,
        snapshot=snapshot,
        missing=tuple(sorted(wanted - held)),
        unexpected=tuple(sorted(held - wanted)),
    )


class UnsupportedError(DriverError):
    """The driver or the array cannot do this."""


class SnapshotLostError(DriverError):
    """The snapshot is there but its contents are lost (an overflowed thick LVM snapshot): it can
    be neither restored nor drilled; the message names the node and what to do."""


class ArrayTimeoutError(DriverError):
    """The array did not finish in time (a job or an asynchronous rollback)."""

    retryable = True
