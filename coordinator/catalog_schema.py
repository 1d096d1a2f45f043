"""The catalog's SQLite schema, as forward migrations.

Migration N takes a database at version N-1 to version N. A released migration is never edited:
a change is a new migration at the end. `schema_version` keeps one row per applied migration.
"""

from __future__ import annotations

from dataclasses import dataclass

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

MIGRATIONS: list[Migration] = [
    Migration(1, "backups, nodes, snapshots, manifests, timings, cleanups, operations", _V1),
    Migration(2, "warnings of a backup", _V2),
]
