"""Cron schedules for backups, and the rule that one cluster never has two backups at once.

Overlap: the cluster's lease (`runs.lease`) is taken at the entry of every backup of a cluster,
scheduled or manual, as every other run takes it (an
apscheduler `max_instances` only covers one job, while two schedules, or a schedule and an operator,
can target the same cluster). A backup that finds its cluster busy is SKIPPED, not queued: the one
running already captures that moment, and a queue would run back-to-back freezes of the same ring
after a long run. The skip is logged with both triggers, kept in `recent_skips`, handed to
`on_skip` (metrics), and a manual caller gets `ClusterHeld` saying what is running.

Misfires, explicitly:
- in-process (event loop stalled, host suspended): jobs coalesce, so the runs missed in a row are
  done once, if the latest of them is less than `misfire_grace` late; otherwise the run is skipped
  as `missed`. Either way it is logged with the count;
- downtime: apscheduler keeps nothing (memory job store); the catalog knows when each schedule last
  ran. At `start`, a schedule whose latest due time passed since its last run gets one catch-up run
  now, if that due time is less than `misfire_grace` ago; otherwise the miss is logged and the
  schedule waits for its next time.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from apscheduler.events import (
    EVENT_JOB_MISSED,
    EVENT_JOB_SUBMITTED,
    JobExecutionEvent,
    JobSubmissionEvent,
)
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.cron import CronTrigger

from ringsnap.coordinator.runs.lease import ClusterHeld, ClusterLeases, Lease, RunKind
from ringsnap.logs import get_logger

log = get_logger(__name__)

_TICK = timedelta(microseconds=1)
#: Counting missed runs stops here (a per-minute schedule down for weeks): "at least N".
_MAX_COUNTED_MISSES = 10_000


@dataclass(frozen=True)
class Schedule:
    """Back up `cluster` at the times of `cron` (5 fields, in `timezone`), under retention `policy`."""

    name: str
    cluster: str
    cron: str
    policy: str
    timezone: str = "UTC"

    @property
    def trigger(self) -> str:
        """How its backups are recorded in the catalog."""
        return schedule_trigger(self.name)


def schedule_trigger(name: str) -> str:
    return f"schedule:{name}"


@dataclass(frozen=True)
class BackupRequest:
    cluster: str
    #: Who or what asks: "schedule:<name>", "cli:<user>", ...
    trigger: str
    policy: str = ""
    #: The time the schedule meant it for (None for a manual backup).
    scheduled_at: datetime | None = None
    #: Runs once after downtime for the runs missed meanwhile.
    catch_up: bool = False
    #: Chosen by the caller when it must know the id before the run starts ("" = the run picks).
    backup_id: str = ""
    #: The schedule that asked, by name ("" for a manual run).
    schedule: str = ""


#: The backup itself (the workflow); its result is passed back to `BackupScheduler.run` callers.
RunBackup = Callable[[BackupRequest], Awaitable[object]]
#: When a schedule's backups last started, from the catalog (None: never).
LastRun = Callable[[Schedule], Awaitable[datetime | None]]


@dataclass(frozen=True)
class Skip:
    """A backup that did not run, and why."""

    request: BackupRequest
    kind: Literal["busy", "missed"]
    reason: str
    at: datetime


def backup_lease(request: BackupRequest) -> Lease:
    """The lease a backup holds its cluster with."""
    return Lease(
        request.cluster,
        RunKind.BACKUP,
        run_id=request.backup_id,
        backup_id=request.backup_id,
        asked_by=request.trigger,
        schedule=request.schedule,
    )


def cron_trigger(schedule: Schedule) -> BaseTrigger:
    """The schedule's trigger; raises ValueError naming what is wrong with the expression."""
    return CronTrigger.from_crontab(schedule.cron, timezone=schedule.timezone)


def missed_runs(
    trigger: BaseTrigger, after: datetime, until: datetime
) -> tuple[int, datetime | None]:
    """How many fire times of `trigger` fall in (after, until], and the latest of them."""
    count = 0
    latest: datetime | None = None
    moment: datetime | None = trigger.get_next_fire_time(None, after + _TICK)
    while moment is not None and moment <= until and count < _MAX_COUNTED_MISSES:
        count += 1
        latest = moment
        moment = trigger.get_next_fire_time(None, moment + _TICK)
    return count, latest


