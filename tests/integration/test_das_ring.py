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

The same backup is exported to S3 (S3Proxy) and one of its tables restored, each through clones
the node's own agent makes beside the origin LVs (`CloneLocalSnapshot`), mounts and tears down.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cassandra import ConsistencyLevel
from cassandra.concurrent import execute_concurrent_with_args
from cassandra.query import SimpleStatement

from ringsnap.agent.s3.client import make_client
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.coordinator.assembly import load_config, open_coordinator
from ringsnap.coordinator.backup.model import BackupFailed
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.export.model import ExportRecord, ExportState
from ringsnap.coordinator.export.session import open_export_session
from ringsnap.coordinator.model import Backup, BackupState, RestoreRecord, Verification
from ringsnap.coordinator.runs.resources import ResourceType
from ringsnap.coordinator.scheduler import BackupRequest
from ringsnap.coordinator.table_restore.model import (
    TableRestoreRecord,
    TableRestoreRequest,
    TableRestoreState,
)
from ringsnap.mountinfo import read as read_mounts
from ringsnap.plugins.simulators.lunpool import loop_devices_of
from ringsnap.sandbox import services
from ringsnap.sandbox.cluster import SandboxCluster
from ringsnap.sandbox.das import DasNode, DasStack, running_das_stack
from ringsnap.sandbox.s3proxy import S3Server, running_s3proxy
from ringsnap.sandbox.stack import CLUSTER_NAME
from tests.support.acked_writes import KEYSPACE, backup_under_writes, ids_at_all
from tests.support.confined import (
    assert_confined,
    confinement,
    give_to_nobody,
    run_confined,
)
from tests.support.ring_runs import (
    assert_proven,
    complete_backup,
    create_keyspace,
    run_restore,
    run_table_restore,
)
from tests.support.s3_bucket import fresh_bucket

pytestmark = pytest.mark.integration

#: Imported by the confined process while still root (all else it imports as uid 65534).
PRELOAD = ("tests.integration.test_das_ring",)


#: The table restored from the DAS backup: written (at ALL) before the backup, so flushed by it.
RESTORED_TABLE = "das_table"
RESTORED_ROWS = 400


@pytest.fixture(scope="module")
def s3_server() -> Iterator[S3Server]:
    with running_s3proxy() as server:
        yield server


@pytest.fixture
def das(sandbox_cluster: SandboxCluster, s3_server: S3Server, tmp_path: Path) -> Iterator[DasStack]:
    # In the coordinator's directory: the confined coordinator reads them (it mirrors its
    # catalog to S3), and that directory is what it may reach (`coordinator_config_file`).
    keys = tmp_path / "coordinator" / "s3-keys"
    keys.mkdir(parents=True)
    s3 = fresh_bucket(s3_server, keys)
    with running_das_stack(sandbox_cluster, tmp_path / "das", s3=s3) as stack:
        yield stack
    sandbox_cluster.wait_until_up_normal()


def confined_backup(config_file: str) -> tuple[Backup, dict[str, object]]:
    """In the confined process: the coordinator's backup of the ring."""
    return complete_backup(load_config(config_file)), confinement()


def confined_restore(config_file: str, backup_id: str) -> tuple[RestoreRecord, dict[str, object]]:
    """In the confined process: plan and revert the whole ring to `backup_id`."""
    return run_restore(load_config(config_file), backup_id), confinement()


def confined_export(config_file: str, backup_id: str) -> tuple[ExportRecord, dict[str, object]]:
    """In the confined process: export `backup_id` to the config's S3, every node at once."""

    async def run() -> ExportRecord:
        config = load_config(config_file)
        with Catalog(config.coordinator.catalog) as catalog:
            async with open_export_session(config, CLUSTER_NAME, catalog=catalog) as session:
                return await session.export(backup_id, progress=None, parallel_nodes=3)

    return asyncio.run(run()), confinement()


def confined_table_restore(
    config_file: str, backup_id: str
) -> tuple[TableRestoreRecord, dict[str, object]]:
    """In the confined process: restore `RESTORED_TABLE` of `backup_id` in place."""
    request = TableRestoreRequest(
        backup_id=backup_id, keyspace=KEYSPACE, tables=(RESTORED_TABLE,), requested_by="test"
    )
    return run_table_restore(load_config(config_file), request), confinement()


def write_restored_table(cluster: SandboxCluster) -> None:
    """`RESTORED_TABLE` with `RESTORED_ROWS` rows, each acknowledged by every replica."""
    session = cluster.session()
    create_keyspace(session, KEYSPACE)
    session.execute(f"DROP TABLE IF EXISTS {KEYSPACE}.{RESTORED_TABLE}", timeout=120)
    session.execute(
        f"CREATE TABLE {KEYSPACE}.{RESTORED_TABLE} (id int PRIMARY KEY, v text)", timeout=120
    )
    insert = session.prepare(f"INSERT INTO {KEYSPACE}.{RESTORED_TABLE} (id, v) VALUES (?, ?)")
    insert.consistency_level = ConsistencyLevel.ALL
    execute_concurrent_with_args(
        session, insert, [(i, f"das-{i}") for i in range(RESTORED_ROWS)], concurrency=32
    )


