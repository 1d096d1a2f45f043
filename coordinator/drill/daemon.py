"""Drills run by the coordinator daemon for its API (`ringsnap drill` while the daemon holds the
catalog): the same session and workflow as in the CLI's own process, run as an operation of kind
DRILL that holds the cluster's lease, as backups and restores do (docs/drills.md)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.drill.model import DRILL_ID, DrillRecord, new_drill_id
from ringsnap.coordinator.drill.plan import DrillRequest
from ringsnap.coordinator.drill.session import open_drill_session
from ringsnap.coordinator.drill.workflow import DrillRefused
from ringsnap.coordinator.guarded_operation import Prepared, start_guarded
from ringsnap.coordinator.model import OperationKind
from ringsnap.coordinator.operations import Operation, Operations
from ringsnap.coordinator.runs.lease import ClusterLeases, Lease, RunKind
from ringsnap.errors import ValidationError
from ringsnap.logs import get_logger

log = get_logger(__name__)


async def start_drill(
    config: CoordinatorConfig,
    catalog: Catalog,
    operations: Operations,
    leases: ClusterLeases,
    request: DrillRequest,
    *,
    drill_id: str = "",
    finished: Callable[[], None] = lambda: None,
) -> Operation:
    """Take the cluster, plan, and run the drill as an operation; refused (DrillRefused,
    ClusterHeld) before anything is made. The plan is made here so that a refusal is the
    caller's answer, not a failed operation."""
    if drill_id and not DRILL_ID.fullmatch(drill_id):
        raise ValidationError(f"drill_id {drill_id!r} is not dr-YYYYMMDD-HHMMSS-xxxx")
    drill_id = drill_id or new_drill_id()
    config.cluster(request.cluster)
    lease = Lease(
        request.cluster,
        RunKind.DRILL,
        run_id=drill_id,
        backup_id=request.backup_id,
        asked_by=request.requested_by,
    )

    async def prepare(stack: contextlib.AsyncExitStack) -> Prepared[DrillRecord]:
        session = await stack.enter_async_context(
            open_drill_session(config, request.cluster, catalog=catalog)
        )
        plan = await session.plan(request, drill_id)
        if plan.refused:
            raise DrillRefused("the plan refused: " + "; ".join(plan.refusals))
        log.warning(
            "drill starting through the API",
            drill_id=drill_id,
            backup_id=plan.backup.id,
            nodes=[n.name for n in plan.nodes],
            requested_by=request.requested_by,
        )
        return Prepared(
            lambda progress: session.run(plan, request, progress),
            f"drill {drill_id} of backup {plan.backup.id}:"
            f" {', '.join(n.name for n in plan.nodes)} on {plan.drill_host}",
            plan.backup.id,
        )

    return await start_guarded(
        operations,
        leases,
        lease,
        OperationKind.DRILL,
        prepare,
        verdict=lambda record: f"drill {record.id}: {record.state.value}",
        finished=finished,
    )
