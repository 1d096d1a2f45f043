"""The catalog's SQLite schema, as forward migrations, and the migrating of a catalog file.

Migration N takes a database at version N-1 to version N. A released migration is never edited:
a change is a new migration at the end. `schema_version` keeps one row per applied migration.
"""

# S608: the migration script is assembled from constants of this module.
# ruff: noqa: S608

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

from ringsnap.coordinator.catalog.columns import now, sql_text, to_us
from ringsnap.coordinator.catalog.errors import CatalogSchemaError
from ringsnap.coordinator.catalog.schema_ledger import LEDGER_FOLD
from ringsnap.coordinator.catalog.schema_mappings import MAPPINGS
from ringsnap.coordinator.catalog.schema_not_proven import NOT_PROVEN
from ringsnap.coordinator.catalog.schema_resources import resources_table
from ringsnap.coordinator.catalog.schema_snapshots import SNAPSHOTS_IN_LEDGER
from ringsnap.logs import get_logger

log = get_logger(__name__)

#: `PRAGMA application_id`: marks the file as a ringsnap catalog ("RSNP").
APPLICATION_ID = 0x52534E50


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    sql: str


_V1 = """
CREATE TABLE schema_version (
    version     INTEGER PRIMARY KEY,
    description TEXT    NOT NULL,
    applied_us  INTEGER NOT NULL
);

CREATE TABLE backups (
    pk                  INTEGER PRIMARY KEY,
    id                  TEXT    NOT NULL UNIQUE,
    cluster             TEXT    NOT NULL,
    state               TEXT    NOT NULL
                        CHECK (state IN ('running', 'complete', 'failed', 'partial')),
    quiesce_mode        TEXT    NOT NULL CHECK (quiesce_mode IN ('freeze', 'flush-only', 'none')),
    trigger             TEXT    NOT NULL,
    policy              TEXT    NOT NULL,
    started_us          INTEGER NOT NULL,
    finished_us         INTEGER,
    error               TEXT    NOT NULL DEFAULT '',
    verification        TEXT    NOT NULL DEFAULT 'unverified'
                        CHECK (verification IN ('unverified', 'proven', 'failed')),
    verified_us         INTEGER,
    verification_detail TEXT    NOT NULL DEFAULT '',
    freeze_total        REAL,
    freeze_slowest      REAL,
    freeze_array_call   REAL,
    freeze_slowest_thaw REAL,
    -- a running backup has not finished; any other one has
    CHECK ((state = 'running') = (finished_us IS NULL)),
    CHECK (state <> 'failed' OR error <> '')
);
-- Listing is newest first, keyset-paged on (started_us, id), per cluster or across all.
CREATE INDEX backups_by_cluster ON backups (cluster, started_us DESC, id DESC);
CREATE INDEX backups_by_time ON backups (started_us DESC, id DESC);
CREATE INDEX backups_running ON backups (state) WHERE state = 'running';

CREATE TABLE backup_nodes (
    backup          INTEGER NOT NULL REFERENCES backups (pk) ON DELETE CASCADE,
    name            TEXT    NOT NULL,
    host_id         TEXT    NOT NULL,
    volumes         TEXT    NOT NULL,
    canary_id       TEXT    NOT NULL,
    excluded_reason TEXT    NOT NULL,
    sstable_count   INTEGER NOT NULL DEFAULT 0,
    bytes           INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (backup, name)
) WITHOUT ROWID;

CREATE TABLE snapshots (
    backup INTEGER NOT NULL REFERENCES backups (pk) ON DELETE CASCADE,
    array  TEXT    NOT NULL,
    ref    TEXT    NOT NULL,
    PRIMARY KEY (backup, array)
) WITHOUT ROWID;

CREATE TABLE manifests (
    backup      INTEGER NOT NULL,
    node        TEXT    NOT NULL,
    encoding    TEXT    NOT NULL,
    sstables    INTEGER NOT NULL,
    components  INTEGER NOT NULL,
    bytes       INTEGER NOT NULL,
    incomplete  INTEGER NOT NULL,
    chunks      INTEGER NOT NULL,
    recorded_us INTEGER NOT NULL,
    PRIMARY KEY (backup, node),
    FOREIGN KEY (backup, node) REFERENCES backup_nodes (backup, name) ON DELETE CASCADE
) WITHOUT ROWID;

-- Large blobs: kept out of WITHOUT ROWID b-trees.
CREATE TABLE manifest_chunks (
    backup INTEGER NOT NULL,
    node   TEXT    NOT NULL,
    seq    INTEGER NOT NULL,
    body   BLOB    NOT NULL,
    UNIQUE (backup, node, seq),
    FOREIGN KEY (backup, node) REFERENCES manifests (backup, node) ON DELETE CASCADE
);

CREATE TABLE phase_timings (
    backup  INTEGER NOT NULL REFERENCES backups (pk) ON DELETE CASCADE,
    ord     INTEGER NOT NULL,
    phase   TEXT    NOT NULL,
    seconds REAL    NOT NULL,
    PRIMARY KEY (backup, ord)
) WITHOUT ROWID;

-- Snapshots that must still be deleted from an array. Not tied to the backup's row by a foreign
-- key: a cleanup outlives the deletion of the backup that caused it.
CREATE TABLE pending_cleanups (
    id              INTEGER PRIMARY KEY,
    backup_id       TEXT    NOT NULL,
    array           TEXT    NOT NULL,
    snapshot_name   TEXT    NOT NULL,
    ref             TEXT,
    reason          TEXT    NOT NULL,
    created_us      INTEGER NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    last_error      TEXT    NOT NULL DEFAULT '',
    last_attempt_us INTEGER,
    UNIQUE (array, snapshot_name)
);

CREATE TABLE operations (
    id          TEXT    PRIMARY KEY,
    kind        TEXT    NOT NULL,
    state       TEXT    NOT NULL,
    backup_id   TEXT    NOT NULL,
    cluster     TEXT    NOT NULL,
    trigger     TEXT    NOT NULL,
    phase       TEXT    NOT NULL,
    message     TEXT    NOT NULL,
    steps_done  INTEGER NOT NULL,
    steps_total INTEGER NOT NULL,
    errors      TEXT    NOT NULL,
    started_us  INTEGER NOT NULL,
    finished_us INTEGER
);
CREATE INDEX operations_by_time ON operations (started_us DESC);
CREATE INDEX operations_unfinished ON operations (state) WHERE finished_us IS NULL;
"""

