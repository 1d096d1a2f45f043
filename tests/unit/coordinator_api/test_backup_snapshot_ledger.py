"""Backups' array snapshots in the resource ledger, through the real coordinator and catalog: the
entry is there before the array is asked; a run that fails after the array snapshotted leaves one
entry, which the daemon's retry deletes through the array's port; a daemon SIGKILLed while the
array's snapshot call runs leaves the entry, and the restarted daemon deletes the snapshot the array
made (found by the backup's name). A completed backup leaves none."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ringsnap.api.v1 import coordinator_pb2 as pb
from ringsnap.coordinator.model import BackupState
from ringsnap.coordinator.runs.resources import LedgerEntry, ResourceType
from ringsnap.coordinator.scheduler import BackupRequest
from ringsnap.plugins.errors import DriverError
from ringsnap.plugins.types import SnapshotRef
from tests.support.fakes import snapshot_ref, volume
from tests.unit.coordinator_api.conftest import ARRAY, CLUSTERS, Harness, _start

ROOT = Path(__file__).resolve().parents[3]

#: The daemon, killed by SIGKILL while the array's snapshot call runs.
_KILLED_IN_THE_SNAPSHOT_CALL = """
import asyncio, os, signal, sys
from pathlib import Path
from ringsnap.coordinator.scheduler import BackupRequest
from tests.unit.coordinator_api.conftest import _start

async def main():
    harness = await _start(Path(sys.argv[1]))

    async def killed(volumes, name):
        os.kill(os.getpid(), signal.SIGKILL)

    harness.array.create_group_snapshot = killed
    await harness.coordinator.backup(BackupRequest("prod", trigger="test", backup_id=sys.argv[2]))

