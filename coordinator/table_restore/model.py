"""A table restore's request, its per-node progress and its record (saved after every step)."""

from __future__ import annotations

import enum
import re
import secrets
from dataclasses import dataclass, field
from datetime import UTC, datetime

from ringsnap.coordinator.restore.s3_keys import NO_KEYS, RestoreKeys
from ringsnap.errors import RingsnapError


class TableRestoreRefused(RingsnapError):
    """The plan refused; nothing was changed."""

    exit_code = 3


class TableRestoreFailed(RingsnapError):
    """The run failed; its record says which step and what to do next."""

    exit_code = 4

    def __init__(self, message: str, record: TableRestoreRecord | None = None) -> None:
        super().__init__(message)
        self.record = record


class TableRestoreState(enum.StrEnum):
    RUNNING = "running"
    #: Every node imported every staged SSTable and the rows were checked.
    SUCCEEDED = "succeeded"
    #: Imported, but a check of the rows did not hold (the report says which).
    NOT_PROVEN = "not-proven"
    #: Stopped at `step`; resumable (`--resume`) or abortable (`--abort`).
    FAILED = "failed"
    #: Given up by the operator: staging and clones removed, nothing more imported.
    ABORTED = "aborted"
    #: Found running when the catalog was opened (its process died with it): resumable or
    #: abortable from `step`, as a failed one.
    INTERRUPTED = "interrupted"

    @property
    def finished(self) -> bool:
        return self in (
            TableRestoreState.SUCCEEDED,
            TableRestoreState.NOT_PROVEN,
            TableRestoreState.ABORTED,
        )


class Step(enum.StrEnum):
    """The steps of a run, in order. Nothing in the ring changes before SCHEMA."""

    PLANNED = "planned"
    CLONE = "clone"
    MOUNT = "mount"
    STAGE = "stage"
    UNMOUNT = "unmount"
    DELETE_CLONES = "delete-clones"
    SCHEMA = "schema"
    IMPORT = "import"
    VERIFY = "verify"
    CLEANUP = "cleanup"
    DONE = "done"


STEPS = tuple(Step)


def step_index(step: Step) -> int:
    return STEPS.index(step)


#: What the operator is told to do when a run stopped before a step.
NEXT_STEP = {
    Step.CLONE: "clone the backup's data volumes on the arrays",
    Step.MOUNT: "mount the clones read-only on every node (MountClones)",
    Step.STAGE: "copy the tables' SSTables from the clones into the staging of every node",
    Step.UNMOUNT: "unmount the clones on every node (UnmountClones)",
    Step.DELETE_CLONES: "delete the clones on the arrays",
    Step.SCHEMA: "recreate the dropped keyspace or tables (or the --as table) from the schema",
    Step.IMPORT: "import the staged SSTables on every node",
    Step.VERIFY: "check the imports and the rows",
    Step.CLEANUP: "remove the staging on every node",
    Step.DONE: "nothing",
}


#: A table restore's id (also an agent purpose id and part of clone names).
TABLE_RESTORE_ID = re.compile(r"tr-[0-9]{8}-[0-9]{6}-[0-9a-f]{4}")


def new_table_restore_id(now: datetime | None = None) -> str:
    """`tr-20261124-083600-3fa9`: sortable, and valid as an agent purpose id and a clone suffix."""
    now = now or datetime.now(UTC)
    return f"tr-{now:%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


@dataclass(frozen=True, kw_only=True)
class TableRestoreRequest:
    backup_id: str
    keyspace: str
    #: Empty: every table of the keyspace in the backup's schema.
    tables: tuple[str, ...] = ()
    #: `--as K.T2`: restore the (single) table into this one, created with its schema and a new id.
    target: tuple[str, str] | None = None
    requested_by: str = ""
    #: `--from s3`: the staging is filled from the backup's copy on S3, not from array clones.
    from_s3: bool = False
    #: With `from_s3`, an encrypted copy's secret keys (`--key-file`): in memory only, never
    #: shown, recorded or journaled.
    keys: RestoreKeys = field(default=NO_KEYS, repr=False, compare=False)


@dataclass(frozen=True, kw_only=True)
class TableTarget:
    """One table to restore: from the backup's (keyspace, table) into (keyspace, table)."""

    source_keyspace: str
    source_table: str
    keyspace: str
    table: str
    #: The table id the backup recorded (`WITH ID`), without dashes removed.
    source_id: str
    #: "exists" (truncated or not: imported in place), "dropped" (recreated with the old id),
    #: "new" (--as: created with the backup's schema and a new id).
    action: str

    @property
    def name(self) -> str:
        return f"{self.keyspace}.{self.table}"


@dataclass(frozen=True, kw_only=True)
class CloneRecord:
    """A clone made of one data volume of one node, until it is deleted."""

    node: str
    array: str
    volume: str
    clone: str
    clone_id: str = ""
    wwn: str = ""
    #: The production mount point it stands for.
    source_mount_point: str = ""
    #: Its entry in the resource ledger (`in_ledger`), or, in records from before the run
    #: engine, its pending cleanup (0: none recorded).
    cleanup_id: int = 0
    in_ledger: bool = False
    deleted: bool = False


@dataclass(frozen=True, kw_only=True)
class NodeTables:
    """What one node holds of one table in the backup and what happened to it."""

    table: str
    sstables: int = 0
    bytes: int = 0
    staged_sstables: int = 0
    staged_bytes: int = 0
    bytes_verified: int = 0
    imported_sstables: int = 0
    failed_directories: tuple[str, ...] = ()
    import_seconds: float = 0.0
    import_method: str = ""


@dataclass(frozen=True, kw_only=True)
class NodeProgress:
    name: str
    host_id: str = ""
    #: The last step this node finished.
    step: Step = Step.PLANNED
    staging_directory: str = ""
    free_bytes: int = 0
    tables: tuple[NodeTables, ...] = ()
    message: str = ""


@dataclass(frozen=True, kw_only=True)
class TableRestoreRecord:
    id: str
    cluster: str
    backup_id: str
    requested_by: str
    started_at: datetime
    targets: tuple[TableTarget, ...]
    nodes: tuple[NodeProgress, ...]
    state: TableRestoreState = TableRestoreState.RUNNING
    #: The last step the whole run finished.
    step: Step = Step.PLANNED
    finished_at: datetime | None = None
    error: str = ""
    clones: tuple[CloneRecord, ...] = ()
    #: CQL statements run to recreate tables (with their outcome).
    schema_statements: tuple[str, ...] = ()
    #: One sentence per check of the verification, "ok: ..." or "FAILED: ...".
    verification: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    timings: dict[str, float] = field(default_factory=dict)
    #: Staged from the backup's copy on S3 (no clones: the steps clone to delete-clones are skipped).
    from_s3: bool = False

    @property
    def next_step(self) -> Step:
        if self.step is Step.DONE:
            return Step.DONE
        return STEPS[step_index(self.step) + 1]

    @property
    def next_action(self) -> str:
        return NEXT_STEP[self.next_step]

    def node(self, name: str) -> NodeProgress:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)
