"""What a backup run is given, what it learns (what the catalog records), and how it ends badly."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from ringsnap.coordinator.backup.schema import SchemaRow
from ringsnap.coordinator.model import (
    CleanupRequest,
    FreezeWindow,
    NodeVolume,
    QuiesceMode,
    SnapshotKind,
    VolumeRole,
)
from ringsnap.coordinator.ports import AgentPort, PhaseClock, SSTable
from ringsnap.errors import RingsnapError
from ringsnap.plugins.types import SnapshotRef, Volume


class BackupRefused(RingsnapError):
    """The backup did not start: the plan found nodes or arrays it cannot reach."""

    exit_code = 3


class BackupFailed(RingsnapError):
    """The backup started and failed; nothing was recorded as complete."""

    exit_code = 4


@dataclass(frozen=True)
class FollowedVolume:
    """What the catalog knows of a node's disk in one role since a restore attached another
    volume there (a clone-mode restore's clone, or the backup's volume put back by a revert)."""

    array: str
    role: VolumeRole
    #: The volume the node's disk in this role is now, as the newest restore attached it.
    volume: str
    #: That restore.
    restore_id: str
    #: Every volume that was this node's disk in this role, as far as restores tell: a configured
    #: volume among them is followed to `volume` (the config was not edited since).
    earlier: frozenset[str] = frozenset()


@dataclass(frozen=True)
class NodeTarget:
    name: str
    agent: AgentPort
    #: The node's volumes as configured (array, volume, role); the plan resolves their ids.
    volumes: tuple[NodeVolume, ...]
    #: The node's disks as its restores left them (`ringsnap.coordinator.backup.followed`).
    followed: tuple[FollowedVolume, ...] = ()


@dataclass(frozen=True)
class BackupSettings:
    #: Array snapshots (frozen or not, per `quiesce`), or native snapshots on every node (no
    #: freeze, no arrays: `quiesce` does not apply).
    snapshots: SnapshotKind = SnapshotKind.ARRAY
    quiesce: QuiesceMode = QuiesceMode.FREEZE
    #: Longest the filesystems may stay frozen (first freeze to last thaw). Below the write timeout.
    freeze_budget: float = 1.5
    #: The agent thaws by itself when this runs out without a renewal.
    lease: float = 1.0
    allow_partial: bool = False
    #: How long to wait for an agent's answer in the plan, canary, flush and record phases.
    agent_timeout: float = 60.0
    #: How long a snapshot call that overran the budget may still take before it is left for cleanup.
    straggler_grace: float = 120.0


@dataclass(frozen=True)
class NodeOutcome:
    name: str
    host_id: str = ""
    volumes: tuple[Volume, ...] = ()
    canary_id: str = ""
    manifest: tuple[SSTable, ...] = ()
    excluded_reason: str = ""


@dataclass
class BackupRun:
    """Everything a run learned; what the catalog records."""

    backup_id: str
    cluster: str
    settings: BackupSettings
    trigger: str
    policy: str
    started_at: datetime
    nodes: dict[str, NodeOutcome] = field(default_factory=dict)
    snapshots: list[SnapshotRef] = field(default_factory=list)
    clock: PhaseClock = field(default_factory=PhaseClock)
    window: FreezeWindow | None = None
    #: Snapshots a failed run could not delete, with the reason; the catalog keeps them for cleanup.
    pending_cleanups: list[CleanupRequest] = field(default_factory=list)
    #: Set-up objects (e.g. temporary consistency groups) a finish or abort could not remove; the
    #: driver sweeps them before its next snapshot of the same volumes. Never fails a run.
    array_warnings: list[str] = field(default_factory=list)
    #: Nodes asked for a native snapshot tagged with the backup id (it may exist even where the
    #: call failed): a failed run leaves a cleanup for each.
    native_snapshots: list[str] = field(default_factory=list)
    #: Each user keyspace's `DESCRIBE KEYSPACE k WITH INTERNALS` rows (for table restores).
    keyspace_schemas: dict[str, list[SchemaRow]] = field(default_factory=dict)
    #: What the operator should know about a backup that succeeded (e.g. no schema captured).
    warnings: list[str] = field(default_factory=list)

    @property
    def included(self) -> list[str]:
        return [name for name, node in self.nodes.items() if not node.excluded_reason]


Progress = Callable[[str, str], None]


def new_backup_id(now: datetime | None = None) -> str:
    """Sortable, unique, and valid as a snapshot name on every array: `rs-20261121-230000-3fa9`."""
    now = now or datetime.now(UTC)
    return f"rs-{now:%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"
