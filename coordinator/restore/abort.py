"""Where a restore from S3 is given up: in the coordinator (`start_abort`: the API's AbortRestore,
an operation of kind restore that holds the cluster as the restore did, so that no backup, restore,
drill or export of it runs meanwhile; the daemon, or the same service `ringsnap` hosts while no
daemon runs), in one session (`abort_in_session`). What the abort does is
`s3_restore_abort.S3RestoreAbort`."""

from __future__ import annotations

import asyncio
import contextlib

from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.guarded_operation import Prepared, start_guarded
from ringsnap.coordinator.model import OperationKind, RestoreRecord
from ringsnap.coordinator.operations import Operation, Operations
from ringsnap.coordinator.restore.s3_abort import S3RestoreAbort, refusal
from ringsnap.coordinator.restore.session import RestoreSession, open_restore_session
from ringsnap.coordinator.restore.workflow import Progress, RestoreRefused
from ringsnap.coordinator.runs.lease import ClusterLeases, Lease, RunKind
from ringsnap.logs import get_logger

log = get_logger(__name__)


def check_abortable(record: RestoreRecord, confirm_cluster: str | None = None) -> None:
    """Refuse (nothing asked of any node) what cannot be given up; `confirm_cluster`, when given,
    must be the restore's cluster."""
    if confirm_cluster is not None and confirm_cluster != record.cluster:
        got = f"{confirm_cluster!r} was given" if confirm_cluster else "none was given"
        raise RestoreRefused(
            f"giving up restore {record.id} must be confirmed with its cluster's name"
            f" ({record.cluster}), and {got}; nothing was done"
        )
    why = refusal(record)
    if why is not None:
        raise RestoreRefused(why)


async def abort_in_session(
    session: RestoreSession, restore_id: str, requested_by: str, progress: Progress
) -> RestoreRecord:
    """Give up `restore_id` with the session's agents; its record is saved in the catalog."""
    record = await asyncio.to_thread(session.catalog.get_restore, restore_id)
    check_abortable(record)

    async def save(changed: RestoreRecord) -> None:
        await asyncio.to_thread(session.catalog.save_restore, changed)

    return await S3RestoreAbort(
        record,
        s3_agents=session.s3_agents,
        agents=session.agents,
        save=save,
        progress=progress,
        agent_timeout=session.settings.agent_timeout,
        start_timeout=session.settings.start_timeout,
        seeds=session.cluster.seeds,
    ).run(requested_by)


def abort_verdict(record: RestoreRecord) -> str:
    detail = f": {record.error}" if record.error else ""
    return f"restore {record.id} of backup {record.backup_id}: {record.state.value}{detail}"


async def start_abort(  # noqa: PLR0917 - the daemon's parts and the request
    config: CoordinatorConfig,
    catalog: Catalog,
    operations: Operations,
    leases: ClusterLeases,
    restore_id: str,
    confirm_cluster: str,
    requested_by: str,
) -> Operation:
    """The abort as the daemon's operation; refusals (RestoreRefused, ClusterHeld) are the
    caller's answer and leave nothing held."""
    record = await asyncio.to_thread(catalog.get_restore, restore_id)
    check_abortable(record, confirm_cluster)
    try:
        config.cluster(record.cluster)
    except KeyError:
        raise RestoreRefused(
            f"restore {restore_id} is of cluster {record.cluster}, which this coordinator's"
            " configuration does not name; nothing was done"
        ) from None
    lease = Lease(
        record.cluster,
        RunKind.RESTORE,
        run_id=restore_id,
        backup_id=record.backup_id,
        asked_by=requested_by,
    )

    async def prepare(stack: contextlib.AsyncExitStack) -> Prepared[RestoreRecord]:
        session = await stack.enter_async_context(
            open_restore_session(config, record.cluster, catalog=catalog)
        )

        async def run(progress: Progress) -> RestoreRecord:
            return await abort_in_session(session, restore_id, requested_by, progress)

        return Prepared(run, f"giving up restore {restore_id}", record.backup_id)

    log.warning(
        "abort of a restore from S3 requested through the API",
        restore_id=restore_id,
        requested_by=requested_by,
    )
    return await start_guarded(
        operations, leases, lease, OperationKind.RESTORE, prepare, verdict=abort_verdict
    )
