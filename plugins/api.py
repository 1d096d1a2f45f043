"""The array driver interface.

A driver is synchronous and simple: it speaks to one array and raises the typed errors of
`ringsnap.plugins.errors`. Retries, timing, logging and running off the event loop are added once,
around every driver, by `ringsnap.plugins.middleware`. Optional abilities are separate interfaces
(`Revertible`, `Cloneable`, `Presentable`), announced in `capabilities()` and checked by the conformance suite.

Because the middleware repeats a call that failed with a retryable error, and a timed-out call may
still have happened on the array, every operation must be safe to repeat: creating what exists
already (same name, same volumes) returns it, deleting what is gone succeeds.

A group snapshot taken while a cluster's filesystems are frozen comes in steps, so that only the
snapshot itself happens under the freeze:

    prepared = driver.prepare_group_snapshot(volumes, name)   # before the freeze: checks, set-up
    ref = driver.commit_group_snapshot(prepared)              # frozen: the snapshot, nothing else
    ref = driver.describe_group_snapshot(prepared, ref)       # thawed: read what commit did not
    driver.finish_group_snapshot(prepared)                    # thawed: remove what prepare made
    driver.abort_group_snapshot(prepared)                     # instead of finish, when a run fails

The defaults make every driver fit: prepare only records the request, commit is
`create_group_snapshot` and describe returns the ref as it is. A driver with set-up work of its own
(ONTAP's temporary consistency group) overrides them and builds `create_group_snapshot` from them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Self, TypeVar, cast

from ringsnap.config import Section, validate
from ringsnap.plugins.types import (
    Capabilities,
    HostInitiators,
    Presentation,
    SnapshotInfo,
    SnapshotRef,
    Volume,
)


@dataclass(frozen=True)
class PreparedSnapshot:
    """A group snapshot made ready before the freeze: what commit, finish and abort are given.

    Valid for the driver (and array) that made it, for one snapshot; never holds secrets.
    """

    array: str
    driver: str
    name: str
    volumes: tuple[Volume, ...]
    #: What the driver set up for it (e.g. a temporary consistency group's uuid and name).
    state: tuple[tuple[str, str], ...] = ()
    #: The complete snapshot of that name, when prepare found it already taken (a repeat): commit
    #: returns it without asking the array again.
    existing: SnapshotRef | None = None

    def value(self, key: str, default: str = "") -> str:
        return dict(self.state).get(key, default)


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

    #: Whether `host_identities` can say how a host sees this driver's volumes; False for
    #: volumes that are no SAN LUN (LVM on the node itself): backups then compare nothing.
    identifies_volumes: ClassVar[bool] = True

    def host_identities(self, volumes: Sequence[Volume]) -> Mapping[str, tuple[str, ...]]:
        """How a host sees each of `volumes`, by volume name: the ids its device reports (SCSI
        NAA id, NVMe NGUID/EUI-64) as hex, any spelling `ringsnap.device_ids` reads. A volume
        left out has no id the array tells (e.g. an ONTAP volume that holds no LUN).

        Default: the `wwn` the listing gave. Read-only; backups and restores compare these with
        what the agents report before anything is flushed, frozen or stopped."""
        return {volume.name: (volume.wwn,) for volume in volumes if volume.wwn}

    @abstractmethod
    def create_group_snapshot(self, volumes: Sequence[Volume], name: str) -> SnapshotRef:
        """Take one atomic snapshot of all `volumes`, named `name`.

        Idempotent: if a complete snapshot of exactly these volumes named `name` exists, return it.
        On failure nothing half-made is left behind, or the error says what was left and where.
        """

    def prepare_group_snapshot(self, volumes: Sequence[Volume], name: str) -> PreparedSnapshot:
        """Everything `create_group_snapshot` does before the snapshot itself, done ahead of the
        freeze: validate, look for a snapshot of that name, sweep leftovers, set up a group.

        Whatever it sets up is released by `finish_group_snapshot` or `abort_group_snapshot`; if
        neither runs (a crashed coordinator), the next prepare of these volumes sweeps it.
        """
        return PreparedSnapshot(self.array, self.name, name, tuple(volumes))

    def commit_group_snapshot(self, prepared: PreparedSnapshot) -> SnapshotRef:
        """Take the snapshot `prepared` made ready; the one step done while writes stall.

        Only the snapshot call(s): no listing, no clean-up, even when it fails (the caller runs
        `abort_group_snapshot` after the thaw). Idempotent like `create_group_snapshot`.
        """
        if prepared.existing is not None:
            return prepared.existing
        return self.create_group_snapshot(prepared.volumes, prepared.name)

    def describe_group_snapshot(self, prepared: PreparedSnapshot, ref: SnapshotRef) -> SnapshotRef:
        """After the thaw, before finish: `ref` as `commit_group_snapshot` returned it, completed
        with what the commit left to read once writes flow again, so that the commit can be the
        snapshot request alone (ONTAP reads its member snapshots here). Default: `ref` itself.
        """
        return ref

    def finish_group_snapshot(self, prepared: PreparedSnapshot) -> None:  # noqa: B027
        """After a commit (good or failed) and the thaw: remove what prepare set up.

        The snapshot is kept. A failure raises a DriverError whose `left_on_array` says what remains;
        the snapshot is still good. Removing what is gone already succeeds.
        """

    def abort_group_snapshot(self, prepared: PreparedSnapshot) -> None:  # noqa: B027
        """Instead of finish when the run fails before or during the commit: release the handle.

        Never deletes a snapshot (a committed one is deleted by `delete_snapshot`). Same errors
        as `finish_group_snapshot`.
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