# What a run left on an array besides its snapshot (e.g. a temporary consistency group that could
# not be removed): a JSON list of sentences, shown with the backup.
_V2 = """
ALTER TABLE backups ADD COLUMN warnings TEXT NOT NULL DEFAULT '[]';
"""

# Restores, with what they proved and destroyed. The per-node records and the other lists are JSON,
# validated when read (a hand edit shows up in the record's warnings, it never breaks a read).
# Operations were never persisted by the coordinator (it keeps them in memory): their table goes.
_V3 = """
ALTER TABLE backups ADD COLUMN verified_by TEXT NOT NULL DEFAULT '';
ALTER TABLE backups ADD COLUMN lost_reason TEXT NOT NULL DEFAULT '';
ALTER TABLE backups ADD COLUMN lost_us INTEGER;

CREATE TABLE restores (
    pk           INTEGER PRIMARY KEY,
    id           TEXT    NOT NULL UNIQUE,
    cluster      TEXT    NOT NULL,
    backup_id    TEXT    NOT NULL,
    mode         TEXT    NOT NULL CHECK (mode IN ('revert', 'clone')),
    state        TEXT    NOT NULL
                 CHECK (state IN ('running', 'proven', 'failed-verification', 'failed',
                                  'interrupted')),
    whole_ring   INTEGER NOT NULL CHECK (whole_ring IN (0, 1)),
    requested_by TEXT    NOT NULL,
    started_us   INTEGER NOT NULL,
    finished_us  INTEGER,
    error        TEXT    NOT NULL DEFAULT '',
    nodes        TEXT    NOT NULL DEFAULT '[]',
    warnings     TEXT    NOT NULL DEFAULT '[]',
    arrays_done  TEXT    NOT NULL DEFAULT '[]',
    clones       TEXT    NOT NULL DEFAULT '[]',
    timings      TEXT    NOT NULL DEFAULT '[]'
);
CREATE INDEX restores_by_cluster ON restores (cluster, started_us DESC, id DESC);
CREATE INDEX restores_by_time ON restores (started_us DESC, id DESC);
-- Not finished: they may have left nodes stopped.
CREATE INDEX restores_open ON restores (state) WHERE state IN ('running', 'failed', 'interrupted');

DROP TABLE operations;
"""

