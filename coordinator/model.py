"""The coordinator's domain values: backups, their nodes, phases, cleanups and operations.

Plain frozen dataclasses and string enums, free of gRPC, SQL and driver code, so that the catalog,
retention, the workflows and the gRPC servicers all speak the same types. Every timestamp is an
aware `datetime` in UTC.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime

from ringsnap.coordinator.runs.resources import Resource, native_tag
from ringsnap.plugins.types import SnapshotRef


class BackupState(enum.StrEnum):
    RUNNING = "running"
    COMPLETE = "complete"
    FAILED = "failed"
    #: Some nodes were left out, as the cluster's policy allowed; each says why.
    PARTIAL = "partial"

    @property
    def usable(self) -> bool:
        """A backup that can be restored (for the nodes it holds)."""
        return self in (BackupState.COMPLETE, BackupState.PARTIAL)


class QuiesceMode(enum.StrEnum):
    #: Flush, freeze every filesystem, snapshot, thaw (as the vendor papers do).
    FREEZE = "freeze"
    FLUSH_ONLY = "flush-only"
    #: Crash-consistent array snapshot only.
    NONE = "none"


class SnapshotKind(enum.StrEnum):
    """What a cluster's backups are made of."""

    #: Group snapshots of the nodes' volumes on their arrays.
    ARRAY = "array"
    #: Cassandra's own snapshots (`nodetool snapshot`): hard links in each table directory of each
    #: node, tagged with the backup id; for nodes on direct-attached storage.
    NATIVE = "native"


class Verification(enum.StrEnum):
    #: Never restored or drilled: never checked (a check that fails is FAILED).
    UNVERIFIED = "unverified"
    PROVEN = "proven"
    FAILED = "failed"


class VolumeRole(enum.StrEnum):
    DATA = "data"
    COMMITLOG = "commitlog"
    #: Data and commit log on one volume.
    DATA_AND_COMMITLOG = "data+commitlog"


class OperationKind(enum.StrEnum):
    BACKUP = "backup"
    RESTORE = "restore"
    DELETE = "delete"
    DRILL = "drill"
    RETENTION = "retention"
    EXPORT = "export"


class OperationState(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (OperationState.SUCCEEDED, OperationState.FAILED, OperationState.CANCELLED)


@dataclass(frozen=True, kw_only=True)
class NodeVolume:
    """One volume of a node in a backup: where it lives and what it holds."""

    array: str
    #: The array's name for the volume (as configured for the node).
    volume: str
    role: VolumeRole
    #: The array's own identifier, once the plan resolved it.
    volume_id: str = ""
    size_bytes: int = 0
    wwn: str = ""


@dataclass(frozen=True, kw_only=True)
class BackupNode:
    name: str
    host_id: str = ""
    volumes: tuple[NodeVolume, ...] = ()
    #: The canary row written for this node before the quiesce.
    canary_id: str = ""
    #: Why the node is not part of a partial backup; empty for a node that is.
    excluded_reason: str = ""
    #: From the node's manifest, once recorded.
    sstable_count: int = 0
    bytes: int = 0

    @property
    def included(self) -> bool:
        return not self.excluded_reason


@dataclass(frozen=True, kw_only=True)
class PhaseTiming:
    phase: str
    seconds: float


@dataclass(frozen=True, kw_only=True)
class FreezeWindow:
    """First freeze sent to last thaw answered, and its parts, in seconds.

    On the coordinator's clock: `total`, `freezing` (first freeze request sent to the last node's
    answer), `array_call` (the snapshot work alone) and `thawing` (thaw requests sent to the last
    answer). The agents' own figures beside them: `slowest_freeze` and `slowest_thaw`, each node's
    span of its (parallel) ioctls on its own clock. `overhead` is what coordination added on top of
    the slowest node's freeze, the array call and the slowest node's thaw: RPC round trips,
    fan-out and scheduling. Each agent's span lies inside the coordinator's request to it, so the
    overhead is never negative. `freezing`/`thawing` are figures of the run, not kept in the
    catalog (None when read back).
    """

    total: float
    slowest_freeze: float
    array_call: float
    slowest_thaw: float
    freezing: float | None = None
    thawing: float | None = None

    @property
    def overhead(self) -> float:
        return self.total - self.slowest_freeze - self.array_call - self.slowest_thaw


@dataclass(frozen=True, kw_only=True)
class BackupSummary:
    """A backup's own row: enough to list it and to apply retention to it."""

    id: str
    cluster: str
    state: BackupState
    quiesce_mode: QuiesceMode
    #: Who or what asked, e.g. "schedule:hourly", "cli:alice".
    trigger: str
    #: The retention policy the backup belongs to ("" for none).
    policy: str
    started_at: datetime
    finished_at: datetime | None = None
    #: Why it failed; the first problem first.
    error: str = ""
    verification: Verification = Verification.UNVERIFIED
    verified_at: datetime | None = None
    verification_detail: str = ""
    #: The restore or drill that last verified the backup (its id).
    verified_by: str = ""
    freeze_window: FreezeWindow | None = None
    #: What the run left behind besides its snapshots, that an operator may want to know about
    #: (e.g. a temporary consistency group an array would not remove).
    warnings: tuple[str, ...] = ()
    #: Why the backup's snapshots are gone although it finished (e.g. a revert restore destroyed
    #: every snapshot newer than the one it restored); empty while they exist.
    lost_reason: str = ""
    #: When the loss was recorded.
    lost_at: datetime | None = None
    #: Array snapshots, or native snapshots on every included node (tagged with the backup id).
    snapshot_kind: SnapshotKind = SnapshotKind.ARRAY

    @property
    def lost(self) -> bool:
        return bool(self.lost_reason)

    @property
    def restorable(self) -> bool:
        """Finished (complete or partial) and its snapshots still exist."""
        return self.state.usable and not self.lost


@dataclass(frozen=True, kw_only=True)
class Backup(BackupSummary):
    """A backup with everything the catalog holds about it, except the (large) manifests."""

    nodes: tuple[BackupNode, ...] = ()
    snapshots: tuple[SnapshotRef, ...] = ()
    timings: tuple[PhaseTiming, ...] = ()

    @property
    def arrays(self) -> tuple[str, ...]:
        """The arrays holding volumes of the included nodes: each needs one snapshot."""
        return tuple(
            sorted({v.array for node in self.nodes if node.included for v in node.volumes})
        )

    def node(self, name: str) -> BackupNode:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)


