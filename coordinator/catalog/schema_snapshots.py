"""Catalog migration 14: the resource ledger is the one place of what is left to undo.

- Backups' array snapshots are ledger entries of type 'snapshot' (recorded before the array is
  asked, by the backup's id as name; `ref`, the encoded `SnapshotRef`, once the array answered).
  Every `pending_cleanups` row becomes one, with its backup as the run that made it (its cluster
  when the backup is still in the catalog, else ''), reason, creation time, attempts and last
  error; the table is dropped.
- The drill host has one spelling: the `drill_host` flag. Mappings to the drill host, recorded
  as the node '@drill-host' until now, carry the flag and no node.

The table is made again for its CHECKs; rows and ids are kept.
"""

from __future__ import annotations

_RESOURCES = """
CREATE TABLE resources_v14 (
    id              INTEGER PRIMARY KEY,
    type            TEXT    NOT NULL
                    CHECK (type IN ('clone', 'snapshot', 'native-tag', 'staging', 'mapping')),
    cluster         TEXT    NOT NULL,
    run_id          TEXT    NOT NULL,
    run_kind        TEXT    NOT NULL,
    reason          TEXT    NOT NULL,
    array           TEXT    NOT NULL DEFAULT '',
    name            TEXT    NOT NULL DEFAULT '',
    volume_id       TEXT    NOT NULL DEFAULT '',
    name_hint       TEXT    NOT NULL DEFAULT '',
    node            TEXT    NOT NULL DEFAULT '',
    mount_purpose   TEXT    NOT NULL DEFAULT '',
    host            TEXT    NOT NULL DEFAULT '',
    drill_host      INTEGER NOT NULL DEFAULT 0 CHECK (drill_host IN (0, 1)),
    ref             TEXT    NOT NULL DEFAULT '',
    created_us      INTEGER NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    last_error      TEXT    NOT NULL DEFAULT '',
    last_attempt_us INTEGER,
    CHECK (type <> 'clone' OR name <> '' OR name_hint <> ''),
    -- a mapping names its volume and whose host it is mapped to: a node's, or the drill host's
    CHECK (type <> 'mapping' OR (name <> '' AND (node <> '' OR drill_host = 1))),
    CHECK (mount_purpose = '' OR node <> '' OR drill_host = 1),
    CHECK (type <> 'native-tag' OR (node <> '' AND name <> '')),
    -- a snapshot is named after its backup before the array answers
    CHECK (type <> 'snapshot' OR (array <> '' AND name <> '')),
    CHECK (ref = '' OR type = 'snapshot')
);
INSERT INTO resources_v14 (id, type, cluster, run_id, run_kind, reason, array, name, volume_id,
        name_hint, node, mount_purpose, host, drill_host, created_us, attempts, last_error,
        last_attempt_us)
    SELECT id, type, cluster, run_id, run_kind, reason, array, name, volume_id, name_hint,
        CASE WHEN type = 'mapping' AND node = '@drill-host' THEN '' ELSE node END,
        mount_purpose, host,
        CASE WHEN type = 'mapping' AND node = '@drill-host' THEN 1 ELSE drill_host END,
        created_us, attempts, last_error, last_attempt_us FROM resources;
DROP TABLE resources;
ALTER TABLE resources_v14 RENAME TO resources;
CREATE INDEX resources_by_run ON resources (run_id);
"""

_SNAPSHOTS = """
INSERT INTO resources (type, cluster, run_id, run_kind, reason, array, name, ref, created_us,
        attempts, last_error, last_attempt_us)
    SELECT 'snapshot',
        coalesce((SELECT cluster FROM backups WHERE backups.id = pending_cleanups.backup_id), ''),
        backup_id, 'backup', reason, array, snapshot_name, coalesce(ref, ''), created_us,
        attempts, last_error, last_attempt_us
    FROM pending_cleanups ORDER BY id;
DROP TABLE pending_cleanups;
"""

SNAPSHOTS_IN_LEDGER = _RESOURCES + _SNAPSHOTS
