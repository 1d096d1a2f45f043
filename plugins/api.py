"""The array driver interface.

A driver is synchronous and simple: it speaks to one array and raises the typed errors of
`ringsnap.plugins.errors`. Retries, timing, logging and running off the event loop are added once,
around every driver, by `ringsnap.plugins.middleware`. Optional abilities are separate interfaces
(`Revertible`, `Cloneable`), announced in `capabilities()` and checked by the conformance suite.

Because the middleware repeats a call that failed with a retryable error, and a timed-out call may
still have happened on the array, every operation must be safe to repeat: creating what exists
already (same name, same volumes) returns it, deleting what is gone succeeds.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from ringsnap.plugins.types import Capabilities, SnapshotInfo, SnapshotRef, Volume


class ArrayDriver(ABC):
    """One array, reached through its management API."""

    #: The entry-point name the driver is registered under (`ringsnap.drivers`).
    name: ClassVar[str]

    @classmethod
    @abstractmethod
    def from_config(cls, array: str, settings: Mapping[str, Any], *, source: str) -> ArrayDriver:
        """Build a driver for the array named `array` from its config table.

        Raises ringsnap.errors.ConfigError naming `source` and the key when a setting is wrong.
        Must not contact the array (see `check`).
        """

    @property
    @abstractmethod
    def array(self) -> str:
        """The array's name in the coordinator's config."""

    @abstractmethod
    def capabilities(self) -> Capabilities: ...

    @abstractmethod
    def check(self) -> None:
        """Reach the array and authenticate; raise a typed error that says what to fix."""

    @abstractmethod
    def list_volumes(self) -> Sequence[Volume]:
        """Every volume this driver may snapshot (pagination handled inside)."""

    @abstractmethod
    def create_group_snapshot(self, volumes: Sequence[Volume], name: str) -> SnapshotRef:
        """Take one atomic snapshot of all `volumes`, named `name`.

        Idempotent: if a complete snapshot of exactly these volumes named `name` exists, return it.
        On failure nothing half-made is left behind, or the error says what was left and where.
        """

    @abstractmethod
    def list_snapshots(self, volumes: Sequence[Volume]) -> Sequence[SnapshotInfo]:
        """Group snapshots that cover `volumes` (made by this driver)."""

    @abstractmethod
    def get_snapshot(self, ref: SnapshotRef) -> SnapshotInfo:
        """Raise NotFoundError if the snapshot no longer exists."""

    @abstractmethod
    def delete_snapshot(self, ref: SnapshotRef) -> None:
        """Delete the group snapshot; deleting one that is gone is not an error."""

    def close(self) -> None:  # noqa: B027 - optional hook, most drivers hold nothing
        """Release sessions and connections."""


class Revertible(ABC):
    """Put volumes back to a snapshot, in place. The volumes must not be in use (unmounted)."""

    @abstractmethod
    def revert_plan(self, ref: SnapshotRef) -> Sequence[str]:
        """What reverting will destroy besides the current contents (e.g. newer snapshots)."""

    @abstractmethod
    def revert(self, ref: SnapshotRef) -> None:
        """Revert every member volume of `ref` and wait until the array says it is done."""


class Cloneable(ABC):
    """Make new, writable volumes from a snapshot, leaving the originals alone."""

    @abstractmethod
    def clone(self, ref: SnapshotRef, suffix: str) -> Sequence[Volume]:
        """One new volume per member of `ref`, named from the member and `suffix`.

        Repeating it returns the clones made by the first call.
        """

    @abstractmethod
    def delete_clone(self, volume: Volume) -> None:
        """Remove a volume made by `clone`; removing one that is gone is not an error."""
