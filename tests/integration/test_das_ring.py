"""The sandbox's Cassandra ring on direct-attached storage, backed up and restored by a
coordinator confined as its unit runs it.

Each node's data and commit log are LVs of its own lvm2 (the 2.03.16 emulator: its LUN images
adopted as a thick data LV and a thin commit-log LV, `sandbox.das`), snapshotted, merged back and
released by that node's agent (`[lvm]`, `[volumes]` hooks). The coordinator (driver `agent-lvm`)
runs in a process of its own: its own mount namespace, a /dev without the nodes' devices, uid
65534, every capability dropped, no_new_privs (`tests.support.confined`). It reaches the agents
over mutual TLS and Cassandra over CQL, and nothing else: no lvm2, no device, no mount.

Real Cassandra, real agents, real filesystems; the proof is the one of array restores: canaries
and manifests per node, and the rows acknowledged before the backup (none begun after it).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ringsnap.coordinator.assembly import load_config, open_coordinator
from ringsnap.coordinator.backup.model import BackupFailed
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.model import Backup, BackupState, RestoreRecord, Verification
from ringsnap.coordinator.scheduler import BackupRequest
from ringsnap.mountinfo import read as read_mounts
from ringsnap.plugins.simulators.lunpool import loop_devices_of
from ringsnap.sandbox import services
from ringsnap.sandbox.cluster import SandboxCluster
from ringsnap.sandbox.das import DasNode, DasStack, running_das_stack
from ringsnap.sandbox.stack import CLUSTER_NAME
from tests.support.acked_writes import KEYSPACE, backup_under_writes, ids_at_all
from tests.support.confined import (
    assert_confined,
    confinement,
    give_to_nobody,
    run_confined,
)
from tests.support.ring_runs import assert_proven, complete_backup, run_restore

pytestmark = pytest.mark.integration

#: Imported by the confined process while still root (all else it imports as uid 65534).
PRELOAD = ("tests.integration.test_das_ring",)


@pytest.fixture
def das(sandbox_cluster: SandboxCluster, tmp_path: Path) -> Iterator[DasStack]:
    with running_das_stack(sandbox_cluster, tmp_path / "das") as stack:
        yield stack
    sandbox_cluster.wait_until_up_normal()


def confined_backup(config_file: str) -> tuple[Backup, dict[str, object]]:
    """In the confined process: the coordinator's backup of the ring."""
    return complete_backup(load_config(config_file)), confinement()


def confined_restore(config_file: str, backup_id: str) -> tuple[RestoreRecord, dict[str, object]]:
    """In the confined process: plan and revert the whole ring to `backup_id`."""
    return run_restore(load_config(config_file), backup_id), confinement()


def coordinator_config_file(das: DasStack, directory: Path) -> Path:
    """The coordinator's config, catalog and client key in `directory`, owned by uid 65534 (as
    /etc/ringsnap and /var/lib/ringsnap belong to the unit's user)."""
    config_file = directory / "coordinator.toml"
    data = das.coordinator_data(directory)
    config_file.write_text(services.toml_document(data, "the DAS ring's coordinator"))
    give_to_nobody(directory)
    return config_file


def lun_inodes(cluster: SandboxCluster) -> dict[str, int]:
    return {lun.volume_name: lun.image_path.stat().st_ino for n in cluster.nodes for lun in n.luns}


def test_a_das_ring_is_backed_up_under_load_and_restored_proven_by_an_unprivileged_coordinator(
    sandbox_cluster: SandboxCluster, das: DasStack, tmp_path: Path
) -> None:
    directory = tmp_path / "coordinator"
    config_file = coordinator_config_file(das, directory)
    inodes = lun_inodes(sandbox_cluster)
    seen: list[dict[str, object]] = []

    def confined_take(_config: CoordinatorConfig) -> Backup:
        backup, during = run_confined(
            confined_backup, str(config_file), reachable=[directory], preload=PRELOAD
        )
        seen.append(during)
        return backup

    started = time.monotonic()
    backup, acked_before, begun_after = backup_under_writes(
        sandbox_cluster, das.coordinator_config(directory), confined_take
    )
    # The damage: every row gone (TRUNCATE reaches every replica), on top of the later writes.
    sandbox_cluster.session().execute(f"TRUNCATE {KEYSPACE}.rows", timeout=120)
    assert not ids_at_all(sandbox_cluster)

    record, during_restore = run_confined(
        confined_restore, str(config_file), backup.id, reachable=[directory], preload=PRELOAD
    )
    elapsed = time.monotonic() - started

    for during in (*seen, during_restore):
        assert_confined(during)
    assert_proven(record)
    assert {ref.array for ref in backup.snapshots} == {n.array for n in das.nodes.values()}
    assert all(ref.driver == "agent-lvm" for ref in backup.snapshots)
    for node in das.nodes.values():
        # Each node's own agent ran every lvm2 command of its snapshots: one per LV, each merged.
        ref = next(ref for ref in backup.snapshots if ref.array == node.array)
        made = [argv[argv.index("-n") + 1] for argv in node.lvm2.ran("lvcreate")]
        assert sorted(made) == sorted(m.snapshot_id.split("/")[-1] for m in ref.members), made
        merged = [argv[-1] for argv in node.lvm2.ran("lvconvert")]
        assert sorted(merged) == sorted(m.snapshot_id for m in ref.members), merged
        assert sorted(node.emulator.names(node.vg)) == ["commitlog", "data", "pool"], "left over"
    sandbox_cluster.refresh()
    ids = ids_at_all(sandbox_cluster)
    assert acked_before <= ids, f"{len(acked_before - ids)} acknowledged rows did not come back"
    assert not (begun_after & ids), f"{len(begun_after & ids)} rows written after the backup"
    # The merges went into the LUN images themselves, which are mounted again under the nodes.
    assert lun_inodes(sandbox_cluster) == inodes
    mounted = {entry.mount_point for entry in read_mounts()}
    for info in sandbox_cluster.nodes:
        for lun in info.luns:
            assert str(lun.mount_point) in mounted, f"{lun.mount_point} is not mounted"
            assert len(loop_devices_of(lun.image_path)) == 1, f"{lun.volume_name} attached twice"
    with Catalog(load_config(config_file).coordinator.catalog, exclusive=False) as catalog:
        stored = catalog.get_backup(backup.id)
        assert stored.verification is Verification.PROVEN
        assert stored.verified_by == record.id
    print(f"DAS ring backup + restore: {elapsed:.0f} s (load {os.getloadavg()[0]:.2f})")