class BackupScheduler:
    """Runs `run_backup` for each schedule at its cron times, one backup per cluster at a time.

    `run` is also the entry for manual backups, so that they share the cluster's lease.
    """

    def __init__(
        self,
        schedules: Sequence[Schedule],
        run_backup: RunBackup,
        *,
        leases: ClusterLeases | None = None,
        lease_for: Callable[[BackupRequest], Lease] = backup_lease,
        misfire_grace: timedelta = timedelta(hours=1),
        last_run: LastRun | None = None,
        on_skip: Callable[[Skip], None] | None = None,
        trigger_for: Callable[[Schedule], BaseTrigger] = cron_trigger,
    ) -> None:
        names = [s.name for s in schedules]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"schedule names must be unique: {', '.join(duplicates)}")
        if misfire_grace < timedelta(seconds=1):
            raise ValueError("misfire_grace must be at least one second")
        self.schedules = {s.name: s for s in schedules}
        self.leases = leases or ClusterLeases()
        self._lease_for = lease_for
        self.misfire_grace = misfire_grace
        self.recent_skips: collections.deque[Skip] = collections.deque(maxlen=100)
        self._run_backup = run_backup
        self._last_run = last_run
        self._on_skip = on_skip
        self._triggers = {s.name: trigger_for(s) for s in schedules}
        self._scheduled_at: dict[str, datetime] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._scheduler = AsyncIOScheduler(timezone=UTC)  # memory job store: nothing persisted

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start firing (call from the running event loop), after catching up on downtime."""
        if self._scheduler.running:
            raise RuntimeError("the scheduler is already started")
        self._scheduler.add_listener(self._submitted, EVENT_JOB_SUBMITTED)
        self._scheduler.add_listener(self._missed, EVENT_JOB_MISSED)
        for schedule in self.schedules.values():
            self._scheduler.add_job(
                self._fire,
                trigger=self._triggers[schedule.name],
                args=[schedule.name],
                id=schedule.name,
                name=f"backup of {schedule.cluster} ({schedule.name})",
                coalesce=True,
                misfire_grace_time=max(1, int(self.misfire_grace.total_seconds())),
                # Overlap is the lease's to refuse, so that it is logged and counted in one place.
                max_instances=8,
            )
        self._scheduler.start()
        if self._last_run is not None:
            for schedule in self.schedules.values():
                await self._catch_up(schedule, self._last_run)
        for name, when in self.next_run_times().items():
            log.info("schedule armed", schedule=name, next_run=when.isoformat() if when else None)

    def shutdown(self) -> None:
        """Stop firing, and cancel the backups the schedules started (apscheduler cancels its jobs;
        the catch-up runs go the same way). A cancelled workflow still thaws and records its
        failure; await `wait_idle` for that. Backups started through `run` are their caller's."""
        if self._scheduler.running:
            self._scheduler.shutdown(wait=False)
        for task in list(self._tasks):
            task.cancel()

    async def wait_idle(self) -> None:
        """Wait for the backups the schedules started (catch-up runs included) to end."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def next_run_times(self) -> dict[str, datetime | None]:
        times: dict[str, datetime | None] = {}
        for name in self.schedules:
            job = self._scheduler.get_job(name)
            times[name] = job.next_run_time if job is not None else None
        return times

    # -- running -----------------------------------------------------------------------------------

    async def run(self, request: BackupRequest) -> object:
        """Run one backup if its cluster is free; raise ClusterHeld (after recording the skip) if
        another run holds the cluster."""
        lease = self._lease_for(request)
        try:
            self.leases.take(lease)
        except ClusterHeld as busy:
            self._skip(request, "busy", str(busy))
            raise
        try:
            return await self._run_backup(request)
        finally:
            self.leases.give_back(lease)

    async def _fire(self, name: str, catch_up: bool = False) -> None:
        schedule = self.schedules[name]
        request = BackupRequest(
            cluster=schedule.cluster,
            trigger=schedule.trigger,
            policy=schedule.policy,
            schedule=schedule.name,
            # Set by the submission event (or the catch-up) just before this coroutine starts.
            scheduled_at=self._scheduled_at.get(name),
            catch_up=catch_up,
        )
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            await self.run(request)
        except ClusterHeld:
            return  # recorded by run()
        except Exception as exc:
            # The workflow records its own failures in the catalog; this only keeps the schedule alive.
            log.error(
                "scheduled backup failed",
                schedule=name,
                cluster=schedule.cluster,
                error=str(exc),
                error_type=type(exc).__name__,
            )
        finally:
            if task is not None:
                self._tasks.discard(task)

    def _skip(self, request: BackupRequest, kind: Literal["busy", "missed"], reason: str) -> None:
        skip = Skip(request=request, kind=kind, reason=reason, at=datetime.now(UTC))
        self.recent_skips.append(skip)
        log.warning(
            "backup skipped",
            cluster=request.cluster,
            trigger=request.trigger,
            kind=kind,
            reason=reason,
        )
        if self._on_skip is not None:
            try:
                self._on_skip(skip)
            except Exception as exc:  # a broken metrics hook must not stop the schedule
                log.error("skip hook failed", error=str(exc))

    # -- misfires ----------------------------------------------------------------------------------

    def _submitted(self, event: JobSubmissionEvent) -> None:
        name = event.job_id
        if name not in self.schedules:
            return  # a catch-up run
        scheduled = event.scheduled_run_times[-1]
        previous = self._scheduled_at.get(name)
        self._scheduled_at[name] = scheduled
        late = datetime.now(UTC) - scheduled
        if previous is not None:
            # Coalescing hands over only the latest due time; count what it swallowed.
            count, _ = missed_runs(self._triggers[name], previous, scheduled - _TICK)
            if count:
                log.warning(
                    "missed runs coalesced into one",
                    schedule=name,
                    missed=count,
                    scheduled_at=scheduled.isoformat(),
                    late_seconds=round(late.total_seconds(), 3),
                )
                return
        if late > timedelta(seconds=1):
            log.info(
                "scheduled backup starts late",
                schedule=name,
                late_seconds=round(late.total_seconds(), 3),
            )

    def _missed(self, event: JobExecutionEvent) -> None:
        schedule = self.schedules.get(event.job_id)
        if schedule is None:
            return
        late = datetime.now(UTC) - event.scheduled_run_time
        self._skip(
            BackupRequest(
                cluster=schedule.cluster,
                trigger=schedule.trigger,
                policy=schedule.policy,
                scheduled_at=event.scheduled_run_time,
            ),
            "missed",
            f"schedule {schedule.name}: the run due at {event.scheduled_run_time:%Y-%m-%dT%H:%M:%SZ}"
            f" was {late.total_seconds():.0f} s late, beyond the misfire grace of"
            f" {self.misfire_grace.total_seconds():.0f} s; waiting for the next time",
        )

    async def _catch_up(self, schedule: Schedule, last_run: LastRun) -> None:
        last = await last_run(schedule)
        if last is None:
            return  # a new schedule starts at its next time, not at startup
        now = datetime.now(UTC)
        count, latest = missed_runs(self._triggers[schedule.name], last, now)
        if latest is None:
            return
        at_least = "at least " if count >= _MAX_COUNTED_MISSES else ""
        late = now - latest
        if late > self.misfire_grace:
            request = BackupRequest(
                cluster=schedule.cluster,
                trigger=schedule.trigger,
                policy=schedule.policy,
                scheduled_at=latest,
            )
            self._skip(
                request,
                "missed",
                f"schedule {schedule.name}: {at_least}{count} runs were due while the coordinator"
                f" was down (last backup {last:%Y-%m-%dT%H:%M:%SZ}); the latest, due"
                f" {latest:%Y-%m-%dT%H:%M:%SZ}, is beyond the misfire grace; waiting for the next time",
            )
            return
        log.warning(
            "catching up on runs missed while down: running once now",
            schedule=schedule.name,
            cluster=schedule.cluster,
            missed=f"{at_least}{count}",
            last_backup=last.isoformat(),
            latest_due=latest.isoformat(),
        )
        self._scheduled_at[schedule.name] = latest
        task = asyncio.create_task(self._fire(schedule.name, catch_up=True))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