# Backups of Cassandra's own snapshots (direct-attached storage) beside array snapshots.
_V4 = """
ALTER TABLE backups ADD COLUMN snapshot_kind TEXT NOT NULL DEFAULT 'array'
    CHECK (snapshot_kind IN ('array', 'native'));
"""

# Restore drills: each drill, its per-node proofs and why a node is not proven (JSON, validated when
# read, as for restores), and every clone it made with whether it is deleted again.
_V5 = """
CREATE TABLE drills (
    pk           INTEGER PRIMARY KEY,
    id           TEXT    NOT NULL UNIQUE,
    cluster      TEXT    NOT NULL,
    backup_id    TEXT    NOT NULL,
    state        TEXT    NOT NULL
                 CHECK (state IN ('running', 'proven', 'not-proven', 'failed', 'interrupted')),
    trigger      TEXT    NOT NULL,
    requested_by TEXT    NOT NULL,
    started_us   INTEGER NOT NULL,
    finished_us  INTEGER,
    error        TEXT    NOT NULL DEFAULT '',
    nodes        TEXT    NOT NULL DEFAULT '[]',
    clones       TEXT    NOT NULL DEFAULT '[]',
    warnings     TEXT    NOT NULL DEFAULT '[]',
    CHECK ((state = 'running') = (finished_us IS NULL))
);
CREATE INDEX drills_by_cluster ON drills (cluster, started_us DESC, id DESC);
CREATE INDEX drills_by_backup ON drills (backup_id, started_us DESC);
"""

# Table-level restores: each keyspace's schema as the backup saw it (the rows of `DESCRIBE KEYSPACE
# k WITH INTERNALS`, as JSON), and each table restore's whole record (a JSON document, saved after
# every step so that a failed run can be resumed or aborted).
_V6 = """
CREATE TABLE keyspace_schemas (
    backup      INTEGER NOT NULL REFERENCES backups (pk) ON DELETE CASCADE,
    keyspace    TEXT    NOT NULL,
    statements  TEXT    NOT NULL,
    captured_us INTEGER NOT NULL,
    PRIMARY KEY (backup, keyspace)
) WITHOUT ROWID;

CREATE TABLE table_restores (
    id          TEXT    PRIMARY KEY,
    cluster     TEXT    NOT NULL,
    backup_id   TEXT    NOT NULL,
    state       TEXT    NOT NULL,
    started_us  INTEGER NOT NULL,
    finished_us INTEGER,
    document    TEXT    NOT NULL
);
CREATE INDEX table_restores_by_cluster ON table_restores (cluster, started_us DESC);
"""

# Exports to S3: each backup's newest export as one JSON document (per node: step, clones, what was
# uploaded and skipped, errors), saved after every step so that a failed run is resumed from it.
_V7 = """
CREATE TABLE exports (
    backup_id   TEXT    PRIMARY KEY,
    cluster     TEXT    NOT NULL,
    state       TEXT    NOT NULL CHECK (state IN ('running', 'succeeded', 'failed')),
    started_us  INTEGER NOT NULL,
    finished_us INTEGER,
    document    TEXT    NOT NULL
);
CREATE INDEX exports_by_cluster ON exports (cluster, started_us DESC);
"""

