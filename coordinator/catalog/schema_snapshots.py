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

from ringsnap.coordinator.catalog.schema_resources import resources_table

_DRILL_HOST_NODE = "type = 'mapping' AND node = '@drill-host'"
_RESOURCES = resources_table(
    14,
    copied={
        "node": f"CASE WHEN {_DRILL_HOST_NODE} THEN '' ELSE node END",
        "drill_host": f"CASE WHEN {_DRILL_HOST_NODE} THEN 1 ELSE drill_host END",
    },
)

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
