"""The test bed itself: a real 3-node cluster through testcontainers, on loop-mounted LUNs in an
XFS reflink pool, seen by the driver and nodetool, and torn down without leftovers."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from ringsnap.sandbox.cluster import NodeInfo, SandboxCluster
from ringsnap.sandbox.errors import SandboxError
from ringsnap.sandbox.instance import LABEL_INSTANCE, sandbox_root
from ringsnap.sandbox.pool import mount_lun, unmount_lun

pytestmark = pytest.mark.integration

KEYSPACE = "ringsnap_testbed"
ROWS = 300


def sh(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


def findmnt(path: Path) -> dict[str, str]:
    """The filesystem a path lives on, as util-linux (not our own parser) reports it."""
    out = json.loads(
        sh("findmnt", "--json", "--output", "SOURCE,FSTYPE,TARGET", "--target", str(path))
    )
    entry: dict[str, str] = out["filesystems"][0]
    return entry


def loop_back_file(device: str) -> Path:
    out = json.loads(sh("losetup", "--list", "--json", "--output", "NAME,BACK-FILE", device))
    return Path(out["loopdevices"][0]["back-file"])


def instance_residue(instance: str) -> tuple[list[str], list[str], list[str]]:
    """Containers, mounts and loop devices of an instance, found with docker/findmnt/losetup."""
    root = sandbox_root() / instance
    containers = sh(
        "docker", "ps", "--all", "--quiet", "--filter", f"label={LABEL_INSTANCE}={instance}"
    ).split()
    mounts = [
        line
        for line in sh("findmnt", "--list", "--noheadings", "--output", "TARGET").splitlines()
        if line == str(root) or line.startswith(f"{root}/")
    ]
    loops = [
        line
        for line in sh("losetup", "--list", "--noheadings", "--output", "BACK-FILE").splitlines()
        if line.strip().startswith(f"{root}/")
    ]
    return containers, mounts, loops


def test_all_nodes_up_normal_seen_by_driver_and_nodetool(sandbox_cluster: SandboxCluster) -> None:
    addresses = set(sandbox_cluster.addresses)
    assert len(addresses) == 3
    assert all(a.startswith("127.") for a in addresses)

    session = sandbox_cluster.session()
    hosts = session.cluster.metadata.all_hosts()
    assert {h.address for h in hosts} == addresses
    assert all(h.is_up for h in hosts)
    local = session.execute("SELECT cluster_name FROM system.local").one()
    assert local.cluster_name == sandbox_cluster.cluster_name

    for node in sandbox_cluster.nodes:
        ring = sandbox_cluster.ring(node)
        assert set(ring) == addresses, f"{node.name} sees {ring}"
        assert all(member.up_normal for member in ring.values()), f"{node.name} sees {ring}"


def test_rows_at_rf3_flush_to_sstables_on_each_nodes_own_loop_mounted_filesystem(
    sandbox_cluster: SandboxCluster,
) -> None:
    from cassandra import ConsistencyLevel
    from cassandra.concurrent import execute_concurrent_with_args
    from cassandra.query import SimpleStatement

    session = sandbox_cluster.session()
    session.execute(
        f"CREATE KEYSPACE IF NOT EXISTS {KEYSPACE} WITH replication = "
        "{'class': 'NetworkTopologyStrategy', 'datacenter1': 3}"
    )
    session.execute(
        f"CREATE TABLE IF NOT EXISTS {KEYSPACE}.rows (id int PRIMARY KEY, payload text)"
    )
    insert = session.prepare(f"INSERT INTO {KEYSPACE}.rows (id, payload) VALUES (?, ?)")
    insert.consistency_level = ConsistencyLevel.ALL
    execute_concurrent_with_args(
        session, insert, [(i, f"row-{i}" * 20) for i in range(ROWS)], concurrency=32
    )

    for node in sandbox_cluster.nodes:
        sandbox_cluster.nodetool(node, "flush", KEYSPACE)

    pool = findmnt(sandbox_cluster.pool_dir)
    assert pool["fstype"] == "xfs" and pool["target"] == str(sandbox_cluster.pool_dir)
    assert "reflink=1" in sh("xfs_info", str(sandbox_cluster.pool_dir))

    devices = set()
    for node in sandbox_cluster.nodes:
        sstables = sorted(node.data_dir.glob(f"{KEYSPACE}/rows-*/*-Data.db"))
        assert sstables, f"no SSTable on {node.name} under {node.data_dir}"
        fs = findmnt(sstables[0])
        assert fs["target"] == str(node.data_lun.mount_point)
        assert fs["fstype"] == "ext4"
        assert fs["source"].startswith("/dev/loop")
        backing = loop_back_file(fs["source"])
        assert backing == node.data_lun.image_path
        assert backing.parent == sandbox_cluster.pool_dir / "luns"
        assert backing.name == f"{node.data_lun.volume_name}.img"
        devices.add(fs["source"])
        # The commit log is on its own LUN, not the data one.
        assert findmnt(node.commitlog_dir)["target"] == str(node.commitlog_lun.mount_point)
        # The node inside its container uses the very same path.
        sh("docker", "exec", node.container_name, "test", "-f", str(sstables[0]))
    assert len(devices) == 3

    count = session.execute(
        SimpleStatement(
            f"SELECT count(*) FROM {KEYSPACE}.rows", consistency_level=ConsistencyLevel.ALL
        )
    ).one()
    assert count[0] == ROWS


def test_a_node_comes_back_after_stop_and_remount_of_its_luns(
    sandbox_cluster: SandboxCluster,
) -> None:
    """What a restore does to one node: stop it, unmount and mount its LUNs, start it again."""
    from cassandra import ConsistencyLevel
    from cassandra.query import SimpleStatement

    node: NodeInfo = sandbox_cluster.node("node3")
    sandbox_cluster.stop_node(node)
    assert not sandbox_cluster.node_running(node)
    try:
        for lun in node.luns:
            unmounted = unmount_lun(lun)
            assert unmounted.loop_device is None
            assert findmnt(lun.mount_point)["target"] != str(lun.mount_point)
            assert mount_lun(unmounted).loop_device is not None
    finally:
        sandbox_cluster.start_node(node)
    assert sandbox_cluster.ring("node1")[node.address].up_normal
    refreshed = sandbox_cluster.node("node3")
    assert refreshed.data_lun.loop_device == findmnt(refreshed.data_lun.mount_point)["source"]
    session = sandbox_cluster.session()
    row = session.execute(
        SimpleStatement(
            f"SELECT payload FROM {KEYSPACE}.rows WHERE id = 7",
            consistency_level=ConsistencyLevel.ALL,
        )
    ).one()
    assert row is not None and row.payload == "row-7" * 20


def test_one_node_instance_tears_down_without_leftovers(sandbox_instance_name: str) -> None:
    instance = f"{sandbox_instance_name}-solo"
    cluster = SandboxCluster(instance, nodes=1)
    with cluster:
        node = cluster.node(1)
        assert cluster.ring(node)[node.address].up_normal
        containers, mounts, loops = instance_residue(instance)
        assert len(containers) == 1
        assert len(mounts) == 3  # pool + data LUN + commit-log LUN
        assert len(loops) == 3
    assert instance_residue(instance) == ([], [], [])
    assert not (sandbox_root() / instance).exists()


def test_a_start_that_fails_half_way_leaves_nothing_behind(sandbox_instance_name: str) -> None:
    instance = f"{sandbox_instance_name}-fail"
    # One second is far too short for Cassandra: the wait for `Startup complete` fails after the
    # pool, the LUNs and the container exist.
    with pytest.raises((SandboxError, TimeoutError)):
        SandboxCluster(instance, nodes=1, start_timeout=1).start()
    assert instance_residue(instance) == ([], [], [])
    assert not (sandbox_root() / instance).exists()


def test_cli_status_shows_the_running_cluster(sandbox_cluster: SandboxCluster) -> None:
    from typer.testing import CliRunner

    from ringsnap.sandbox.cli import app

    result = CliRunner().invoke(
        app, ["status", "--instance", sandbox_cluster.instance], terminal_width=200
    )
    assert result.exit_code == 0, result.output
    for node in sandbox_cluster.nodes:
        assert node.address in result.output
        assert node.data_lun.volume_name in result.output
    assert len(re.findall(r"\bUN\b", result.output)) == 3, result.output