def restored_ids(cluster: SandboxCluster) -> set[int]:
    statement = SimpleStatement(
        f"SELECT id FROM {KEYSPACE}.{RESTORED_TABLE}", consistency_level=ConsistencyLevel.ALL
    )
    return {row.id for row in cluster.session().execute(statement, timeout=60)}


def s3_keys(s3: dict[str, Any]) -> list[str]:
    settings = S3Settings.model_validate(s3)
    client = make_client(settings)
    return [
        item["Key"]
        for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=settings.bucket, Prefix=settings.prefix
        )
        for item in page.get("Contents", ())
    ]


def assert_nothing_left(
    das: DasStack, config: CoordinatorConfig, lvs: dict[str, list[str]]
) -> None:
    """No clone LV on any node (its LVs are `lvs`, as the backup left them), no clone mounted,
    no clone in the ledger."""
    for node in das.nodes.values():
        assert sorted(node.emulator.names(node.vg)) == lvs[node.name], f"{node.name}: left over"
    mounted = [entry.mount_point for entry in read_mounts()]
    assert not [m for m in mounted if "/clones/" in str(m)], mounted
    with Catalog(config.coordinator.catalog, exclusive=False) as catalog:
        left = [e.resource for e in catalog.resources() if e.resource.type is ResourceType.CLONE]
        assert not left, left
        assert not catalog.pending_cleanups()


def made_by_its_agent(das: DasStack, node: str, clones: list[str]) -> None:
    """Each of `clones` ("vg/lv") made by `node`'s own lvm2, in its own VG: beside the origin."""
    das_node = das.nodes[node]
    made = {argv[argv.index("-n") + 1] for argv in das_node.lvm2.ran("lvcreate")}
    for clone in clones:
        vg, lv = clone.split("/")
        assert vg == das_node.vg and lv in made, (node, clone, sorted(made))


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

    config = das.coordinator_config(directory)
    write_restored_table(sandbox_cluster)
    started = time.monotonic()
    backup, acked_before, begun_after = backup_under_writes(sandbox_cluster, config, confined_take)
    lvs = {n.name: sorted(n.emulator.names(n.vg)) for n in das.nodes.values()}

    # The backup's copy off the nodes: each node's clones made, mounted and removed by its agent.
    began = time.monotonic()
    export, during_export = run_confined(
        confined_export, str(config_file), backup.id, reachable=[directory], preload=PRELOAD
    )
    exported_in = time.monotonic() - began
    assert export.state is ExportState.SUCCEEDED, (export.error, export.nodes)
    assert export.mirrored
    keys = s3_keys(das.s3 or {})
    for copied in export.nodes:
        assert copied.exported and not copied.clones_left, copied
        assert copied.files_uploaded > 0 and copied.commitlog_segments > 0, copied
        assert copied.manifest_key in keys, (copied.manifest_key, keys)
        assert {c.array for c in copied.clones} == {das.nodes[copied.name].array}, copied.clones
        made_by_its_agent(das, copied.name, [c.clone for c in copied.clones])
    assert_nothing_left(das, config, lvs)

    # One table truncated, then restored in place from the backup through the same clones.
    session = sandbox_cluster.session()
    session.execute(f"TRUNCATE {KEYSPACE}.{RESTORED_TABLE}", timeout=120)
    assert not restored_ids(sandbox_cluster)
    began = time.monotonic()
    table, during_table = run_confined(
        confined_table_restore, str(config_file), backup.id, reachable=[directory], preload=PRELOAD
    )
    table_in = time.monotonic() - began
    assert table.state is TableRestoreState.SUCCEEDED, (table.error, table.verification)
    assert restored_ids(sandbox_cluster) == set(range(RESTORED_ROWS))
    assert table.clones and all(c.clone and c.deleted for c in table.clones), table.clones
    assert {c.array for c in table.clones} == {n.array for n in das.nodes.values()}
    for clone in table.clones:
        assert clone.array == das.nodes[clone.node].array, clone
        made_by_its_agent(das, clone.node, [clone.clone])
    assert_nothing_left(das, config, lvs)

    # The damage: every row gone (TRUNCATE reaches every replica), on top of the later writes.
    sandbox_cluster.session().execute(f"TRUNCATE {KEYSPACE}.rows", timeout=120)
    assert not ids_at_all(sandbox_cluster)

    record, during_restore = run_confined(
        confined_restore, str(config_file), backup.id, reachable=[directory], preload=PRELOAD
    )
    elapsed = time.monotonic() - started

    for during in (*seen, during_export, during_table, during_restore):
        assert_confined(during)
    assert_proven(record)
    assert {ref.array for ref in backup.snapshots} == {n.array for n in das.nodes.values()}
    assert all(ref.driver == "agent-lvm" for ref in backup.snapshots)
    for node in das.nodes.values():
        # Each node's own agent ran every lvm2 command of its snapshots: one per LV, each merged.
        ref = next(ref for ref in backup.snapshots if ref.array == node.array)
        made = [argv[argv.index("-n") + 1] for argv in node.lvm2.ran("lvcreate")]
        members = sorted(m.snapshot_id.split("/")[-1] for m in ref.members)
        # The export's and the table restore's clones were made too (named for their runs).
        assert sorted(name for name in made if name in members) == members, made
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
    print(
        f"DAS ring backup, export ({exported_in:.0f} s), table restore ({table_in:.0f} s),"
        f" restore: {elapsed:.0f} s (load {os.getloadavg()[0]:.2f})"
    )


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
