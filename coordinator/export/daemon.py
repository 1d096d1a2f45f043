"""Exports run by the daemon (the API's StartExport): the same session as `ringsnap export`, as an
operation of kind EXPORT under an export's lease: no restore, drill, purge or other export of the
cluster meanwhile (the agents refuse a second export of a node anyway), while its backups go on
(`ringsnap.coordinator.runs.lease`)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.export.model import ExportRefused
from ringsnap.coordinator.export.session import open_export_session
from ringsnap.coordinator.export.workflow import DEFAULT_PARALLEL_NODES
from ringsnap.coordinator.model import OperationKind
from ringsnap.coordinator.operations import Operation, Operations
from ringsnap.coordinator.runs.lease import ClusterLeases, Lease, RunKind
from ringsnap.logs import get_logger
from ringsnap.names import backup_id as valid_backup_id

log = get_logger(__name__)


async def start_export(  # noqa: PLR0917 - the daemon's parts and the request
    config: CoordinatorConfig,
    catalog: Catalog,
    operations: Operations,
    leases: ClusterLeases,
    backup_id: str,
    nodes: Sequence[str] = (),
    parallel_nodes: int = 0,
    requested_by: str = "api",
) -> Operation:
    """Check what can be checked at once (refusals are the caller's answer), then export as an
    operation."""
    valid_backup_id(backup_id)
    backup = await asyncio.to_thread(catalog.get_backup, backup_id)
    included = {n.name for n in backup.nodes if n.included}
    unknown = sorted(set(nodes) - included)
    if unknown:
        raise ExportRefused(f"backup {backup_id} has no included node {', '.join(unknown)}")
    if config.s3 is None:
        log.warning("export without the coordinator's [s3]: the catalog is not mirrored")
    lease = Lease(
        backup.cluster, RunKind.EXPORT, run_id=backup_id, backup_id=backup_id, asked_by=requested_by
    )
    leases.take(lease)  # ClusterHeld: refused, nothing made
    released = False

    def release() -> None:
        nonlocal released
        if not released:
            released = True
            leases.give_back(lease)

    async def work(operation: Operation) -> None:
        def progress(node: str, message: str) -> None:
            operation.update_soon(phase="export", message=f"{node}: {message}" if node else message)

        try:
            async with open_export_session(config, backup.cluster, catalog=catalog) as session:
                record = await session.export(
                    backup_id,
                    nodes,
                    progress=progress,
                    parallel_nodes=parallel_nodes or DEFAULT_PARALLEL_NODES,
                )
            await operation.update(
                phase="done",
                message=f"export of {backup_id} to {record.destination}: {record.state.value}",
            )
        finally:
            release()

    log.warning(
        "export starting through the API",
        backup_id=backup_id,
        nodes=list(nodes) or sorted(included),
        requested_by=requested_by,
    )
    try:
        operation = operations.start(OperationKind.EXPORT.value, work, backup_id=backup_id)
    except BaseException:
        release()
        raise
    if operation.task is not None:
        # A task cancelled before its first step never ran `work`'s release.
        operation.task.add_done_callback(lambda _: release())
    return operation
