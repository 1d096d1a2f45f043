"""What the workflows need from the outside world, as domain types.

The backup and restore workflows import nothing from gRPC, the driver or the database: they talk to
these protocols. `ringsnap.coordinator.agents.connection` implements `AgentPort` over gRPC with
mutual TLS (every agent client raises `AgentError`, defined here so that the workflows catch it
without importing the clients); `ringsnap.plugins.middleware.AsyncDriver` is the `ArrayPort` of any
driver; tests may fake both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol, runtime_checkable

from ringsnap import device_ids
from ringsnap.errors import RingsnapError
from ringsnap.plugins.api import PreparedSnapshot
from ringsnap.plugins.types import Capabilities, SnapshotInfo, SnapshotRef, Volume
from ringsnap.volume_facts import VolumeFacts


class AgentError(RingsnapError):
    """An agent call failed; the message names the node, the call and the gRPC status.

    `code` is the gRPC status name ("FAILED_PRECONDITION": the node refused and nothing changed,
    e.g. Cassandra runs or a file is open; "UNAVAILABLE": unreachable, or a command or hook
    failed; "" when the error did not come from a call).
    """

    def __init__(self, message: str, *, code: str = "") -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class FilesystemFacts:
    mount_point: str
    device: str
    fs_type: str
    role: str
    serial: str = ""
    wwn: str = ""
    loop_backing_file: str = ""
    nguid: str = ""
    eui: str = ""
    fs_uuid: str = ""
    #: Where the agent read the identity, or why there is none.
    identity_source: str = ""
    #: The configured Cassandra directories on it.
    cassandra_directories: tuple[str, ...] = ()

    def identifiers(self) -> frozenset[str]:
        """The canonical ids of its device (`ringsnap.device_ids`): what an array volume's
        identity must be one of."""
        return device_ids.canonical_set((self.wwn, self.nguid, self.eui))

    def described(self) -> str:
        """Its device's identity as a person reads it: "naa.…", "nguid …", or "none"."""
        if self.wwn:
            return self.wwn
        if self.nguid or self.eui:
            return f"NVMe {'NGUID ' + self.nguid if self.nguid else 'EUI-64 ' + self.eui}"
        return "none"


@dataclass(frozen=True)
class NodeFacts:
    """What an agent reports about its node."""

    cluster_name: str
    host_id: str
    datacenter: str
    rack: str
    cassandra_version: str
    rpc_address: str
    tokens: tuple[str, ...] = ()
    filesystems: tuple[FilesystemFacts, ...] = ()


@dataclass(frozen=True)
class FreezeReceipt:
    mount_points: tuple[str, ...]
    #: The node's freeze on its own clock: first syncfs/FIFREEZE started to the last FIFREEZE
    #: returned (its filesystems freeze in parallel, so this is a span, not a sum).
    freeze_seconds: float
    lease_expires_at: datetime


@dataclass(frozen=True)
class ThawReceipt:
    #: Mount points this call thawed (empty if the lease had already thawed them).
    thawed: tuple[str, ...]
    #: The longest FITHAW on this node (its filesystems thaw in parallel).
    thaw_seconds: float
    #: Longest time any filesystem of the node stayed frozen.
    frozen_for_seconds: float
    lease_expired: bool


@dataclass(frozen=True)
class SSTableComponent:
    name: str
    path: str
    size_bytes: int


@dataclass(frozen=True)
class SSTable:
    """One SSTable of a node's manifest."""

    data_directory: str
    keyspace: str
    table: str
    table_directory: str
    generation: str
    format: str
    version: str
    components: tuple[SSTableComponent, ...]
    data_digest_crc32: str
    complete: bool
    problem: str = ""

    @property
    def size_bytes(self) -> int:
        return sum(component.size_bytes for component in self.components)


#: A filesystem of a node's Cassandra directories as its agent reports it (the agent's own type).
NodeVolumeFacts = VolumeFacts


@dataclass(frozen=True)
class VolumeState:
    """What an agent reports while Cassandra may be down: is it running, and the node's volumes."""

    cassandra_running: bool
    #: How that was determined, or why Cassandra is taken as not running.
    detail: str
    volumes: tuple[NodeVolumeFacts, ...] = ()
    #: The host's initiators (iSCSI IQNs, FC WWPNs, NVMe host NQNs): whom arrays map clones to.
    iqns: tuple[str, ...] = ()
    wwpns: tuple[str, ...] = ()
    nqns: tuple[str, ...] = ()


@dataclass(frozen=True)
class DiscardedDirectory:
    """A directory of replay state whose contents an agent deleted (the directory stays)."""

    path: str
    #: saved_caches, cdc_raw, commitlog or hints.
    kind: str
    files: int
    bytes: int


@dataclass(frozen=True)
class RestoredTable:
    """What restoring a native snapshot did to one table directory of a node."""

    data_directory: str
    keyspace: str
    table_directory: str
    #: False: the backup does not hold the table (created after it): its live files were moved
    #: aside all the same, and nothing was put in their place.
    restored: bool
    files_moved: int
    files_linked: int
    #: Where the table's live files were moved (kept): `<table dir>/.ringsnap-replaced/<restore>`.
    replaced_directory: str


