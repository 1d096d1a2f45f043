"""Catalog migration 12 (issue 20, presentation): a clone mapped to a host is a resource-ledger
entry of its own, 'mapping', recorded before the array maps it, with the array's host object
(`host`) it is mapped to. The table is made again for its CHECKs; rows and ids are kept."""

MAPPINGS = """
CREATE TABLE resources_v12 (
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
    created_us      INTEGER NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    last_error      TEXT    NOT NULL DEFAULT '',
    last_attempt_us INTEGER,
    CHECK (type <> 'clone' OR name <> '' OR name_hint <> ''),
    -- a mapping names its volume and the node whose host it is mapped to
    CHECK (type <> 'mapping' OR (name <> '' AND node <> '')),
    CHECK (mount_purpose = '' OR node <> '')
);
INSERT INTO resources_v12 (id, type, cluster, run_id, run_kind, reason, array, name, volume_id,
        name_hint, node, mount_purpose, created_us, attempts, last_error, last_attempt_us)
    SELECT id, type, cluster, run_id, run_kind, reason, array, name, volume_id, name_hint, node,
        mount_purpose, created_us, attempts, last_error, last_attempt_us FROM resources;
DROP TABLE resources;
ALTER TABLE resources_v12 RENAME TO resources;
CREATE INDEX resources_by_run ON resources (run_id);
"""
