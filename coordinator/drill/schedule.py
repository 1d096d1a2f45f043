"""Scheduled drills: a schedule's `drill_cron` drills every node of the newest backup of its policy,
one node at a time, so that each scheduled drill can prove that backup (a backup is proven once
every node it holds is; one-node drills of ever newer backups would never complete one).

Overlap, decided: a drill holds its cluster's lease (`runs.lease`), the one backups and restores
take, for its whole run. So a drill never starts while a backup or a restore of the
cluster runs (it is skipped as busy, like a backup), and a backup due while a drill runs is skipped
as busy too. The arrays need it: the drill clones the backup's snapshot and deletes its clones at
the end, and retention (which runs after each backup) could otherwise delete that very snapshot
under the clone (ONTAP and E-Series refuse to delete a snapshot a clone still depends on). Default
drills take one node, a few minutes: schedule them between backups.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from apscheduler.triggers.base import BaseTrigger

from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.drill.model import DrillRecord
from ringsnap.coordinator.drill.plan import DrillRequest
from ringsnap.coordinator.drill.session import open_drill_session
from ringsnap.coordinator.drill.workflow import DrillRefused
from ringsnap.coordinator.model import BackupState
from ringsnap.coordinator.runs.lease import ClusterLeases, Lease, RunKind
from ringsnap.coordinator.scheduler import (
    BackupRequest,
    BackupScheduler,
    LastRun,
    RunBackup,
    Schedule,
    Skip,
    cron_trigger,
)
from ringsnap.logs import get_logger

log = get_logger(__name__)

#: Drill schedules are named after their backup schedule: "drill-<schedule>".
PREFIX = "drill-"


def drill_schedules(config: CoordinatorConfig) -> list[Schedule]:
    return [
        Schedule(
            name=f"{PREFIX}{s.name}",
            cluster=s.cluster,
            cron=s.drill_cron,
            policy=s.policy,
            timezone=s.timezone,
        )
        for s in config.schedules
        if s.drill_cron is not None
    ]


def newest_of_policy(catalog: Catalog, cluster: str, policy: str) -> str:
    """The newest complete, restorable backup of the cluster under `policy`."""
    for summary in catalog.backup_summaries(cluster, policy=policy):
        if summary.restorable and summary.state is BackupState.COMPLETE:
            return summary.id
    raise DrillRefused(f"cluster {cluster} has no complete backup of policy {policy} to drill")


class DrillService:
    """Runs scheduled drills in the daemon, with the daemon's catalog."""

    def __init__(
        self,
        config: CoordinatorConfig,
        catalog: Catalog,
        *,
        finished: Callable[[DrillRecord], None] = lambda _record: None,
    ) -> None:
        self.config = config
        self.catalog = catalog
        self._finished = finished

    async def scheduled(self, request: BackupRequest) -> DrillRecord:
        """One scheduled drill (the scheduler holds the cluster's lease meanwhile)."""
        backup_id = await asyncio.to_thread(
            newest_of_policy, self.catalog, request.cluster, request.policy
        )
        drill = DrillRequest(
            cluster=request.cluster,
            backup_id=backup_id,
            ring=True,
            trigger=request.trigger,
            requested_by="scheduler",
        )
        async with open_drill_session(
            self.config, request.cluster, catalog=self.catalog
        ) as session:
            plan = await session.plan(drill)
            if plan.refused:
                raise DrillRefused("the plan refused: " + "; ".join(plan.refusals))
            record = await session.run(plan, drill)
        log.warning(
            "scheduled drill finished",
            drill_id=record.id,
            backup_id=record.backup_id,
            state=record.state.value,
            nodes=[n.name for n in record.nodes],
        )
        self._finished(record)
        return record

    async def last_run(self, schedule: Schedule) -> datetime | None:
        drills = await asyncio.to_thread(self.catalog.list_drills, schedule.cluster, limit=200)
        return next((d.started_at for d in drills if d.trigger == schedule.trigger), None)


def _skipped(skip: Skip) -> None:
    log.warning(
        "scheduled drill skipped",
        cluster=skip.request.cluster,
        trigger=skip.request.trigger,
        kind=skip.kind,
        reason=skip.reason,
    )


def drill_lease(request: BackupRequest) -> Lease:
    """A scheduled drill's lease: its id is picked when it starts; it is named by the operator's
    backup schedule whose `drill_cron` started it."""
    return Lease(
        request.cluster,
        RunKind.DRILL,
        asked_by=request.trigger,
        schedule=request.schedule.removeprefix(PREFIX),
    )


def drill_scheduler(
    schedules: Sequence[Schedule],
    run_drill: RunBackup,
    *,
    leases: ClusterLeases,
    misfire_grace: timedelta,
    last_run: LastRun | None = None,
    trigger_for: Callable[[Schedule], BaseTrigger] = cron_trigger,
) -> BackupScheduler:
    """The cron of drills: the backups' scheduler over the drill schedules, sharing `leases` with
    the backups and restores (so that none of them overlaps a drill of the same cluster)."""
    return BackupScheduler(
        schedules,
        run_drill,
        leases=leases,
        lease_for=drill_lease,
        misfire_grace=misfire_grace,
        last_run=last_run,
        on_skip=_skipped,
        trigger_for=trigger_for,
    )