class AgentPort(Protocol):
    """One node's agent. Every call raises `AgentError` naming the node on failure."""

    @property
    def node(self) -> str: ...

    async def node_info(self) -> NodeFacts: ...

    async def flush(self) -> float: ...

    async def freeze(self, run_id: str, lease_seconds: float) -> FreezeReceipt: ...

    async def renew(self, run_id: str, lease_seconds: float) -> datetime: ...

    async def thaw(self, run_id: str) -> ThawReceipt: ...

    async def manifest(self, snapshot_tag: str = "") -> list[SSTable]:
        """The SSTables of the live data directories, or of native snapshot `snapshot_tag`."""
        ...

    # -- native snapshots (clusters with `snapshots = "native"`)

    async def create_snapshot(self, tag: str) -> float:
        """Take a native snapshot of every keyspace (Cassandra flushes each table first); returns
        the seconds it took."""
        ...

    async def clear_snapshot(self, tag: str) -> None:
        """Remove native snapshot `tag` (nothing happens when there is none)."""
        ...

    # -- restores: `AgentError.code` tells a refusal (FAILED_PRECONDITION: Cassandra runs, a file
    # is open, not released by this operation, wrong filesystem UUID) from a failure (UNAVAILABLE).

    async def volume_state(self) -> VolumeState:
        """Whether Cassandra runs, and the node's volumes; answers while Cassandra is down."""
        ...

    async def stop_cassandra(self, *, drain: bool) -> bool:
        """Stop Cassandra (draining it first if asked and it answers); True if it drained."""
        ...

    async def start_cassandra(self, *, wait_seconds: float, until_gossip: bool = False) -> float:
        """Start Cassandra and wait up to `wait_seconds` for it to serve; returns seconds taken."""
        ...

    async def release_volumes(
        self, run_id: str, mount_points: Sequence[str]
    ) -> tuple[NodeVolumeFacts, ...]:
        """Unmount (and detach) the volumes at `mount_points` (empty: every Cassandra volume)."""
        ...

    async def attach_volumes(
        self,
        run_id: str,
        volumes: Sequence[tuple[str, str]],
        identities: Mapping[str, str] | None = None,
    ) -> tuple[NodeVolumeFacts, ...]:
        """Attach and mount (mount point, array volume name) pairs `run_id` released;
        `identities`, by mount point, that of a clone presented to the node's host."""
        ...

    async def discard_replay_state(
        self, run_id: str, *, hints: bool
    ) -> tuple[DiscardedDirectory, ...]:
        """Empty the replay state outside the volumes `run_id` released and attached (all of
        it after a `restore_snapshot` of the same operation)."""
        ...

    async def restore_snapshot(self, run_id: str, tag: str) -> tuple[RestoredTable, ...]:
        """With Cassandra stopped, put every table back to native snapshot `tag`, in place (the
        live files are kept aside); repeating it finishes what was started."""
        ...


@runtime_checkable
class ArrayPort(Protocol):
    """One array, through the driver middleware (retries, timing, logs, off the event loop):
    `ringsnap.plugins.middleware.AsyncDriver` around any driver.

    The operations are those of `ringsnap.plugins.api`, as coroutines. A group snapshot taken under
    a freeze comes in steps: prepare before the freeze, commit while frozen (the only array work
    the freeze budget bounds), then finish after the thaw, or abort when the run fails. Revert and
    clone raise `UnsupportedError`, naming the driver and the array, when the driver cannot.
    """

    @property
    def array(self) -> str: ...

    @property
    def name(self) -> str: ...

    def capabilities(self) -> Capabilities: ...

    async def check(self) -> None: ...

    async def list_volumes(self) -> Sequence[Volume]: ...

    #: False for a driver whose volumes are no SAN LUN (LVM): nothing to compare.
    @property
    def identifies_volumes(self) -> bool: ...

    async def host_identities(self, volumes: Sequence[Volume]) -> Mapping[str, tuple[str, ...]]: ...

    async def create_group_snapshot(self, volumes: Sequence[Volume], name: str) -> SnapshotRef: ...

    async def prepare_group_snapshot(
        self, volumes: Sequence[Volume], name: str
    ) -> PreparedSnapshot: ...

    async def commit_group_snapshot(self, prepared: PreparedSnapshot) -> SnapshotRef: ...

    async def describe_group_snapshot(
        self, prepared: PreparedSnapshot, ref: SnapshotRef
    ) -> SnapshotRef: ...

    async def finish_group_snapshot(self, prepared: PreparedSnapshot) -> None: ...

    async def abort_group_snapshot(self, prepared: PreparedSnapshot) -> None: ...

    async def list_snapshots(self, volumes: Sequence[Volume]) -> Sequence[SnapshotInfo]: ...

    async def get_snapshot(self, ref: SnapshotRef) -> SnapshotInfo: ...

    async def delete_snapshot(self, ref: SnapshotRef) -> None: ...

    async def revert_plan(self, ref: SnapshotRef) -> Sequence[str]: ...

    async def revert(self, ref: SnapshotRef) -> None: ...

    async def clone(self, ref: SnapshotRef, suffix: str) -> Sequence[Volume]: ...

    async def delete_clone(self, volume: Volume) -> None: ...

    async def close(self) -> None: ...


@dataclass
class PhaseClock:
    """Durations of the phases of one run, in the order they ran."""

    phases: dict[str, float] = field(default_factory=dict)

    def add(self, phase: str, seconds: float) -> None:
        self.phases[phase] = self.phases.get(phase, 0.0) + seconds


class CanaryWriter(Protocol):
    """Writes this backup's canary rows (one per node, at CL=ALL); returns their ids by host id."""

    async def write_canaries(self, backup_id: str, host_ids: Sequence[str]) -> dict[str, str]: ...
