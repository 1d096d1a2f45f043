"""Catalog migration 11, the SQL (kept apart from schema.py, which lists every migration, to keep
each module short): one stored name for a proof that failed."""

# One name for a proof that failed: a restore's state 'failed-verification', a restore node's
# verdict 'failed' and a table restore's state 'unverified' (which also read as "never checked")
# are all 'not-proven' now, as a drill's always were. The restores table is made again for its
# CHECK, as for version 8, with the stored values rewritten (the nodes' JSON included).
NOT_PROVEN = """
CREATE TABLE restores_v11 (
    pk           INTEGER PRIMARY KEY,
    id           TEXT    NOT NULL UNIQUE,
    cluster      TEXT    NOT NULL,
    backup_id    TEXT    NOT NULL,
    mode         TEXT    NOT NULL CHECK (mode IN ('revert', 'clone', 's3')),
    state        TEXT    NOT NULL
                 CHECK (state IN ('running', 'proven', 'not-proven', 'failed', 'interrupted',
                                  'aborted')),
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
INSERT INTO restores_v11 (pk, id, cluster, backup_id, mode, state, whole_ring, requested_by,
                          started_us, finished_us, error, nodes, warnings, arrays_done, clones,
                          timings)
    SELECT pk, id, cluster, backup_id, mode,
           CASE state WHEN 'failed-verification' THEN 'not-proven' ELSE state END,
           whole_ring, requested_by, started_us, finished_us, error, nodes, warnings,
           arrays_done, clones, timings
    FROM restores;
-- A hand-edited nodes value that is no JSON array is left as it is (the record's reader warns).
UPDATE restores_v11 SET nodes = (
    SELECT json_group_array(
        CASE WHEN node.type <> 'object' THEN node.value
             WHEN json_extract(node.value, '$.verdict') = 'failed'
             THEN json_set(node.value, '$.verdict', 'not-proven')
             ELSE json(node.value) END)
    FROM json_each(restores_v11.nodes) AS node)
WHERE json_valid(nodes) AND json_type(nodes) = 'array' AND nodes LIKE '%"failed"%';
DROP TABLE restores;
ALTER TABLE restores_v11 RENAME TO restores;
CREATE INDEX restores_by_cluster ON restores (cluster, started_us DESC, id DESC);
CREATE INDEX restores_by_time ON restores (started_us DESC, id DESC);
CREATE INDEX restores_open ON restores (state) WHERE state IN ('running', 'failed', 'interrupted');

UPDATE table_restores
    SET state = 'not-proven',
        document = CASE WHEN json_valid(document)
                        THEN json_set(document, '$.state', 'not-proven') ELSE document END
    WHERE state = 'unverified';
"""
