"""Table restores run by the coordinator daemon for its API (`ringsnap restore --keyspace` while the
daemon holds the catalog, or from a bastion): the same session and workflow as in the CLI's own
process, run as an operation of kind RESTORE that holds the cluster's lease, as backups,
restores and drills do, so that no backup freezes the ring while its tables are imported."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.guarded_operation import Prepared, start_guarded
from ringsnap.coordinator.model import OperationKind
from ringsnap.coordinator.operations import Operation, Operations
from ringsnap.coordinator.restore.s3_keys import NO_KEYS, RestoreKeys
from ringsnap.coordinator.runs.lease import ClusterLeases, Lease, RunKind
from ringsnap.coordinator.table_restore.documents import plan_document
from ringsnap.coordinator.table_restore.model import (
    TableRestoreRecord,
    TableRestoreRefused,
    TableRestoreRequest,
    new_table_restore_id,
)
from ringsnap.coordinator.table_restore.plan import TableRestorePlan
from ringsnap.coordinator.table_restore.session import (
    TableRestoreSession,
    open_table_restore_session,
)
from ringsnap.coordinator.table_restore.workflow import Progress
from ringsnap.logs import get_logger

log = get_logger(__name__)


@dataclass(frozen=True, kw_only=True)
class TableRestoreStart:
    """One of: a new run (`request`, under `restore_id` when a plan was shown), a resume, an abort."""

    request: TableRestoreRequest | None = None
    restore_id: str = ""
    resume_id: str = ""
    abort_id: str = ""
    #: The cluster's name as the operator typed it.
    confirm_cluster: str = ""
    #: A resume's keys of an encrypted copy, given again (a new run's are in `request`).
    keys: RestoreKeys = field(default=NO_KEYS, repr=False, compare=False)


async def plan_table_restore(
    config: CoordinatorConfig, catalog: Catalog, request: TableRestoreRequest
) -> tuple[TableRestorePlan, dict[str, object]]:
    """Plan as the CLI does (read-only calls only); the plan and its document."""
    backup = await asyncio.to_thread(catalog.get_backup, request.backup_id)
    async with open_table_restore_session(config, backup.cluster, catalog=catalog) as session:
        plan = await session.plan(request)
    return plan, plan_document(plan)


def _confirmed(cluster: str, typed: str) -> None:
    if typed != cluster:
        raise TableRestoreRefused(
            f"the cluster's name was not confirmed: {typed!r} is not {cluster!r}; nothing was done"
        )


async def start_table_restore(  # noqa: PLR0917 - the daemon's parts a run needs
    config: CoordinatorConfig,
    catalog: Catalog,
    operations: Operations,
    leases: ClusterLeases,
    start: TableRestoreStart,
    finished: Callable[[], None] = lambda: None,
) -> Operation:
    """Take the cluster, plan (a new run) or load the record (resume, abort), and run it as an
    operation; refused (TableRestoreRefused, ClusterHeld) before anything is made."""
    existing = start.resume_id or start.abort_id
    if existing:
        record = await asyncio.to_thread(catalog.get_table_restore, existing)
        cluster, backup_id, restore_id = record.cluster, record.backup_id, record.id
        if start.resume_id and record.state.finished:
            raise TableRestoreRefused(
                f"table restore {restore_id} is {record.state.value}; nothing to resume"
            )
    else:
        assert start.request is not None
        backup = await asyncio.to_thread(catalog.get_backup, start.request.backup_id)
        cluster, backup_id = backup.cluster, backup.id
        restore_id = start.restore_id or new_table_restore_id()
    config.cluster(cluster)
    _confirmed(cluster, start.confirm_cluster)
    what = "aborted" if start.abort_id else "resumed" if start.resume_id else "confirmed"

    async def prepare(stack: contextlib.AsyncExitStack) -> Prepared[TableRestoreRecord]:
        session = await stack.enter_async_context(
            open_table_restore_session(config, cluster, catalog=catalog)
        )
        run = await _prepare(session, start, restore_id)
        log.warning(
            "table restore starting through the API",
            table_restore_id=restore_id,
            backup_id=backup_id,
            resume=bool(start.resume_id),
            abort=bool(start.abort_id),
        )
        return Prepared(run, f"table restore {restore_id} of backup {backup_id}: {what}", backup_id)

    return await start_guarded(
        operations,
        leases,
        # A restore kind: `status` shows it, and its backup (whose snapshots it reads) is not
        # deleted meanwhile.
        Lease(cluster, RunKind.TABLE_RESTORE, run_id=restore_id, backup_id=backup_id),
        OperationKind.RESTORE,
        prepare,
        verdict=lambda record: f"table restore {record.id}: {record.state.value}",
        finished=finished,
    )


async def _prepare(
    session: TableRestoreSession, start: TableRestoreStart, restore_id: str
) -> Callable[[Progress], Awaitable[TableRestoreRecord]]:
    """What the operation runs; a new run is planned here, so that a refusal is the caller's
    answer, not a failed operation."""
    if start.abort_id:
        return lambda progress: session.abort(start.abort_id, progress)
    if start.resume_id:
        return lambda progress: session.resume(start.resume_id, progress, start.keys)
    assert start.request is not None
    plan = await session.plan(start.request, restore_id)
    if plan.refused:
        raise TableRestoreRefused("the plan refused: " + "; ".join(plan.refusals))
    return lambda progress: session.run(plan, progress)