# Restores from a backup's copy on S3 (`ringsnap restore --from s3`): the mode 's3'. SQLite cannot
# change a CHECK in place: the table is made again, with the same columns, rows and indexes.
_V8 = """
CREATE TABLE restores_v8 (
    pk           INTEGER PRIMARY KEY,
    id           TEXT    NOT NULL UNIQUE,
    cluster      TEXT    NOT NULL,
    backup_id    TEXT    NOT NULL,
    mode         TEXT    NOT NULL CHECK (mode IN ('revert', 'clone', 's3')),
    state        TEXT    NOT NULL
                 CHECK (state IN ('running', 'proven', 'failed-verification', 'failed',
                                  'interrupted')),
    whole_ring   INTEGER NOT NULL CHECK (whole_ring IN (0, 1)),
    requested_by TEXT    NOT NULL,
    started_us   INTEGER NOT NULL,
    finished_us  INTEGER,
    error        TEXT    NOT NULL DEFAULT '',
    nodes        TEXT    NOT NULL DEFAULT '[]',
    warnings     TEXT    NOT NULL DEFAULT '[]',
    arrays_done  TEXT    NOT NULL DEFAULT '[]',
    clones       TEXT    NOT NULL DEFAULT '[]',
    timings      TEXT    NOT NULL DEFAULT '[]'
);
INSERT INTO restores_v8 (pk, id, cluster, backup_id, mode, state, whole_ring, requested_by,
                         started_us, finished_us, error, nodes, warnings, arrays_done, clones,
                         timings)
    SELECT pk, id, cluster, backup_id, mode, state, whole_ring, requested_by, started_us,
           finished_us, error, nodes, warnings, arrays_done, clones, timings
    FROM restores;
DROP TABLE restores;
ALTER TABLE restores_v8 RENAME TO restores;
CREATE INDEX restores_by_cluster ON restores (cluster, started_us DESC, id DESC);
CREATE INDEX restores_by_time ON restores (started_us DESC, id DESC);
CREATE INDEX restores_open ON restores (state) WHERE state IN ('running', 'failed', 'interrupted');
"""

# Restores from S3 given up (`ringsnap restore --abort rr-...`): the state 'aborted' (staging
# removed, Cassandra as it was). The table is made again with the new CHECK, as for version 8.
_V9 = """
CREATE TABLE restores_v9 (
    pk           INTEGER PRIMARY KEY,
    id           TEXT    NOT NULL UNIQUE,
    cluster      TEXT    NOT NULL,
    backup_id    TEXT    NOT NULL,
    mode         TEXT    NOT NULL CHECK (mode IN ('revert', 'clone', 's3')),
    state        TEXT    NOT NULL
                 CHECK (state IN ('running', 'proven', 'failed-verification', 'failed',
                                  'interrupted', 'aborted')),
    whole_ring   INTEGER NOT NULL CHECK (whole_ring IN (0, 1)),
    requested_by TEXT    NOT NULL,
    started_us   INTEGER NOT NULL,
    finished_us  INTEGER,
    error        TEXT    NOT NULL DEFAULT '',
    nodes        TEXT    NOT NULL DEFAULT '[]',
    warnings     TEXT    NOT NULL DEFAULT '[]',
    arrays_done  TEXT    NOT NULL DEFAULT '[]',
    clones       TEXT    NOT NULL DEFAULT '[]',
    timings      TEXT    NOT NULL DEFAULT '[]'
);
INSERT INTO restores_v9 (pk, id, cluster, backup_id, mode, state, whole_ring, requested_by,
                         started_us, finished_us, error, nodes, warnings, arrays_done, clones,
                         timings)
    SELECT pk, id, cluster, backup_id, mode, state, whole_ring, requested_by, started_us,
           finished_us, error, nodes, warnings, arrays_done, clones, timings
    FROM restores;
DROP TABLE restores;
ALTER TABLE restores_v9 RENAME TO restores;
CREATE INDEX restores_by_cluster ON restores (cluster, started_us DESC, id DESC);
CREATE INDEX restores_by_time ON restores (started_us DESC, id DESC);
CREATE INDEX restores_open ON restores (state) WHERE state IN ('running', 'failed', 'interrupted');
"""

# The run engine (`coordinator/runs`): each run's record as one JSON document (per node: step
# reached and begun, timings, error; the kind's payload), and the resource ledger, one typed row
# per clone, native snapshot tag or staging directory a run makes, recorded before it is made.
# Exports may now be 'interrupted' (found running at open): the table is made again with the new
# CHECK, same columns, rows and index.
_V10 = (
    """
CREATE TABLE runs (
    id          TEXT    PRIMARY KEY,
    kind        TEXT    NOT NULL,
    cluster     TEXT    NOT NULL,
    state       TEXT    NOT NULL
                CHECK (state IN ('running', 'succeeded', 'failed', 'interrupted', 'aborted')),
    updated_us  INTEGER NOT NULL,
    document    TEXT    NOT NULL
);
CREATE INDEX runs_running ON runs (state) WHERE state = 'running';

"""
    + resources_table(10)
    + """

CREATE TABLE exports_v10 (
    backup_id   TEXT    PRIMARY KEY,
    cluster     TEXT    NOT NULL,
    state       TEXT    NOT NULL CHECK (state IN ('running', 'succeeded', 'failed', 'interrupted')),
    started_us  INTEGER NOT NULL,
    finished_us INTEGER,
    document    TEXT    NOT NULL
);
INSERT INTO exports_v10 (backup_id, cluster, state, started_us, finished_us, document)
    SELECT backup_id, cluster, state, started_us, finished_us, document FROM exports;
DROP TABLE exports;
ALTER TABLE exports_v10 RENAME TO exports;
CREATE INDEX exports_by_cluster ON exports (cluster, started_us DESC);
"""
)

