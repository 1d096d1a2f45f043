"""A backup run's end in the catalog: completed with its nodes, snapshots, manifests and schemas,
or failed with everything it made that must still be deleted (pending cleanups)."""

from __future__ import annotations

import asyncio

from ringsnap.coordinator.backup import BackupRun
from ringsnap.coordinator.backup.nodes import recorded_node
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.config import ClusterSection
from ringsnap.coordinator.model import Backup, CleanupRequest
from ringsnap.coordinator.runs.resources import native_tag


def record_completed(catalog: Catalog, cluster: ClusterSection, run: BackupRun) -> Backup:
    """Record the run's nodes (as configured, with what the run learned), snapshots, manifests
    and schemas, then complete the backup (the catalog refuses an incomplete one)."""
    nodes = [recorded_node(node, run.nodes[node.name]) for node in cluster.nodes]
    catalog.record_nodes(run.backup_id, nodes)
    for ref in run.snapshots:
        catalog.record_snapshot(run.backup_id, ref)
    for name in run.included:
        catalog.record_manifest(run.backup_id, name, run.nodes[name].manifest)
    catalog.record_keyspace_schemas(run.backup_id, run.keyspace_schemas)
    return catalog.complete_backup(
        run.backup_id,
        timings=run.clock.phases,
        freeze_window=run.window,
        warnings=[*run.array_warnings, *run.warnings],
    )


def record_failed(catalog: Catalog, run: BackupRun, error: BaseException) -> None:
    """Mark the backup failed; every array snapshot it holds becomes a pending cleanup, every
    native snapshot it may have taken a ledger entry."""
    cleanups = list(run.pending_cleanups)
    # Snapshots the workflow took but the catalog refused (e.g. incomplete) are still held.
    cleanups += [
        CleanupRequest(array=ref.array, reason=f"backup failed: {error}", ref=ref)
        for ref in run.snapshots
    ]
    tags = [
        native_tag(run.cluster, node, run.backup_id, f"backup failed: {error}")
        for node in run.native_snapshots
    ]
    message = str(error) or type(error).__name__
    if isinstance(error, asyncio.CancelledError):
        message = "cancelled (the coordinator is stopping); every node was thawed"
    catalog.fail_backup(
        run.backup_id,
        message,
        cleanups=cleanups,
        native_tags=tags,
        timings=run.clock.phases,
        freeze_window=run.window,
        warnings=run.array_warnings,
    )