@dataclass(frozen=True, kw_only=True)
class ManifestSummary:
    """What a node's recorded manifest holds, without its entries."""

    node: str
    sstables: int
    components: int
    bytes: int
    incomplete_sstables: int


@dataclass(frozen=True, kw_only=True)
class CleanupRequest:
    """A snapshot that must still be deleted from an array, and why.

    `ref` is known when the array answered; when it did not (a call that never returned), only the
    name the snapshot was asked for is, and the cleanup looks it up by name.
    """

    array: str
    reason: str
    ref: SnapshotRef | None = None
    snapshot_name: str = ""

    def __post_init__(self) -> None:
        if self.ref is None and not self.snapshot_name:
            raise ValueError("a cleanup needs a snapshot reference or at least its name")
        if self.ref is not None and self.ref.array != self.array:
            raise ValueError(
                f"cleanup for array {self.array!r} holds a snapshot of array {self.ref.array!r}"
            )


def native_tags(backup: Backup, reason: str) -> list[Resource]:
    """The native snapshot of `backup` (tagged with its id) on each included node (every planned
    node, for a run that died before its plan excluded any), as ledger entries to clear."""
    return [
        native_tag(backup.cluster, n.name, backup.id, reason) for n in backup.nodes if n.included
    ]


@dataclass(frozen=True, kw_only=True)
class PendingCleanup(CleanupRequest):
    id: int
    #: The backup whose run (or deletion) left the snapshot behind.
    backup_id: str
    created_at: datetime
    attempts: int = 0
    last_error: str = ""
    last_attempt_at: datetime | None = None

    @property
    def name(self) -> str:
        return self.ref.snapshot_name if self.ref is not None else self.snapshot_name


@dataclass(frozen=True, kw_only=True)
class OperationRecord:
    """A long-running operation (backup, restore, delete, drill, retention) and how it ended."""

    id: str
    kind: OperationKind
    state: OperationState
    started_at: datetime
    finished_at: datetime | None = None
    backup_id: str = ""
    cluster: str = ""
    trigger: str = ""
    phase: str = ""
    message: str = ""
    steps_done: int = 0
    steps_total: int = 0
    #: Human-readable problems; the first is the reason for a failure.
    errors: tuple[str, ...] = field(default_factory=tuple)


# -- restores ----------------------------------------------------------------------------------


class RestoreMode(enum.StrEnum):
    #: Put the original volumes back to the snapshot, in place.
    REVERT = "revert"
    #: New volumes made from the snapshot are attached in place of the originals, which are kept.
    CLONE = "clone"
    #: From the backup's copy on S3: downloaded beside the data, then installed in place.
    S3 = "s3"


