"""Scheduled drills: a schedule's drill_cron fires (the real cron trigger of the config), drills the
schedule's policy, and never overlaps a backup or a restore of the same cluster: a drill due while a
backup holds the cluster is skipped as busy, and a backup due while a drill runs is skipped too."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from ringsnap.config import validate
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.drill import schedule
from ringsnap.coordinator.drill.model import DrillRecord, DrillState
from ringsnap.coordinator.drill.plan import DrillSettings
from ringsnap.coordinator.drill.schedule import drill_scheduler, drill_schedules
from ringsnap.coordinator.model import QuiesceMode, Verification
from ringsnap.coordinator.runs.lease import ClusterHeld, ClusterLeases, Lease, RunKind
from ringsnap.coordinator.scheduler import (
    BackupRequest,
    BackupScheduler,
    Schedule,
)
from ringsnap.errors import ConfigError
from tests.support.drill_fakes import (
    DrillArray,
    FakeFacts,
    FakeHost,
    drill_node,
    drill_ref,
    drill_sstables,
    session_opener,
)


def _config(tmp_path: Path, **schedule: object) -> CoordinatorConfig:
    for name in ("c.crt", "c.key", "ca.crt"):
        (tmp_path / name).write_text("-----BEGIN X-----\n")
    data = {
        "tls": {
            "cert_file": str(tmp_path / "c.crt"),
            "key_file": str(tmp_path / "c.key"),
            "ca_file": str(tmp_path / "ca.crt"),
        },
        "arrays": {"a1": {"driver": "ontap"}},
        "clusters": [
            {
                "name": "c1",
                "contact_points": ["127.0.0.1"],
                "drill": {"agent": "127.0.0.1:7450"},
                "nodes": [
                    {
                        "name": "n1",
                        "agent": "127.0.0.1:7443",
                        "volumes": [{"array": "a1", "volume": "v", "role": "data+commitlog"}],
                    }
                ],
            }
        ],
        "schedules": [
            {"name": "hourly", "cluster": "c1", "cron": "0 * * * *", "policy": "p", **schedule}
        ],
        "retention": {"p": {"hourly": 24}},
    }
    return validate(data, CoordinatorConfig, source="<test>")


def test_a_drill_cron_needs_a_drill_host_and_a_valid_expression(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="invalid cron expression"):
        _config(tmp_path, drill_cron="every night")
    config = _config(tmp_path, drill_cron="30 3 * * *")
    assert drill_schedules(config) == [Schedule("drill-hourly", "c1", "30 3 * * *", "p", "UTC")]


def test_the_drill_cron_fires_and_drills_the_schedules_policy(tmp_path: Path) -> None:
    config = _config(tmp_path, drill_cron="* * * * *")
    fired: list[BackupRequest] = []
    done = asyncio.Event()

    async def run_drill(request: BackupRequest) -> None:
        fired.append(request)
        done.set()

    async def last_run(schedule: Schedule) -> datetime | None:
        # The last drill was 90 s ago: the per-minute cron's latest due time has passed since,
        # within the grace, so the real cron trigger fires once now.
        return datetime.now(UTC) - timedelta(seconds=90)

    async def main() -> None:
        scheduler = drill_scheduler(
            drill_schedules(config),
            run_drill,
            leases=ClusterLeases(),
            misfire_grace=timedelta(minutes=10),
            last_run=last_run,
        )
        await scheduler.start()
        try:
            await asyncio.wait_for(done.wait(), 10)
            assert scheduler.next_run_times()["drill-hourly"] is not None
        finally:
            scheduler.shutdown()
            await scheduler.wait_idle()

    asyncio.run(main())
    assert [(r.cluster, r.trigger, r.policy) for r in fired] == [
        ("c1", "schedule:drill-hourly", "p")
    ]


def test_drills_and_backups_of_a_cluster_never_overlap(tmp_path: Path) -> None:
    config = _config(tmp_path, drill_cron="* * * * *")
    leases = ClusterLeases()
    drilling = asyncio.Event()
    release = asyncio.Event()
    drills: list[str] = []

    async def run_drill(request: BackupRequest) -> None:
        drills.append(request.trigger)
        drilling.set()
        await release.wait()

    async def run_backup(request: BackupRequest) -> None:
        await release.wait()

    async def main() -> None:
        backups = BackupScheduler([], run_backup, leases=leases)
        scheduler = drill_scheduler(
            drill_schedules(config), run_drill, leases=leases, misfire_grace=timedelta(minutes=10)
        )
        # As the scheduler's own firing asks (`_fire`): by the drill schedule's name.
        scheduled = BackupRequest(
            "c1", trigger="schedule:drill-hourly", policy="p", schedule="drill-hourly"
        )
        # A backup holds the cluster: the drill due now is skipped as busy, never run.
        backup = asyncio.create_task(backups.run(BackupRequest("c1", trigger="schedule:hourly")))
        await asyncio.sleep(0)
        with pytest.raises(ClusterHeld):
            await scheduler.run(scheduled)
        assert drills == []
        assert scheduler.recent_skips[-1].kind == "busy"
        release.set()
        await backup
        release.clear()
        # A drill holds the cluster: a backup (and a restore) due meanwhile is skipped as busy.
        drill = asyncio.create_task(scheduler.run(scheduled))
        await asyncio.wait_for(drilling.wait(), 5)
        with pytest.raises(ClusterHeld, match=r"being drilled \(scheduled by hourly\)"):
            await backups.run(BackupRequest("c1", trigger="schedule:hourly"))
        with pytest.raises(ClusterHeld, match="restore rr-1 did not start"):
            leases.take(Lease("c1", RunKind.RESTORE, run_id="rr-1"))
        release.set()
        await drill
        assert drills == ["schedule:drill-hourly"]
        assert leases.holder("c1") is None

    asyncio.run(main())


def test_a_scheduled_drill_proves_every_node_of_the_policys_newest_backup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _config(tmp_path, drill_cron="* * * * *")
    events: list[str] = []
    host, array = FakeHost(events), DrillArray(events)
    finished: list[DrillRecord] = []

    opener = session_opener(host, {"n1": FakeFacts("n1")}, array, DrillSettings(poll_seconds=0.0))
    monkeypatch.setattr(schedule, "open_drill_session", opener)
    with Catalog(tmp_path / "catalog.db") as catalog:
        nodes = [drill_node("n1")]
        for backup_id, policy, hours in (("rs-old", "p", 3), ("rs-new", "p", 2), ("rs-x", "q", 1)):
            started = datetime.now(UTC) - timedelta(hours=hours)
            catalog.begin_backup(
                backup_id=backup_id,
                cluster="c1",
                quiesce_mode=QuiesceMode.FREEZE,
                trigger="schedule:hourly",
                policy=policy,
                started_at=started,
                nodes=nodes,
            )
            catalog.record_snapshot(backup_id, drill_ref(nodes))
            catalog.record_manifest(backup_id, "n1", drill_sstables("n1"))
            catalog.complete_backup(backup_id, finished_at=started + timedelta(minutes=1))
        service = schedule.DrillService(config, catalog, finished=finished.append)
        request = BackupRequest("c1", trigger="schedule:drill-hourly", policy="p")
        record = asyncio.run(service.scheduled(request))
        assert record.backup_id == "rs-new" and record.trigger == "schedule:drill-hourly"
        assert record.state is DrillState.PROVEN and finished == [record]
        assert catalog.get_backup("rs-new").verification is Verification.PROVEN
        last = asyncio.run(service.last_run(drill_schedules(config)[0]))
        assert last == record.started_at