# -- an agent killed after the others snapshotted -------------------------------------------------


def snapshots_of(node: DasNode) -> list[str]:
    """The node's LVs that are snapshots (anything but its two LVs and the thin pool)."""
    return sorted(set(node.emulator.names(node.vg)) - {"data", "commitlog", "pool"})


def kill_after_the_others_snapshotted(das: DasStack, victim: str) -> threading.Event:
    """The victim's agent is killed right after its own lvcreate (its snapshot is made, its
    answer never sent), once every other node has snapshotted; set when it is dead."""
    killed = threading.Event()
    others = [n for n in das.nodes.values() if n.name != victim]

    def after(argv: tuple[str, ...]) -> None:
        if argv[0] != "lvcreate" or killed.is_set():
            return
        deadline = time.monotonic() + 30
        while not all(n.lvm2.ran("lvcreate") for n in others) and time.monotonic() < deadline:
            time.sleep(0.05)

        def kill() -> None:
            das.kill_agent(victim)
            killed.set()

        # From a thread of its own: this is the dying agent's worker thread.
        threading.Thread(target=kill).start()
        killed.wait(30)

    das.nodes[victim].lvm2.after = after
    return killed


def writable_within(path: Path, seconds: float) -> bool:
    """A file written and fsynced under `path` within `seconds` (a frozen filesystem blocks it)."""
    done = threading.Event()

    def write() -> None:
        with open(path / "ringsnap-thaw-probe", "wb") as handle:
            handle.write(b"thawed")
            os.fsync(handle.fileno())
        os.unlink(path / "ringsnap-thaw-probe")
        done.set()

    threading.Thread(target=write, daemon=True).start()
    return done.wait(seconds)


def left_by_name(config: CoordinatorConfig, array: str) -> list[str]:
    """What the catalog keeps to clean up on `array`: pending cleanups and ledger entries."""
    with Catalog(config.coordinator.catalog, exclusive=False) as catalog:
        pending = [c.name for c in catalog.pending_cleanups() if c.array == array]
        ledger = [
            e.resource.name or e.resource.name_hint
            for e in catalog.resources()
            if e.resource.array == array
        ]
    return pending + ledger


def test_an_agent_killed_after_the_others_snapshotted_fails_thaws_and_its_snapshot_is_retried(
    sandbox_cluster: SandboxCluster, das: DasStack, tmp_path: Path
) -> None:
    config = das.coordinator_config(tmp_path / "coordinator")
    victim = das.nodes["node3"]
    killed = kill_after_the_others_snapshotted(das, victim.name)

    async def backup() -> Backup:
        async with open_coordinator(config, source="<test>") as coordinator:
            return await coordinator.backup(BackupRequest(CLUSTER_NAME, trigger="test"))

    with pytest.raises(BackupFailed) as raised:
        asyncio.run(backup())

    assert killed.is_set(), "the victim's agent was never killed"
    assert victim.array in str(raised.value), str(raised.value)
    with Catalog(config.coordinator.catalog, exclusive=False) as catalog:
        latest = catalog.latest_backup(CLUSTER_NAME)
        assert latest is not None
        failed = catalog.get_backup(latest.id)
    assert failed.state is BackupState.FAILED, failed
    assert victim.array in (failed.error or ""), failed.error
    # Every node thaws: the survivors at once, the victim when its freeze lease ends.
    lease = config.coordinator.lease_seconds
    for node in das.nodes.values():
        for lun in node.info.luns:
            assert writable_within(lun.mount_point, lease + 30), f"{lun.mount_point} still frozen"
    # The survivors' snapshots are deleted; the victim's (made, never answered) is left by name.
    for node in das.nodes.values():
        if node is not victim:
            assert node.lvm2.ran("lvcreate"), f"{node.name} never snapshotted"
            assert snapshots_of(node) == [], f"{node.name}: snapshots of the failed run left"
    made = snapshots_of(victim)
    assert made, "the victim's agent died before its snapshot was made"
    left = left_by_name(config, victim.array)
    assert left, f"the victim's snapshots {made} are nowhere in the catalog"
    assert all(failed.id in name for name in left), left

    # The agent comes back; the retry deletes its snapshot through it.
    das.restart_agent(victim.name)

    async def retry() -> None:
        async with open_coordinator(config, source="<test>") as coordinator:
            await coordinator.run_pending_cleanups()

    asyncio.run(retry())
    assert snapshots_of(victim) == [], "the retry left the victim's snapshots"
    assert left_by_name(config, victim.array) == []
    assert [argv for argv in victim.lvm2.ran("lvremove") if failed.id in " ".join(argv)]