class RestoreState(enum.StrEnum):
    #: Planned and confirmed; nothing changed yet, or steps are under way.
    RUNNING = "running"
    #: Every target node was restored and proven.
    PROVEN = "proven"
    #: Every step ran, but the proof failed for at least one node.
    NOT_PROVEN = "not-proven"
    #: A step failed; the record says what was done and what to do next.
    FAILED = "failed"
    #: The coordinator stopped mid-restore (killed, or the process ended); resume it.
    INTERRUPTED = "interrupted"
    #: Given up before its install (a restore from S3): staging removed, Cassandra as it was.
    ABORTED = "aborted"

    @property
    def finished(self) -> bool:
        return self in (RestoreState.PROVEN, RestoreState.NOT_PROVEN, RestoreState.ABORTED)


class RestoreStep(enum.StrEnum):
    """The per-node steps of a restore, in order. A node's record says the last one it finished."""

    PLANNED = "planned"
    #: A restore from S3: the node's copy is downloaded and verified (nothing live changed).
    DOWNLOADED = "downloaded"
    CANARY = "pre-restore canary"
    STOPPED = "stopped"
    RELEASED = "released"
    #: The array reverted (or cloned) the node's volumes; for a native backup, the agent put the
    #: snapshot's SSTables in place (the steps released and attached are skipped).
    RESTORED = "restored"
    ATTACHED = "attached"
    CLEARED = "cleared"  # replay state outside the restored volumes discarded
    CHECKED = "checked"  # the manifest check, made before Cassandra starts
    STARTED = "started"
    VERIFIED = "verified"

    @property
    def order(self) -> int:
        """Position in the restore: a node at a step has finished every step before it."""
        return list(RestoreStep).index(self)


class NodeVerdict(enum.StrEnum):
    PENDING = "pending"
    PROVEN = "proven"
    #: The restore's proof of the node failed (the node's proof lines say which part).
    NOT_PROVEN = "not-proven"


@dataclass(frozen=True, kw_only=True)
class RestoreVolume:
    """One volume of a node in a restore: where it is mounted and what is attached there."""

    array: str
    #: The volume the backup holds (the configured one).
    volume: str
    role: VolumeRole
    mount_point: str = ""
    #: What is attached after the restore: the same volume (revert) or its clone.
    attached_volume: str = ""


@dataclass(frozen=True, kw_only=True)
class RestoreNode:
    """One target node's progress, verdict and proof."""

    name: str
    host_id: str = ""
    volumes: tuple[RestoreVolume, ...] = ()
    #: Whether Cassandra answered at plan time (a node already down gets no pre-restore canary).
    was_running: bool = True
    #: Key of the backup's canary row for this node (what must be present afterwards).
    backup_canary: str = ""
    #: Key of the canary written just before the stop; empty when none could be written.
    pre_restore_canary: str = ""
    #: The manifest check, made before Cassandra starts; None until it ran.
    manifest_ok: bool | None = None
    step: RestoreStep = RestoreStep.PLANNED
    step_seconds: tuple[tuple[str, float], ...] = ()
    verdict: NodeVerdict = NodeVerdict.PENDING
    #: Why the verdict is what it is: each proof part, passed or failed, in words.
    proof: tuple[str, ...] = ()
    #: What could not be proven (e.g. no pre-restore canary because the node was down).
    unproven: tuple[str, ...] = ()
    #: What the operator must do for this node now (a node left stopped says how to go on).
    next_step: str = ""


@dataclass(frozen=True, kw_only=True)
class RestoreRecord:
    """One restore: who asked for what, how far it got, and the verdict of every node."""

    id: str
    cluster: str
    backup_id: str
    mode: RestoreMode
    #: Target nodes; every node of the backup for a whole-ring restore.
    nodes: tuple[RestoreNode, ...]
    whole_ring: bool
    requested_by: str
    started_at: datetime
    state: RestoreState = RestoreState.RUNNING
    finished_at: datetime | None = None
    error: str = ""
    #: Things the operator must know: destroyed newer snapshots, the repair to run, forced checks.
    warnings: tuple[str, ...] = ()
    #: Array-level steps done, e.g. ("array1", "reverted") or ("array1", "cloned:<suffix>").
    arrays_done: tuple[tuple[str, str], ...] = ()
    #: Clones made by a clone-mode restore, per original volume: (array, original, clone).
    clones: tuple[tuple[str, str, str], ...] = ()
    timings: tuple[PhaseTiming, ...] = ()

    def node(self, name: str) -> RestoreNode:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)
