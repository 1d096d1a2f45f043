"""The coordinator killed (SIGKILL) while every node is frozen.

The agents' leases thaw every filesystem on time; the restarted coordinator finds the interrupted
run, marks it failed and deletes what the array made for it.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ringsnap.coordinator.assembly import open_coordinator
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.model import BackupState
from ringsnap.plugins.registry import open_driver
from ringsnap.plugins.simulators.faults import Fault
from ringsnap.sandbox.cluster import SandboxCluster
from ringsnap.sandbox.stack import ARRAY_NAME, CLUSTER_NAME, running_stack
from tests.support.write_probe import write_and_fsync

pytestmark = pytest.mark.integration

COORDINATOR = """
import asyncio, json, sys
from ringsnap.config import validate
from ringsnap.coordinator.assembly import open_coordinator
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.scheduler import BackupRequest

config = validate(json.load(open(sys.argv[1])), CoordinatorConfig, source=sys.argv[1])

async def main():
    async with open_coordinator(config, source=sys.argv[1]) as coordinator:
        await coordinator.backup(BackupRequest("sandbox", trigger="test:crash"))

asyncio.run(main())
"""


def _write_probe(mount_point: Path, done: dict[str, float], started: float) -> None:
    """Write and fsync a file: blocks while the filesystem is frozen."""
    path = mount_point / ".ringsnap-thaw-probe"
    write_and_fsync(path)
    path.unlink()
    done[str(mount_point)] = time.monotonic() - started


def test_coordinator_killed_mid_freeze(
    sandbox_cluster: SandboxCluster, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    with running_stack(sandbox_cluster, tmp_path / "stack", vendor="ontap") as stack:
        data = stack.coordinator_data(freeze_budget_seconds=1.9)
        config_file = tmp_path / "coordinator.json"
        config_file.write_text(json.dumps(data))
        # The array takes 4 s to answer (and then does make the snapshot): long past the kill.
        stack.array.server.faults.add(
            Fault("hang", method="POST", path=r"/consistency-groups/[^/]+/snapshots$", seconds=4)
        )
        process = subprocess.Popen([sys.executable, "-c", COORDINATOR, str(config_file)])
        request.addfinalizer(process.kill)
        state_dirs = [
            tmp_path / "stack" / "agent-state" / node.name for node in sandbox_cluster.nodes
        ]
        deadline = time.monotonic() + 240
        # Kill while every node is frozen and the array call is in flight.
        while not (
            all(any(d.glob("freeze-*.json")) for d in state_dirs)
            and not stack.array.server.faults.describe()  # the hang fault was taken
        ):
            assert process.poll() is None, "the coordinator ended before freezing"
            assert time.monotonic() < deadline, "the nodes were never frozen"
            time.sleep(0.02)
        process.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        process.wait(10)

        # Every filesystem takes writes again within one lease (plus scheduling slack).
        mounts = [lun.mount_point for node in sandbox_cluster.nodes for lun in node.luns]
        thawed_after: dict[str, float] = {}
        probes = [
            threading.Thread(target=_write_probe, args=(m, thawed_after, killed), daemon=True)
            for m in mounts
        ]
        for probe in probes:
            probe.start()
        for probe in probes:
            probe.join(30)
        assert sorted(thawed_after) == sorted(str(m) for m in mounts)
        lease = data["coordinator"].get("lease_seconds", 1.0)
        assert max(thawed_after.values()) < lease + 2.0, thawed_after

        time.sleep(4)  # let the array finish the call the dead coordinator started
        with Catalog(data["coordinator"]["catalog"], exclusive=False) as catalog:
            (running,) = catalog.list_backups(CLUSTER_NAME).backups
        assert running.state is BackupState.RUNNING  # what the dead coordinator left
        assert running.id in _snapshot_names(stack.array.table, sandbox_cluster)

        async def restart() -> None:
            async with open_coordinator(stack.coordinator_config(), source="<test>"):
                pass

        asyncio.run(restart())

        with Catalog(data["coordinator"]["catalog"], exclusive=False) as catalog:
            (backup,) = catalog.list_backups(CLUSTER_NAME).backups
            assert backup.state is BackupState.FAILED
            assert "coordinator stopped" in backup.error
            assert catalog.pending_cleanups() == []
        assert backup.id not in _snapshot_names(stack.array.table, sandbox_cluster)


def _snapshot_names(table: dict[str, object], cluster: SandboxCluster) -> list[str]:
    driver = open_driver(ARRAY_NAME, table, "<test>")
    try:
        wanted = {lun.volume_name for node in cluster.nodes for lun in node.luns}
        volumes = [v for v in driver.list_volumes() if v.name in wanted]
        assert len(volumes) == len(wanted)
        return [info.ref.snapshot_name for info in driver.list_snapshots(volumes)]
    finally:
        driver.close()
