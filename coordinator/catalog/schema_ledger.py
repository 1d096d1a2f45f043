"""The catalog migration that makes the resource ledger the one place of clones and native snapshot
tags left to undo: drills' clones (mounted by the cluster's drill host) and failed backups' native
snapshot tags are ledger entries, and what an older ringsnap left as pending cleanups with an
encoded name moves there:

- `pending_cleanups` rows whose `array` reads `native:<cluster>/<node>` become `native-tag`
  entries of that cluster and node;
- rows whose `snapshot_name` reads `clone:{json}` (drills, and exports and table restores from
  before the ledger) become `clone` entries with the JSON's array name, id, cluster, node and
  purpose: mounted by that node, or, without a node, by the cluster's drill host. A body that is
  not JSON was never written by ringsnap: it stays where it is, and the cleanup round reports it.

Each keeps its backup as the run that made it, its reason, its creation time, attempts and last
error. `pending_cleanups` then holds only array snapshots (by reference, or by name).
"""

from __future__ import annotations

from ringsnap.coordinator.catalog.schema_resources import resources_table

#: The ledger's table made again (as migration 12 left it, with its 'mapping' and `host`): the
#: drill host as a mounter.
_RESOURCES = resources_table(13)

#: `native:<cluster>/<node>`: the cluster is between the prefix (7 characters) and the first '/'.
_NATIVE = """
INSERT INTO resources (type, cluster, run_id, run_kind, reason, name, node, created_us, attempts,
        last_error, last_attempt_us)
    SELECT 'native-tag',
        substr(array, 8, instr(substr(array, 8), '/') - 1),
        backup_id, 'backup', reason, snapshot_name,
        substr(array, 8 + instr(substr(array, 8), '/')),
        created_us, attempts, last_error, last_attempt_us
    FROM pending_cleanups
    WHERE array LIKE 'native:%/%';
DELETE FROM pending_cleanups WHERE array LIKE 'native:%/%';
"""

#: `clone:` and a JSON object (`name`, `id`, `cluster`, `purpose`, and `node` when a node mounted
#: it); 6 characters of prefix.
_CLONES = """
INSERT INTO resources (type, cluster, run_id, run_kind, reason, array, name, volume_id, node,
        mount_purpose, drill_host, created_us, attempts, last_error, last_attempt_us)
    SELECT 'clone',
        coalesce(json_extract(body, '$.cluster'), ''),
        backup_id,
        CASE WHEN coalesce(json_extract(body, '$.node'), '') = '' THEN 'drill'
             ELSE 'export or table restore' END,
        reason, array,
        coalesce(json_extract(body, '$.name'), ''),
        coalesce(json_extract(body, '$.id'), ''),
        coalesce(json_extract(body, '$.node'), ''),
        coalesce(json_extract(body, '$.purpose'), ''),
        CASE WHEN coalesce(json_extract(body, '$.node'), '') = ''
              AND coalesce(json_extract(body, '$.purpose'), '') <> '' THEN 1 ELSE 0 END,
        created_us, attempts, last_error, last_attempt_us
    FROM (SELECT *, substr(snapshot_name, 7) AS body FROM pending_cleanups
          WHERE snapshot_name LIKE 'clone:%' AND json_valid(substr(snapshot_name, 7))
            AND coalesce(json_extract(substr(snapshot_name, 7), '$.name'), '') <> '');
DELETE FROM pending_cleanups
    WHERE snapshot_name LIKE 'clone:%' AND json_valid(substr(snapshot_name, 7))
      AND coalesce(json_extract(substr(snapshot_name, 7), '$.name'), '') <> '';
"""

LEDGER_FOLD = _RESOURCES + _NATIVE + _CLONES
