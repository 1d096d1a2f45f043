"""The backup catalog: an embedded SQLite database (WAL, foreign keys, versioned schema).

What it promises:
- it never claims a backup that is not complete: `complete_backup` refuses, naming what is
  missing, unless every included node has its manifest and every array of the plan its snapshot,
  covering every volume of those nodes; a backup with excluded nodes (each with its reason) is
  recorded as `partial`, never as `complete` (the rule: `completeness`);
- no snapshot is forgotten: a backup run records each array snapshot in the resource ledger
  before the array is asked; a failed or deleted backup's snapshots stay there (joined in the same
  transaction) until the array confirms the deletion, a completed backup takes its own;
- backups found `running` when the catalog is opened are reported by `interrupted_backups()` so that
  the coordinator cleans them up and marks them failed; restores found `running` are marked
  interrupted and reported by `interrupted_restores()`;
- one coordinator at a time: opening takes an exclusive lock on `<catalog>.lock`.

Every method is synchronous, thread-safe (one connection behind a lock) and meant to be called from
asyncio through `asyncio.to_thread`. Timestamps are aware datetimes, stored as UTC microseconds.

One module per record kind: `schema` (and its migrations), `database` (the file, lock and
transactions), `backups` (their life), `listing` (reading them), `manifests`, `cleanups`,
`restores`, `drills`, `keyspace_schemas`, `table_restores`, `exports` and `runs` (the run
engine's records and resource ledger); `Catalog` is all of
them over one connection.
"""

from __future__ import annotations

from ringsnap.coordinator.catalog.backups import BackupStore
from ringsnap.coordinator.catalog.cleanups import CleanupStore
from ringsnap.coordinator.catalog.drills import DrillNotFoundError, DrillStore
from ringsnap.coordinator.catalog.errors import (
    BackupNotFoundError,
    BackupStateError,
    CatalogError,
    CatalogLockedError,
    CatalogSchemaError,
    IncompleteBackupError,
    InvalidPageTokenError,
    OperationNotFoundError,
    RestoreNotFoundError,
)
from ringsnap.coordinator.catalog.exports import ExportStore
from ringsnap.coordinator.catalog.keyspace_schemas import KeyspaceSchemaStore
from ringsnap.coordinator.catalog.listing import (
    DEFAULT_PAGE_SIZE,
    MAX_PAGE_SIZE,
    BackupListing,
    BackupPage,
)
from ringsnap.coordinator.catalog.manifests import ManifestStore
from ringsnap.coordinator.catalog.restores import RestoreStore
from ringsnap.coordinator.catalog.runs import RunStore
from ringsnap.coordinator.catalog.table_restores import TableRestoreStore


class Catalog(
    BackupStore,
    BackupListing,
    ManifestStore,
    CleanupStore,
    RestoreStore,
    DrillStore,
    KeyspaceSchemaStore,
    TableRestoreStore,
    ExportStore,
    RunStore,
):
    """The catalog in the SQLite file at `path` (created, with its directory, if missing).

    `exclusive=False` skips the one-coordinator lock, for tools that only read a catalog a running
    coordinator owns; such a catalog reports no interrupted backups or restores, and changes
    nothing when opened.
    """

    def __enter__(self) -> Catalog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = [
    "DEFAULT_PAGE_SIZE",
    "MAX_PAGE_SIZE",
    "BackupNotFoundError",
    "BackupPage",
    "BackupStateError",
    "Catalog",
    "CatalogError",
    "CatalogLockedError",
    "CatalogSchemaError",
    "DrillNotFoundError",
    "IncompleteBackupError",
    "InvalidPageTokenError",
    "OperationNotFoundError",
    "RestoreNotFoundError",
]
