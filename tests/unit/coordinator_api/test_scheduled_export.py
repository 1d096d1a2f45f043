"""A retention policy with `export = true`: the real scheduler fires the schedule, the real
coordinator takes and records the backup, then exports it, and does not for a policy without it.
The export runs outside the backup's hold on the cluster: the next backup does not skip as busy,
while restores, drills, purges and a second export still wait for it. The export itself is faked at its seam (`export_scheduled_backup`: its workflow
is tested in test_export_workflow and on the real ring in test_s3_restore)."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from ringsnap.coordinator import service
from ringsnap.coordinator.catalog import BackupStateError
from ringsnap.coordinator.model import Backup, BackupState
from ringsnap.coordinator.runs.lease import ClusterHeld, Lease, RunKind
from ringsnap.coordinator.scheduler import BackupRequest, BackupScheduler, Schedule
from tests.unit.test_scheduler import at

from .conftest import Harness


def _summaries(harness: Harness) -> list[Any]:
    return [s for c in ("prod", "edge") for s in harness.catalog.backup_summaries(c)]


def test_the_scheduler_exports_each_backup_of_an_export_policy_after_it_is_recorded(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    coordinator = harness.coordinator
    config = coordinator.config
    retention = dict(config.retention)
    retention["daily"] = retention["daily"].model_copy(update={"export": True})
    coordinator.config = config.model_copy(update={"retention": retention})
    exported: list[tuple[str, str, BackupState]] = []

    async def export(config: Any, catalog: Any, arrays: Any, backup: Backup) -> None:
        # What the catalog says at that moment: the backup is recorded complete before its export.
        recorded = await asyncio.to_thread(catalog.get_backup, backup.id)
        exported.append((backup.cluster, backup.policy, recorded.state))

    monkeypatch.setattr(service, "export_scheduled_backup", export)
    soon = datetime.now(UTC) + timedelta(seconds=1)
    scheduler = BackupScheduler(
        [
            Schedule("nightly", "prod", "0 3 * * *", "daily"),  # export = true
            Schedule("hourly", "edge", "0 * * * *", "hourly"),  # no export
        ],
        coordinator._scheduled_backup,
        trigger_for=lambda _schedule: at(soon),
    )
    harness.call(scheduler.start())
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            triggers = {b.trigger for b in _summaries(harness)}
            if {"schedule:nightly", "schedule:hourly"} <= triggers:
                break
            time.sleep(0.2)
        harness.call(scheduler.wait_idle())
        harness.call(coordinator.exports_idle())
    finally:
        scheduler.shutdown()

    summaries = {b.trigger: b for b in _summaries(harness)}
    assert summaries["schedule:nightly"].state is BackupState.COMPLETE
    assert summaries["schedule:hourly"].state is BackupState.COMPLETE
    assert exported == [("prod", "daily", BackupState.COMPLETE)]


def test_a_scheduled_export_running_does_not_make_the_next_backup_skip_as_busy(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    coordinator = harness.coordinator
    config = coordinator.config
    retention = dict(config.retention)
    retention["daily"] = retention["daily"].model_copy(update={"export": True})
    coordinator.config = config.model_copy(update={"retention": retention})
    started: asyncio.Event | None = None
    gate: asyncio.Event | None = None

    async def events() -> None:
        nonlocal started, gate
        started, gate = asyncio.Event(), asyncio.Event()

    harness.call(events())
    assert started is not None and gate is not None

    async def export(config: Any, catalog: Any, arrays: Any, backup: Backup) -> None:
        assert started is not None and gate is not None
        started.set()
        await gate.wait()  # a long upload

    monkeypatch.setattr(service, "export_scheduled_backup", export)
    request = BackupRequest("prod", trigger="schedule:nightly", policy="daily", schedule="nightly")
    exported = harness.call(coordinator._scheduled_backup(request))
    harness.call(asyncio.wait_for(started.wait(), 10))

    # The next backup of the cluster runs while the export does.
    backup = harness.call(coordinator.backup(BackupRequest("prod", trigger="test")))
    assert backup.state is BackupState.COMPLETE
    assert [s.request.trigger for s in coordinator.scheduler.recent_skips] == []
    # What the export reads is kept; what would disturb it waits.
    with pytest.raises(BackupStateError, match="being exported"):
        coordinator.refuse_while_exported(exported.id)
    for kind in (RunKind.RESTORE, RunKind.DRILL, RunKind.PURGE, RunKind.EXPORT):
        with pytest.raises(ClusterHeld, match=f"backup {exported.id}"):
            coordinator.leases.take(Lease("prod", kind, run_id="rr-1"))
    gate_ = gate

    async def release() -> None:
        gate_.set()

    harness.call(release())
    harness.call(coordinator.exports_idle())
    assert coordinator.leases.holder("prod") is None
    coordinator.refuse_while_exported(exported.id)