MIGRATIONS: list[Migration] = [
    Migration(1, "backups, nodes, snapshots, manifests, timings, cleanups, operations", _V1),
    Migration(2, "warnings of a backup", _V2),
    Migration(3, "restores; who verified a backup; backups lost to a restore; no operations", _V3),
    Migration(4, "native snapshots: the kind of a backup", _V4),
    Migration(5, "restore drills", _V5),
    Migration(6, "keyspace schemas of a backup; table restores", _V6),
    Migration(7, "exports to S3", _V7),
    Migration(8, "restores from S3: the mode 's3'", _V8),
    Migration(9, "restores from S3 given up: the state 'aborted'", _V9),
    Migration(10, "the run engine's records and resource ledger; interrupted exports", _V10),
    Migration(11, "one name for a failed proof: 'not-proven'", NOT_PROVEN),
    Migration(12, "the resource ledger: clones mapped to hosts ('mapping', host)", MAPPINGS),
    Migration(
        13,
        "drills' clones and native snapshot tags in the ledger; encoded cleanups moved",
        LEDGER_FOLD,
    ),
    Migration(
        14,
        "backups' array snapshots in the ledger (no pending cleanups); one drill-host spelling",
        SNAPSHOTS_IN_LEDGER,
    ),
]


def migrate(conn: sqlite3.Connection, path: Path, *, may_write: bool) -> int:
    """Bring the catalog on `conn` to the latest version; return it.

    Refuses a database that is not a catalog, one written by a newer ringsnap, and (unless
    `may_write`: only the coordinator owning the catalog migrates it) one that needs migrating.
    Each migration is one transaction: a failed one leaves the previous version.
    """
    migrations = MIGRATIONS
    latest = len(migrations)
    application_id = conn.execute("PRAGMA application_id").fetchone()[0]
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_schema WHERE type = 'table'")}
    if application_id != APPLICATION_ID and tables:
        raise CatalogSchemaError(
            f"{path} is an SQLite database but not a ringsnap catalog; refusing to touch it"
        )
    current = 0
    if "schema_version" in tables:
        current = conn.execute("SELECT max(version) FROM schema_version").fetchone()[0] or 0
    if current > latest:
        raise CatalogSchemaError(
            f"catalog {path} has schema version {current}, written by a newer ringsnap;"
            f" this version understands up to {latest}. Upgrade ringsnap (a catalog is never"
            " downgraded)"
        )
    if current < latest and not may_write:
        raise CatalogSchemaError(
            f"catalog {path} is at schema version {current} and needs {latest}; only the"
            " coordinator that owns it migrates it (start ringsnap-coordinator)"
        )
    for index, migration in enumerate(migrations[current:], start=current + 1):
        if migration.version != index:
            raise CatalogSchemaError(f"migration list out of order at {migration.version}")
        log.info(
            "migrating catalog",
            path=str(path),
            version=migration.version,
            description=migration.description,
        )
        script = (
            "BEGIN IMMEDIATE;\n"
            f"{migration.sql}\n"
            f"PRAGMA application_id = {APPLICATION_ID};\n"
            "INSERT INTO schema_version (version, description, applied_us)"
            f" VALUES ({migration.version}, {sql_text(migration.description)}, {to_us(now())});\n"
            "COMMIT;"
        )
        try:
            conn.executescript(script)
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise CatalogSchemaError(
                f"catalog {path}: migration to version {migration.version} failed ({exc});"
                " the catalog was left at the previous version"
            ) from None
    return latest
