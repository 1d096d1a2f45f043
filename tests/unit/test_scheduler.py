"""Schedules on a real apscheduler: one backup per cluster at a time, misfires handled explicitly.

The triggers are real apscheduler triggers placed a fraction of a second ahead, so that the tests
run in seconds; the event loop is blocked on purpose to produce misfires.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import structlog
from apscheduler.triggers.base import BaseTrigger

from ringsnap.coordinator.runs.lease import ClusterHeld, ClusterLeases, Lease, RunKind
from ringsnap.coordinator.scheduler import (
    BackupRequest,
    BackupScheduler,
    Schedule,
    Skip,
    cron_trigger,
    missed_runs,
)


def run(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(main())


class AtTimes(BaseTrigger):  # type: ignore[misc]
    """Fires at the given moments only (apscheduler's DateTrigger fires once, and an OrTrigger of
    them stops after the first)."""

    def __init__(self, moments: list[datetime]) -> None:
        self.moments = sorted(moments)

    def get_next_fire_time(self, previous: datetime | None, now: datetime) -> datetime | None:
        if previous is None:
            return next((m for m in self.moments if m >= now), None)
        return next((m for m in self.moments if m > previous), None)

    def __str__(self) -> str:
        return f"at {', '.join(m.isoformat() for m in self.moments)}"


def at(*moments: datetime) -> BaseTrigger:
    return AtTimes(list(moments))


class Recorder:
    """A backup runner that records what ran and how many ran at once, per cluster."""

    def __init__(self, seconds: float = 0.0) -> None:
        self.seconds = seconds
        self.requests: list[BackupRequest] = []
        self.active: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()
        self.peak_overall = 0
        self.release = asyncio.Event()
        self.hold = False

    async def __call__(self, request: BackupRequest) -> str:
        self.requests.append(request)
        self.active[request.cluster] += 1
        self.peak[request.cluster] = max(self.peak[request.cluster], self.active[request.cluster])
        self.peak_overall = max(self.peak_overall, sum(self.active.values()))
        try:
            if self.hold:
                await self.release.wait()
            await asyncio.sleep(self.seconds)
        finally:
            self.active[request.cluster] -= 1
        return f"backup of {request.cluster}"


def test_two_schedules_of_one_cluster_never_run_at_once() -> None:
    async def main() -> None:
        recorder = Recorder(seconds=0.3)
        skips: list[Skip] = []
        start = datetime.now(UTC)
        times = [start + timedelta(seconds=s) for s in (0.3, 0.9, 1.5)]
        schedules = [
            Schedule("hourly", "c1", "0 * * * *", "hourly"),
            Schedule("daily", "c1", "0 0 * * *", "daily"),
            Schedule("other", "c2", "0 * * * *", "hourly"),
        ]
        scheduler = BackupScheduler(
            schedules, recorder, on_skip=skips.append, trigger_for=lambda s: at(*times)
        )
        await scheduler.start()
        # A manual backup of c1 arrives while the schedules fire.
        await asyncio.sleep(0.4)
        manual = BackupRequest(cluster="c1", trigger="cli:alice")
        with pytest.raises(ClusterHeld, match=r"already being backed up \(by schedule:"):
            await scheduler.run(manual)
        await asyncio.sleep(1.8)
        scheduler.shutdown()

        assert recorder.peak["c1"] == 1
        assert recorder.peak_overall >= 2  # the lease is per cluster: c2 ran alongside c1
        c1_runs = [r for r in recorder.requests if r.cluster == "c1"]
        c1_skips = [s for s in skips if s.request.cluster == "c1"]
        assert len(c1_runs) + len(c1_skips) == 2 * len(times) + 1  # every fire, and the manual one
        assert len(c1_runs) >= 1 and all(s.kind == "busy" for s in c1_skips)
        assert any(s.request.trigger == "cli:alice" for s in c1_skips)
        assert len([r for r in recorder.requests if r.cluster == "c2"]) == len(times)
        assert list(scheduler.recent_skips) == skips
        assert {r.trigger for r in c1_runs} <= {"schedule:hourly", "schedule:daily"}
        assert all(r.scheduled_at in times for r in recorder.requests)

    run(main)


def test_a_manual_backup_waits_for_nothing_and_says_what_runs() -> None:
    async def main() -> None:
        recorder = Recorder()
        recorder.hold = True
        scheduler = BackupScheduler([], recorder)
        first = asyncio.create_task(scheduler.run(BackupRequest("c1", "schedule:hourly")))
        await asyncio.sleep(0.05)
        holder = scheduler.leases.holder("c1")
        assert holder is not None
        assert (holder.kind, holder.asked_by) == (RunKind.BACKUP, "schedule:hourly")
        with pytest.raises(ClusterHeld) as busy:
            await scheduler.run(BackupRequest("c1", "cli:bob"))
        assert busy.value.holder.asked_by == "schedule:hourly"
        assert busy.value.wanted.asked_by == "cli:bob"
        assert busy.value.exit_code == 75
        # Another cluster is free.
        recorder.hold = False
        assert await scheduler.run(BackupRequest("c2", "cli:bob")) == "backup of c2"
        recorder.release.set()
        assert await first == "backup of c1"
        assert scheduler.leases.holder("c1") is None
        # The lease is given back after a failure too.
        failing = BackupScheduler([], _fail)
        with pytest.raises(RuntimeError, match="array on fire"):
            await failing.run(BackupRequest("c1", "cli:bob"))
        assert failing.leases.holder("c1") is None

    run(main)


async def _fail(request: BackupRequest) -> None:
    raise RuntimeError("array on fire")


def test_a_failing_backup_does_not_stop_its_schedule() -> None:
    async def main() -> None:
        calls: list[BackupRequest] = []

        async def flaky(request: BackupRequest) -> None:
            calls.append(request)
            raise RuntimeError("array on fire")

        start = datetime.now(UTC)
        times = [start + timedelta(seconds=s) for s in (0.2, 0.5)]
        scheduler = BackupScheduler(
            [Schedule("hourly", "c1", "0 * * * *", "hourly")],
            flaky,
            trigger_for=lambda s: at(*times),
        )
        with structlog.testing.capture_logs() as logs:
            await scheduler.start()
            await asyncio.sleep(0.9)
        scheduler.shutdown()
        assert len(calls) == 2
        assert [e["error"] for e in logs if e["event"] == "scheduled backup failed"] == [
            "array on fire"
        ] * 2

    run(main)


def test_runs_missed_in_a_row_are_coalesced_into_one() -> None:
    async def main() -> None:
        recorder = Recorder()
        start = datetime.now(UTC)
        times = [start + timedelta(seconds=s) for s in (0.3, 1.5, 1.7, 1.9)]
        scheduler = BackupScheduler(
            [Schedule("hourly", "c1", "0 * * * *", "hourly")],
            recorder,
            misfire_grace=timedelta(seconds=30),
            trigger_for=lambda s: at(*times),
        )
        with structlog.testing.capture_logs() as logs:
            await scheduler.start()
            await asyncio.sleep(0.8)
            assert [r.scheduled_at for r in recorder.requests] == [times[0]]
            time.sleep(1.6)  # the loop stalls past the next three due times
            await asyncio.sleep(0.5)
        scheduler.shutdown()
        assert [r.scheduled_at for r in recorder.requests] == [times[0], times[3]]
        [coalesced] = [e for e in logs if e["event"] == "missed runs coalesced into one"]
        assert coalesced["missed"] == 2 and coalesced["schedule"] == "hourly"
        assert scheduler.recent_skips == type(scheduler.recent_skips)()

    run(main)


def test_a_run_later_than_the_misfire_grace_is_skipped_and_recorded() -> None:
    async def main() -> None:
        recorder = Recorder()
        skips: list[Skip] = []
        start = datetime.now(UTC)
        scheduler = BackupScheduler(
            [Schedule("hourly", "c1", "0 * * * *", "hourly")],
            recorder,
            misfire_grace=timedelta(seconds=1),
            on_skip=skips.append,
            trigger_for=lambda s: at(start + timedelta(seconds=0.2)),
        )
        await scheduler.start()
        time.sleep(1.8)  # past the due time plus the grace
        await asyncio.sleep(0.3)
        scheduler.shutdown()
        assert recorder.requests == []
        [skip] = skips
        assert skip.kind == "missed" and skip.request.cluster == "c1"
        assert "beyond the misfire grace of 1 s" in skip.reason

    run(main)


def test_after_downtime_a_schedule_catches_up_once() -> None:
    async def main() -> None:
        recorder = Recorder()
        schedule = Schedule("minutely", "c1", "* * * * *", "hourly")

        async def last_run(s: Schedule) -> datetime | None:
            assert s == schedule
            return datetime.now(UTC) - timedelta(minutes=10)

        scheduler = BackupScheduler([schedule], recorder, last_run=last_run)
        with structlog.testing.capture_logs() as logs:
            await scheduler.start()
            await scheduler.wait_idle()
        scheduler.shutdown()
        [request] = recorder.requests
        assert request.catch_up and request.trigger == "schedule:minutely"
        assert request.scheduled_at is not None
        assert datetime.now(UTC) - request.scheduled_at < timedelta(minutes=1)
        [caught] = [e for e in logs if e["event"].startswith("catching up")]
        assert caught["missed"] in {"9", "10", "11"}

    run(main)


def test_after_long_downtime_beyond_the_grace_the_schedule_waits() -> None:
    async def main() -> None:
        recorder = Recorder()
        skips: list[Skip] = []
        schedule = Schedule("yearly", "c1", "0 0 1 1 *", "yearly")

        async def last_run(s: Schedule) -> datetime | None:
            return datetime.now(UTC) - timedelta(days=3 * 365 + 10)

        scheduler = BackupScheduler(
            [schedule],
            recorder,
            last_run=last_run,
            on_skip=skips.append,
            misfire_grace=timedelta(seconds=1),
        )
        await scheduler.start()
        await scheduler.wait_idle()
        scheduler.shutdown()
        assert recorder.requests == []
        [skip] = skips
        assert skip.kind == "missed"
        assert "3 runs were due while the coordinator was down" in skip.reason

    run(main)


def test_no_catch_up_for_a_new_schedule_or_one_that_ran() -> None:
    async def main() -> None:
        recorder = Recorder()
        answers = {"new": None, "fresh": datetime.now(UTC)}

        async def last_run(s: Schedule) -> datetime | None:
            return answers[s.name]

        scheduler = BackupScheduler(
            [Schedule("new", "c1", "* * * * *", "p"), Schedule("fresh", "c2", "0 * * * *", "p")],
            recorder,
            last_run=last_run,
        )
        await scheduler.start()
        await scheduler.wait_idle()
        next_runs = scheduler.next_run_times()
        scheduler.shutdown()
        assert recorder.requests == []
        assert set(next_runs) == {"new", "fresh"}
        assert all(t is not None and t > datetime.now(UTC) for t in next_runs.values())

    run(main)


def test_missed_runs_counts_due_times_in_a_half_open_interval() -> None:
    trigger = cron_trigger(Schedule("h", "c1", "0 * * * *", "p"))
    after = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)
    assert missed_runs(trigger, after, after + timedelta(hours=5)) == (
        5,
        datetime(2026, 11, 21, 15, 0, tzinfo=UTC),
    )
    assert missed_runs(trigger, after, after + timedelta(minutes=59)) == (0, None)
    berlin = cron_trigger(Schedule("d", "c1", "30 2 * * *", "p", timezone="Europe/Berlin"))
    count, latest = missed_runs(berlin, after, after + timedelta(days=2))
    assert count == 2 and latest is not None
    assert latest.astimezone(UTC) == datetime(2026, 11, 23, 1, 30, tzinfo=UTC)


def test_bad_schedules_are_refused() -> None:
    with pytest.raises(ValueError):
        cron_trigger(Schedule("h", "c1", "0 * * *", "p"))
    with pytest.raises(ValueError, match="unique"):
        BackupScheduler(
            [Schedule("h", "c1", "0 * * * *", "p"), Schedule("h", "c2", "0 * * * *", "p")],
            Recorder(),
        )


def test_the_lease_is_given_back_only_by_its_holder() -> None:
    leases = ClusterLeases()
    first = Lease("c1", RunKind.BACKUP, asked_by="schedule:hourly")
    second = Lease("c1", RunKind.BACKUP, asked_by="cli:bob")
    with leases.hold(first):
        with pytest.raises(ClusterHeld):
            leases.take(second)
        with pytest.raises(RuntimeError, match="not held"):
            leases.give_back(second)
    assert leases.holder("c1") is None


def test_shutdown_cancels_the_scheduled_backups_and_wait_idle_sees_them_end() -> None:
    async def main() -> None:
        cancelled: list[BackupRequest] = []

        async def slow(request: BackupRequest) -> None:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.append(request)  # the workflow thaws and records here
                raise

        start = datetime.now(UTC)
        scheduler = BackupScheduler(
            [Schedule("hourly", "c1", "0 * * * *", "hourly")],
            slow,
            trigger_for=lambda s: at(start + timedelta(seconds=0.1)),
        )
        await scheduler.start()
        await asyncio.sleep(0.4)
        assert scheduler.leases.holder("c1") is not None
        scheduler.shutdown()
        await asyncio.wait_for(scheduler.wait_idle(), 5)
        assert [r.trigger for r in cancelled] == ["schedule:hourly"]
        assert scheduler.leases.holder("c1") is None

    run(main)
