"""A table restore's staging filled from the backup's copy on S3 (`--from s3`), not from clones.

Each node's agent downloads only the table's components (DownloadFromS3 with keyspace and table)
into the staging that ImportStagedTable imports from, each verified (sizes, Data.db against
Digest.crc32); the count of components must match the backup's manifest in the catalog. Nothing in
the live ring changes here: a corrupt object fails the step naming its key, before any import.
The steps clone, mount, unmount and delete-clones have nothing to do.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from ringsnap.coordinator.restore.s3_ports import DownloadProgress, S3Download, S3RestorePort
from ringsnap.coordinator.table_restore.model import TableRestoreFailed, TableRestoreRecord
from ringsnap.coordinator.table_restore.plan import table_sstables

if TYPE_CHECKING:
    from ringsnap.coordinator.runs.engine import StepContext
    from ringsnap.coordinator.table_restore.clone_steps import CloneSteps

#: At most one progress line per node this often.
PROGRESS_INTERVAL_SECONDS = 5.0


async def stage_node_from_s3(
    workflow: CloneSteps,
    ctx: StepContext[TableRestoreRecord],
    agents: Mapping[str, S3RestorePort],
) -> None:
    """The stage step of one node (`ctx.node`), from the bucket."""
    name, record = ctx.node, ctx.payload
    last = 0.0

    def reporter(table: str) -> Callable[[DownloadProgress], None]:
        def report(progress: DownloadProgress) -> None:
            nonlocal last
            now = time.monotonic()
            if now - last >= PROGRESS_INTERVAL_SECONDS:
                last = now
                workflow.progress(name, "stage", f"{table}: {progress.describe()}")

        return report

    agent = agents.get(name)
    if agent is None:
        raise TableRestoreFailed(f"node {name}: no agent connection for restores from S3")
    manifest = list(await workflow.journal.manifest(record.backup_id, name))
    for target in record.targets:
        found, problems = table_sstables(manifest, target.source_keyspace, target.source_table)
        if problems:
            raise TableRestoreFailed("; ".join(problems))
        if not found:
            continue
        download = S3Download(
            record.id,
            record.backup_id,
            name,
            keyspace=target.source_keyspace,
            table=target.source_table,
            target=(target.keyspace, target.table),
            keys=workflow.keys,
        )
        staged = await agent.download_from_s3(download, reporter(target.name))
        expected = sum(len(s.components) for s in found)
        if staged.components != expected:
            raise TableRestoreFailed(
                f"{target.name}: the bucket's copy holds {staged.components} components of"
                f" the table, the backup's manifest {expected}; nothing was imported"
            )
        workflow.progress(
            name,
            "stage",
            f"{target.name}: {len(found)} SSTables, {staged.bytes_total} bytes from S3"
            f" (verified; {staged.bytes_downloaded} bytes downloaded)",
        )
        await workflow._node_table(
            ctx,
            target.table,
            staged_sstables=len(found),
            staged_bytes=staged.bytes_total,
            bytes_verified=staged.bytes_total,
        )