asyncio.run(main())
"""


def _snapshots(entries: list[LedgerEntry]) -> list[LedgerEntry]:
    return [e for e in entries if e.resource.type is ResourceType.SNAPSHOT]


def _gauge(harness: Harness, name: str) -> float | None:
    return harness.coordinator.metrics.registry.get_sample_value(name)


def test_the_snapshot_is_in_the_ledger_before_the_array_is_asked(harness: Harness) -> None:
    harness.hold_snapshot()
    run = harness.stub().StartBackup(pb.StartBackupRequest(cluster="prod"), timeout=10)
    harness.wait_snapshotting()
    (entry,) = harness.catalog.resources()
    resource = entry.resource
    assert (resource.type, resource.array, resource.name, resource.ref) == (
        ResourceType.SNAPSHOT,
        ARRAY,
        run.backup_id,
        None,
    )
    assert (resource.cluster, resource.run_id, resource.run_kind) == (
        "prod",
        run.backup_id,
        "backup",
    )
    # The cluster's run holds it: the retry leaves it alone.
    assert harness.call(harness.coordinator.run_pending_cleanups()) == 1
    assert harness.array.events.count(f"delete {run.backup_id}") == 0
    assert harness.array.gate is not None
    harness.call(_open(harness.array.gate))
    harness.call(_ended(harness, run.backup_id))
    backup = harness.catalog.get_backup(run.backup_id)
    if backup.state is BackupState.COMPLETE:
        # The completed backup took its snapshot out of the ledger.
        assert harness.catalog.resources() == []
    else:  # the held call overran the freeze budget: the failed run deleted its snapshot
        assert _snapshots(harness.catalog.resources()) == []
        assert run.backup_id not in harness.array.snapshots


async def _open(gate: asyncio.Event) -> None:
    gate.set()


async def _ended(harness: Harness, backup_id: str) -> None:
    for _ in range(200):
        backup = await asyncio.to_thread(harness.catalog.get_backup, backup_id)
        if backup.state is not BackupState.RUNNING:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"backup {backup_id} still running")


def test_a_backup_failing_after_its_snapshot_leaves_one_entry_the_retry_deletes(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The run fails after the array snapshotted (n3's manifest after the snapshot), and the array
    # refuses the failed run's delete.
    agent = harness.agents["n3"]
    listed = agent.manifest
    calls = []

    async def manifest(snapshot_tag: str = "") -> object:
        calls.append(snapshot_tag)
        if len(calls) > 1:
            raise DriverError("node n3: manifest: disk unreadable")
        return await listed(snapshot_tag)

    monkeypatch.setattr(agent, "manifest", manifest)
    harness.array.delete_error = DriverError("HTTP 503 from the array", array=ARRAY)
    request = BackupRequest("prod", trigger="test", backup_id="rs-fails-after-snapshot")
    with pytest.raises(Exception, match="disk unreadable"):
        harness.call(harness.coordinator.backup(request))

    ref = harness.array.snapshots[request.backup_id]
    (entry,) = harness.catalog.resources()
    assert entry.resource.type is ResourceType.SNAPSHOT
    assert (entry.resource.run_id, entry.resource.cluster, entry.resource.ref) == (
        request.backup_id,
        "prod",
        ref,
    )
    assert "HTTP 503" in entry.last_error
    assert harness.call(harness.coordinator.run_pending_cleanups()) == 1
    assert _gauge(harness, "ringsnap_pending_cleanups") == 1
    assert _gauge(harness, "ringsnap_ledger_entries") == 0, "a snapshot counted twice"

    harness.array.delete_error = None
    assert harness.call(harness.coordinator.run_pending_cleanups()) == 0
    assert request.backup_id not in harness.array.snapshots
    assert harness.catalog.resources() == []
    assert _gauge(harness, "ringsnap_pending_cleanups") == 0


def test_a_deleted_backups_snapshot_is_deleted_through_the_ledger(harness: Harness) -> None:
    harness.seed_backup("rs-old", datetime(2026, 11, 1, tzinfo=UTC))
    harness.array.delete_error = DriverError("HTTP 503 from the array", array=ARRAY)
    harness.call(harness.coordinator.delete_backup("rs-old", "operator"))
    (entry,) = harness.catalog.resources()
    assert (entry.resource.type, entry.resource.name) == (ResourceType.SNAPSHOT, "rs-old")
    assert "rs-old" in harness.array.snapshots
    harness.array.delete_error = None
    assert harness.call(harness.coordinator.run_pending_cleanups()) == 0
    assert "rs-old" not in harness.array.snapshots


def test_a_daemon_killed_in_the_snapshot_call_leaves_the_entry_its_restart_retries(
    tmp_path: Path,
) -> None:
    backup_id = "rs-killed-in-call"
    died = subprocess.run(
        [sys.executable, "-c", _KILLED_IN_THE_SNAPSHOT_CALL, str(tmp_path), backup_id],
        cwd=ROOT,
        check=False,
        capture_output=True,
    )
    assert died.returncode == -signal.SIGKILL, died.stderr.decode()[-2000:]

    async def restarted() -> None:
        harness = await _start(tmp_path)  # start(): interrupted runs failed, the ledger retried
        try:
            assert harness.catalog.get_backup(backup_id).state is BackupState.FAILED
            (entry,) = harness.catalog.resources()
            assert (entry.resource.type, entry.resource.name, entry.resource.ref) == (
                ResourceType.SNAPSHOT,
                backup_id,
                None,
            )
            # Not on the array (yet): kept, since the call may still make it.
            assert "not on the array yet" in entry.last_error
            # The array made it after all, and the process never heard.
            made = _made_by_the_array(backup_id)
            harness.array.snapshots[backup_id] = made
            assert await harness.coordinator.run_pending_cleanups() == 0
            assert harness.array.snapshots == {}
            assert f"delete {backup_id}" in harness.array.events
        finally:
            await harness.server.stop(0)
            await harness.coordinator.stop()
            await asyncio.to_thread(harness.catalog.close)

    asyncio.run(restarted())


def _made_by_the_array(backup_id: str) -> SnapshotRef:
    return snapshot_ref(
        ARRAY, backup_id, [volume(n, role) for n in CLUSTERS["prod"] for role in ("data", "cl")]
    )