SettingsT = TypeVar("SettingsT", bound=Section)


class ConfiguredDriver(ArrayDriver, Generic[SettingsT]):
    """A driver whose config table is one settings model, `settings_model`.

    Subclasses name the model and take `(array, settings)`: `from_config` validates the table
    against the model (a wrong setting is a ConfigError naming the source and the key) and passes
    the result on.
    """

    #: The config table's model; the same class as `SettingsT` (a ClassVar cannot name it).
    settings_model: ClassVar[type[Section]]

    def __init__(self, array: str, settings: SettingsT) -> None:
        self._array = array
        self._settings = settings

    @classmethod
    def from_config(cls, array: str, settings: Mapping[str, Any], *, source: str) -> Self:
        validated = validate(dict(settings), cls.settings_model, source=source)
        return cls(array, cast(SettingsT, validated))

    @property
    def array(self) -> str:
        return self._array


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
        """One new volume per member of `ref`, in the order of `ref.members`, named from the
        member and `suffix`.

        Repeating it returns the clones made by the first call.
        """

    @abstractmethod
    def delete_clone(self, volume: Volume) -> None:
        """Remove a volume made by `clone`; removing one that is gone is not an error."""


class Presentable(ABC):
    """Make volumes visible to one host through the array's own mapping objects, and invisible
    again; the host finds them after a rescan by the identity each `Presentation` names.

    The host object is `host.array_host` when named, else the one whose initiators include any of
    the host's (none, or several, is a NotFoundError / DriverError saying which initiators were
    looked for and what to create). Never creates or changes host objects.
    """

    @abstractmethod
    def present(self, volumes: Sequence[Volume], host: HostInitiators) -> Sequence[Presentation]:
        """Map each of `volumes` to the host, in their order, each at a LUN id (NVMe: namespace id)
        free on that host. Idempotent: a volume already mapped to that host keeps its mapping and
        is returned as it is. A volume mapped to another host is left alone and refused."""

    @abstractmethod
    def unpresent(self, volumes: Sequence[Volume], host: HostInitiators) -> None:
        """Remove each volume's mapping to the host; a volume not mapped to it (or gone) is fine.
        The host must have let go of the devices first (unmounted, flushed, deleted)."""
