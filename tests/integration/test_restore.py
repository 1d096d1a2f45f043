"""Restores of the real 3-node sandbox from array snapshots, through each vendor's simulator, proven
by canaries and manifests: the whole ring (revert and clone), one node alone, a tampered backup,
and faults (a revert failing part-way, an unreachable agent, a coordinator killed mid-restore).

Real Cassandra, real agents over mutual TLS unmounting and mounting real loop filesystems, a vendor
REST simulator reverting reflink snapshots of the LUN images, and the real restore workflow.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ringsnap.config import validate
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.model import (
    NodeVerdict,
    RestoreMode,
    RestoreRecord,
    RestoreState,
    RestoreStep,
    Verification,
)
from ringsnap.coordinator.restore.plan import RestoreRequest
from ringsnap.coordinator.restore.session import open_restore_session
from ringsnap.coordinator.restore.workflow import RestoreFailed
from ringsnap.plugins.simulators.faults import Fault
from ringsnap.sandbox.cluster import SandboxCluster
from ringsnap.sandbox.services import toml_document
from ringsnap.sandbox.stack import CLUSTER_NAME, Stack, running_stack
from tests.support.acked_writes import backup_under_writes, ids_at_all
from tests.support.ring_runs import assert_proven, complete_backup, run_restore, started_at

pytestmark = pytest.mark.integration


# -- helpers -------------------------------------------------------------------------------------


def _image_digests(cluster: SandboxCluster) -> dict[str, str]:
    digests = {}
    for node in cluster.nodes:
        for lun in node.luns:
            with open(lun.image_path, "rb") as image:
                digests[lun.volume_name] = hashlib.file_digest(image, "sha256").hexdigest()
    return digests


def _stack(cluster: SandboxCluster, workdir: Path, vendor: str) -> Iterator[Stack]:
    with running_stack(cluster, workdir, vendor=vendor) as running:
        yield running
    cluster.wait_until_up_normal()


# Each vendor's simulator carries at least one whole-ring restore: FlashArray the clone and the
# revert back to the originals of a backup taken under load, ONTAP the faults (a revert failing
# part-way, a coordinator killed mid-restore) and one node alone, E-Series the tampered backup. The
# vendor-specific steps (revert, clone, their plans) are proven per driver by the conformance suite.
@pytest.fixture
def ontap(sandbox_cluster: SandboxCluster, tmp_path: Path) -> Iterator[Stack]:
    yield from _stack(sandbox_cluster, tmp_path / "stack", "ontap")


@pytest.fixture
def flasharray(sandbox_cluster: SandboxCluster, tmp_path: Path) -> Iterator[Stack]:
    yield from _stack(sandbox_cluster, tmp_path / "stack", "flasharray")


@pytest.fixture
def eseries(sandbox_cluster: SandboxCluster, tmp_path: Path) -> Iterator[Stack]:
    yield from _stack(sandbox_cluster, tmp_path / "stack", "eseries")


# -- whole ring ------------------------------------------------------------------------------------


def test_whole_ring_clone_then_revert_bring_back_exactly_the_backup(
    sandbox_cluster: SandboxCluster, flasharray: Stack
) -> None:
    """A clone restore leaves the original volumes untouched; a revert to the same backup then
    puts the ring back on them. Both bring back every row acknowledged before the backup and none
    begun after it."""
    config = flasharray.coordinator_config()
    backup, acked_before, begun_after = backup_under_writes(sandbox_cluster, config)
    originals: dict[str, str] = {}

    def on_step(node: str, step: str, message: str) -> None:
        # Every node is stopped and released before the arrays clone: the originals are final.
        if not node and step == "clone" and not originals:
            originals.update(_image_digests(sandbox_cluster))

    record = run_restore(config, backup.id, mode=RestoreMode.CLONE, on_step=on_step)

    assert_proven(record)
    assert originals and originals == _image_digests(sandbox_cluster)
    clones = {original: clone for _, original, clone in record.clones}
    assert set(clones) == set(originals)
    for node in record.nodes:
        assert all(v.attached_volume == clones[v.volume] for v in node.volumes)
    sandbox_cluster.refresh()
    ids = ids_at_all(sandbox_cluster)
    assert acked_before <= ids
    assert not (begun_after & ids)

    # Back onto the original volumes (a revert to the same backup), so later tests find them:
    # the revert brings the backup's rows back on them too, and none written after it.
    back = run_restore(config, backup.id)
    assert_proven(back)
    assert all(v.attached_volume in (v.volume, "") for n in back.nodes for v in n.volumes)
    sandbox_cluster.refresh()
    ids = ids_at_all(sandbox_cluster)
    assert acked_before <= ids, f"{len(acked_before - ids)} acknowledged rows did not come back"
    assert not (begun_after & ids), f"{len(begun_after & ids)} rows written after the backup"
    with Catalog(config.coordinator.catalog, exclusive=False) as catalog:
        stored = catalog.get_backup(backup.id)
        assert stored.verification is Verification.PROVEN
        assert stored.verified_by == back.id
        assert catalog.get_restore(back.id).state is RestoreState.PROVEN


# -- one node alone --------------------------------------------------------------------------------


def test_one_node_restored_alone_is_proven_and_told_to_repair(
    sandbox_cluster: SandboxCluster, ontap: Stack
) -> None:
    config = ontap.coordinator_config()
    backup = complete_backup(config)
    untouched = {n: started_at(sandbox_cluster, n) for n in ("node1", "node3")}

    record = run_restore(config, backup.id, nodes=("node2",))

    assert_proven(record)
    assert [n.name for n in record.nodes] == ["node2"]
    assert not record.whole_ring
    assert any("nodetool repair -full" in w for w in record.warnings)
    # The other nodes were never stopped.
    assert untouched == {n: started_at(sandbox_cluster, n) for n in ("node1", "node3")}
    sandbox_cluster.refresh()


# -- `ringsnap restore` while no coordinator daemon runs ----------------------------------------------

#: The `ringsnap` command of this environment.
RINGSNAP = str(Path(sys.executable).parent / "ringsnap")


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_ringsnap_restore_with_no_daemon_hosts_the_coordinator_and_proves_the_node(
    sandbox_cluster: SandboxCluster, ontap: Stack, tmp_path: Path
) -> None:
    """The incident command while the daemon is down: `ringsnap restore` hosts the daemon's own
    service in its process (the catalog's lock, the API on an ephemeral loopback port) and restores
    through it as through the daemon: the plan, progress, report and exit code, on the real ring."""
    data = ontap.coordinator_data()
    data["coordinator"]["listen"] = f"127.0.0.1:{_closed_port()}"  # no daemon answers there
    config_file = tmp_path / "coordinator.toml"
    config_file.write_text(toml_document(data, "ringsnap restore with no daemon"))
    backup = complete_backup(ontap.coordinator_config())
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINGSNAP_")}

    result = subprocess.run(
        [RINGSNAP, "restore", backup.id, "--nodes", "node2", "--yes", "--config", str(config_file)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        cwd="/",
    )

    said = f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.returncode == 0, said
    stderr = " ".join(result.stderr.split())  # the terminal's width wraps long lines
    assert "holds the catalog" not in stderr, said
    assert "started in this process (no coordinator daemon runs)" in stderr, said
    assert f"backup {backup.id} of cluster {CLUSTER_NAME}" in stderr, said
    assert "node2: verified done" in stderr, said
    assert re.findall(r"^\s+(node\d) (\w+)", result.stdout, re.MULTILINE) == [
        ("node2", "PROVEN")
    ], said
    with Catalog(Path(data["coordinator"]["catalog"]), exclusive=False) as catalog:
        (record,) = [r for r in catalog.list_restores(CLUSTER_NAME) if r.backup_id == backup.id]
    assert_proven(record)
    sandbox_cluster.refresh()


# -- a tampered backup fails its proof -------------------------------------------------------------


def _remove_from_snapshot(cluster: SandboxCluster, volume: str, pattern: str) -> list[str]:
    """Delete the files matching `pattern` from the newest snapshot image of `volume` (mounted by
    hand, as an intruder or a corrupting bug would)."""
    pool = cluster.pool_dir
    images = sorted((pool / "snapshots" / volume).glob("*.img"), key=lambda p: p.stat().st_mtime)
    image = images[-1]
    mount_point = Path(f"/tmp/ringsnap-tamper-{os.getpid()}")
    mount_point.mkdir(exist_ok=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(mount_point)], check=True)
    removed: list[str] = []
    try:
        for path in mount_point.glob(pattern):
            if path.is_file():
                removed.append(path.name)
                path.unlink()
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)
        mount_point.rmdir()
    return removed


def test_a_backup_tampered_with_fails_its_proof_naming_what_is_missing(
    sandbox_cluster: SandboxCluster, eseries: Stack
) -> None:
    config = eseries.coordinator_config()
    backup = complete_backup(config)
    node3 = sandbox_cluster.node("node3")
    # The canary table's SSTables, and the commit log that would replay its rows at start.
    removed = _remove_from_snapshot(
        sandbox_cluster, node3.data_lun.volume_name, "data/ringsnap/canary-*/*"
    )
    assert any(name.endswith("Data.db") for name in removed)
    assert _remove_from_snapshot(sandbox_cluster, node3.commitlog_lun.volume_name, "commitlog/*")

    record = run_restore(config, backup.id)

    assert record.state is RestoreState.NOT_PROVEN
    verdicts = {n.name: n for n in record.nodes}
    bad = verdicts["node3"]
    assert bad.verdict is NodeVerdict.NOT_PROVEN
    assert any("missing" in line and "ringsnap.canary" in line for line in bad.proof), bad.proof
    assert any("canary of backup" in line and "MISSING" in line for line in bad.proof), bad.proof
    assert verdicts["node1"].verdict is NodeVerdict.PROVEN
    with Catalog(config.coordinator.catalog, exclusive=False) as catalog:
        assert catalog.get_backup(backup.id).verification is Verification.FAILED


# -- faults ----------------------------------------------------------------------------------------


def test_an_unreachable_agent_refuses_the_plan_and_stops_nothing(
    sandbox_cluster: SandboxCluster, ontap: Stack
) -> None:
    backup = complete_backup(ontap.coordinator_config())
    data = ontap.coordinator_data()
    data["clusters"][0]["nodes"][1]["agent"] = "127.0.0.1:9"  # nothing answers there
    config = validate(data, CoordinatorConfig, source="<test>")

    async def plan() -> Any:
        async with open_restore_session(config, CLUSTER_NAME) as session:
            return await session.plan(RestoreRequest(backup.id, requested_by="test"))

    result = asyncio.run(plan())
    assert result.refused
    assert any("node2" in r and "agent" in r for r in result.refusals), result.refusals
    assert all(sandbox_cluster.node_running(n) for n in sandbox_cluster.nodes)


def test_a_revert_failing_part_way_leaves_a_record_with_the_next_step_and_resumes(
    sandbox_cluster: SandboxCluster, ontap: Stack
) -> None:
    config = ontap.coordinator_config()
    backup = complete_backup(config)
    ontap.array.server.faults.add(
        Fault(
            "status", method="PATCH", path=r"^/api/storage/volumes/", status=400, skip=2, count=50
        )
    )
    with pytest.raises(RestoreFailed) as failed:
        run_restore(config, backup.id)
    assert "revert failed" in str(failed.value)
    with Catalog(config.coordinator.catalog, exclusive=False) as catalog:
        (record,) = catalog.open_restores(CLUSTER_NAME)
    assert record.state is RestoreState.FAILED
    for node in record.nodes:
        assert node.step is RestoreStep.RELEASED
        assert "--resume " + record.id in node.next_step and "UNMOUNTED" in node.next_step
    assert not any(sandbox_cluster.node_running(n) for n in sandbox_cluster.nodes)

    ontap.array.server.faults.clear()

    async def resume() -> RestoreRecord:
        async with open_restore_session(config, CLUSTER_NAME) as session:
            return await session.resume(record.id)

    assert_proven(asyncio.run(resume()))
    sandbox_cluster.refresh()


_CHILD = """
import asyncio, json, sys
from ringsnap.config import validate
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.restore.plan import RestoreRequest
from ringsnap.coordinator.restore.session import open_restore_session

from ringsnap.logs import configure

configure(json=True, level="warning")  # logs to stderr; stdout carries the restore id
config = validate(json.load(open(sys.argv[1])), CoordinatorConfig, source="<child>")

async def main():
    async with open_restore_session(config, "sandbox") as session:
        plan = await session.plan(RestoreRequest(sys.argv[2], requested_by="child"))
        assert not plan.refused, plan.refusals
        print("restore-id", plan.restore_id, flush=True)
        await session.run(plan, "child")

asyncio.run(main())
"""


def test_a_coordinator_killed_mid_restore_is_resumed_to_proven(
    sandbox_cluster: SandboxCluster, ontap: Stack, tmp_path: Path
) -> None:
    config = ontap.coordinator_config()
    backup = complete_backup(config)
    config_file = tmp_path / "coordinator.json"
    config_file.write_text(json.dumps(ontap.coordinator_data()))
    # The array answers slowly, so the kill lands after the stop and before any start.
    ontap.array.server.faults.add(
        Fault("hang", method="PATCH", path=r"^/api/storage/volumes/", seconds=3, count=6)
    )
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(config_file), backup.id],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    line = child.stdout.readline()
    while line and not line.startswith("restore-id "):
        line = child.stdout.readline()
    restore_id = line.split()[-1]
    deadline = time.monotonic() + 300
    while True:
        with Catalog(config.coordinator.catalog, exclusive=False) as catalog:
            found = [r for r in catalog.list_restores(CLUSTER_NAME) if r.id == restore_id]
        if found and all(n.step is RestoreStep.RELEASED for n in found[0].nodes):
            break
        assert child.poll() is None, "the restore ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.2)
    child.send_signal(signal.SIGKILL)
    child.wait(30)
    assert not any(sandbox_cluster.node_running(n) for n in sandbox_cluster.nodes)

    async def resume() -> RestoreRecord:
        async with open_restore_session(config, CLUSTER_NAME) as session:
            return await session.resume(restore_id)

    final = asyncio.run(resume())
    assert_proven(final)
    with Catalog(config.coordinator.catalog, exclusive=False) as catalog:
        assert catalog.open_restores(CLUSTER_NAME) == []
    sandbox_cluster.refresh()
