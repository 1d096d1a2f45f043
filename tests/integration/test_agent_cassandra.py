"""The agent against the real 3-node Cassandra 5.0 test bed.

One agent per node runs on the host (in-process, real gRPC over 127.0.0.1 with mutual TLS) and
reaches its node through Jolokia, as the sandbox's agents do (`test_agent_jolokia` holds nodetool and
Jolokia side by side); the node's data and commit-log directories are bind-mounted into its container at the same host paths,
on their own loop-mounted ext4 LUNs. Everything here leaves the cluster as it found it: the test
keyspace is dropped, snapshots cleared, filesystems thawed, a stopped node started again.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from google.protobuf import duration_pb2

from ringsnap.api.v1 import agent_pb2, agent_pb2_grpc, types_pb2
from ringsnap.sandbox.agents import BackgroundAgent, TestPki, agent_config
from ringsnap.sandbox.cluster import NodeInfo, SandboxCluster
from tests.support.ring_runs import scratch_table

pytestmark = pytest.mark.integration

KEYSPACE = "agent_it"
TABLE = "events"
ROWS = 400
SSTABLE_FILE = re.compile(r"[a-z]{2}-[0-9a-z_]+-[a-z]+-.+")


@dataclass
class AgentUnderTest:
    node: NodeInfo
    agent: BackgroundAgent
    stub: agent_pb2_grpc.AgentServiceStub

    def manifest(self, **request: object) -> list[types_pb2.ManifestEntry]:
        entries: list[types_pb2.ManifestEntry] = []
        for batch in self.stub.GetManifest(agent_pb2.GetManifestRequest(**request), timeout=120):  # type: ignore[arg-type]
            entries.extend(batch.entries)
        return entries


@pytest.fixture(scope="module")
def agents(
    sandbox_cluster: SandboxCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, AgentUnderTest]]:
    pki = TestPki.create(tmp_path_factory.mktemp("pki"))
    running: dict[str, AgentUnderTest] = {}
    try:
        for node in sandbox_cluster.nodes:
            config = agent_config(
                pki,
                data_directories=[node.data_dir],
                commitlog_directory=node.commitlog_dir,
                state_directory=tmp_path_factory.mktemp(f"state-{node.name}"),
                nodetool=node.nodetool_argv(),
                cassandra={
                    "jolokia_url": node.jolokia_url,
                    "saved_caches_directory": str(node.saved_caches_dir),
                    "hints_directory": str(node.hints_dir),
                    "stop_command": ["docker", "stop", "--time", "60", node.container_name],
                    "start_command": ["docker", "start", node.container_name],
                },
            )
            agent = BackgroundAgent(config).start()
            stub = agent_pb2_grpc.AgentServiceStub(pki.channel(agent.address))
            running[node.name] = AgentUnderTest(node, agent, stub)
        yield running
    finally:
        for entry in running.values():
            entry.agent.stop()


@pytest.fixture(scope="module")
def table(sandbox_cluster: SandboxCluster) -> Iterator[str]:
    with scratch_table(sandbox_cluster, KEYSPACE, TABLE):
        yield f"{KEYSPACE}.{TABLE}"


def write_rows(cluster: SandboxCluster, first: int, count: int) -> None:
    from cassandra import ConsistencyLevel

    session = cluster.session()
    insert = session.prepare(f"INSERT INTO {KEYSPACE}.{TABLE} (id, body) VALUES (?, ?)")
    insert.consistency_level = ConsistencyLevel.ALL
    for row in range(first, first + count):
        session.execute(insert, (row, secrets.token_hex(200)))  # incompressible: real bytes on disk


def table_entries(entries: list[types_pb2.ManifestEntry]) -> list[types_pb2.ManifestEntry]:
    return [e for e in entries if e.keyspace == KEYSPACE and e.table == TABLE]


def flush_all(agents: dict[str, AgentUnderTest], **request: object) -> list[float]:
    with ThreadPoolExecutor(len(agents)) as pool:
        answers = list(
            pool.map(
                lambda a: a.stub.FlushMemtables(
                    agent_pb2.FlushMemtablesRequest(**request),  # type: ignore[arg-type]
                    timeout=300,
                ),
                agents.values(),
            )
        )
    return [answer.duration.ToTimedelta().total_seconds() for answer in answers]


# -- node info ---------------------------------------------------------------------------------------


def test_node_info_reports_identity_directories_and_filesystems(
    sandbox_cluster: SandboxCluster, agents: dict[str, AgentUnderTest]
) -> None:
    host_ids = {
        row.rpc_address: str(row.host_id)
        for row in sandbox_cluster.session().execute(
            "SELECT rpc_address, host_id FROM system.peers"
        )
    }
    seen_ids = set()
    for entry in agents.values():
        node = entry.node
        info = entry.stub.GetNodeInfo(agent_pb2.GetNodeInfoRequest(), timeout=120)
        assert info.cluster_name == sandbox_cluster.cluster_name
        assert info.cassandra_version.startswith("5.0")
        assert info.rpc_address == node.address
        assert len(info.tokens) == sandbox_cluster.num_tokens
        assert info.datacenter and info.rack
        seen_ids.add(info.host_id)
        if node.address in host_ids:
            assert host_ids[node.address] == info.host_id
        assert list(info.data_directories) == [str(node.data_dir)]
        assert info.commitlog_directory == str(node.commitlog_dir)
        by_role = {fs.role: fs for fs in info.filesystems}
        data = by_role[types_pb2.FILESYSTEM_ROLE_DATA]
        commitlog = by_role[types_pb2.FILESYSTEM_ROLE_COMMITLOG]
        assert data.mount_point == str(node.data_lun.mount_point)
        assert commitlog.mount_point == str(node.commitlog_lun.mount_point)
        assert data.loop_backing_file == str(node.data_lun.image_path)
        assert commitlog.loop_backing_file == str(node.commitlog_lun.image_path)
        assert data.fs_type == commitlog.fs_type == "ext4"
        assert data.device.startswith("/dev/loop") and data.device != commitlog.device
        assert set(data.cassandra_directories) == {
            str(node.data_dir),
            str(node.saved_caches_dir),
            str(node.hints_dir),
        }
    assert len(seen_ids) == 3


# -- flush and manifests -------------------------------------------------------------------------------


def test_flush_turns_written_rows_into_sstables_on_the_data_filesystem(
    sandbox_cluster: SandboxCluster, agents: dict[str, AgentUnderTest], table: str
) -> None:
    flush_all(agents, keyspace=KEYSPACE)  # start from nothing in the memtables
    before = {name: table_entries(a.manifest(keyspaces=[KEYSPACE])) for name, a in agents.items()}
    write_rows(sandbox_cluster, 0, ROWS)
    assert all(
        table_entries(a.manifest(keyspaces=[KEYSPACE])) == before[name]
        for name, a in agents.items()
    ), "rows reached SSTables before any flush"

    durations = flush_all(agents, keyspace=KEYSPACE, tables=[TABLE])
    assert all(seconds > 0 for seconds in durations)
    for name, entry in agents.items():
        node = entry.node
        new = [
            e for e in table_entries(entry.manifest(keyspaces=[KEYSPACE])) if e not in before[name]
        ]
        assert new, f"{name}: flush made no SSTable"
        data_device = os.stat(node.data_lun.mount_point).st_dev
        written = 0
        for sstable in new:
            assert sstable.complete, sstable.problem
            for component in sstable.components:
                path = node.data_dir / component.path
                assert os.stat(path).st_dev == data_device, f"{path} is not on the data LUN"
                if component.name == "Data.db":
                    written += component.size_bytes
        # 400 rows of 400 random hex characters: the bytes are in the SSTables now.
        assert written >= ROWS * 200, f"{name}: only {written} bytes of data in the new SSTables"


def independent_listing(data_dir: Path) -> dict[str, int]:
    """SSTable files under the live data directory, found with os.walk (not the agent's code)."""
    found: dict[str, int] = {}
    for directory, subdirectories, files in os.walk(data_dir):
        subdirectories[:] = [d for d in subdirectories if d not in ("snapshots", "backups")]
        for name in files:
            if SSTABLE_FILE.fullmatch(name):
                path = Path(directory) / name
                found[str(path.relative_to(data_dir))] = path.stat().st_size
    return found


def test_manifest_matches_the_files_on_disk(agents: dict[str, AgentUnderTest], table: str) -> None:
    for name, entry in agents.items():
        for _attempt in range(5):  # background compaction of system tables may change files
            manifest = entry.manifest()
            listed = {c.path: c.size_bytes for e in manifest for c in e.components}
            on_disk = independent_listing(entry.node.data_dir)
            if listed == on_disk:
                break
            time.sleep(2)
        assert listed == on_disk, f"{name}: manifest and disk differ: {set(listed) ^ set(on_disk)}"
        assert all(e.complete for e in manifest), [e.problem for e in manifest if not e.complete]
        for sstable in manifest:
            digest = next(c for c in sstable.components if c.name == "Digest.crc32")
            assert (
                entry.node.data_dir / digest.path
            ).read_text().strip() == sstable.data_digest_crc32
            assert sstable.data_digest_crc32.isdigit()
            assert {c.name for c in sstable.components} >= {"Data.db", "TOC.txt", "Statistics.db"}


def test_manifest_flags_an_sstable_with_a_removed_component(
    sandbox_cluster: SandboxCluster, agents: dict[str, AgentUnderTest], table: str, tmp_path: Path
) -> None:
    entry = agents["node1"]
    write_rows(sandbox_cluster, ROWS, 20)
    flush_all({"node1": entry}, keyspace=KEYSPACE, tables=[TABLE])
    victim = table_entries(entry.manifest(keyspaces=[KEYSPACE]))[-1]
    component = next(c for c in victim.components if c.name == "Filter.db")
    path = entry.node.data_dir / component.path
    aside = tmp_path / path.name
    shutil.copy2(path, aside)  # put back afterwards: the node keeps working on an intact SSTable
    path.unlink()
    try:
        flagged = next(
            e
            for e in table_entries(entry.manifest(keyspaces=[KEYSPACE]))
            if e.generation == victim.generation
        )
        assert not flagged.complete
        assert "Filter.db" in flagged.problem
        assert "Filter.db" not in {c.name for c in flagged.components}
        others = [
            e for e in entry.manifest(keyspaces=[KEYSPACE]) if e.generation != victim.generation
        ]
        assert all(e.complete for e in others)
    finally:
        shutil.copy2(aside, path)
    assert all(e.complete for e in table_entries(entry.manifest(keyspaces=[KEYSPACE])))


def snapshot_files(data_dir: Path, tag: str) -> tuple[set[str], set[str]]:
    """(SSTable files, other files) in every `<table>/snapshots/<tag>/` under data_dir."""
    sstables: set[str] = set()
    others: set[str] = set()
    for directory in data_dir.glob(f"*/*/snapshots/{tag}"):
        for path in directory.rglob("*"):
            if path.is_file():
                relative = str(path.relative_to(data_dir))
                (sstables if SSTABLE_FILE.fullmatch(path.name) else others).add(relative)
    return sstables, others


def test_native_snapshot_manifest_lists_exactly_the_snapshots_files(
    sandbox_cluster: SandboxCluster, agents: dict[str, AgentUnderTest], table: str
) -> None:
    entry = agents["node2"]
    tag = f"agent-it-{secrets.token_hex(4)}"
    write_rows(sandbox_cluster, 2 * ROWS, 50)
    created = entry.stub.CreateSnapshot(
        agent_pb2.CreateSnapshotRequest(tag=tag, keyspaces=[KEYSPACE]), timeout=300
    )
    assert created.duration.ToTimedelta().total_seconds() > 0
    try:
        manifest = entry.manifest(snapshot_tag=tag)
        sstables, others = snapshot_files(entry.node.data_dir, tag)
        listed = {c.path for e in manifest for c in e.components}
        assert listed == sstables and listed
        assert {Path(p).name for p in others} <= {"manifest.json", "schema.cql"}
        assert all(
            e.snapshot_tag == tag and e.keyspace == KEYSPACE and e.complete for e in manifest
        )
        for e in manifest:
            for c in e.components:
                assert (entry.node.data_dir / c.path).stat().st_size == c.size_bytes
        # The snapshot holds what the live table held (it flushed first): same SSTables, same digests.
        live = {
            (e.generation, e.data_digest_crc32)
            for e in table_entries(entry.manifest(keyspaces=[KEYSPACE]))
        }
        assert {(e.generation, e.data_digest_crc32) for e in table_entries(manifest)} <= live

        with pytest.raises(grpc.RpcError) as again:
            entry.stub.CreateSnapshot(
                agent_pb2.CreateSnapshotRequest(tag=tag, keyspaces=[KEYSPACE]), timeout=300
            )
        assert again.value.code() == grpc.StatusCode.ALREADY_EXISTS
    finally:
        entry.stub.ClearSnapshot(agent_pb2.ClearSnapshotRequest(tag=tag), timeout=300)
    assert snapshot_files(entry.node.data_dir, tag) == (set(), set())
    assert entry.manifest(snapshot_tag=tag) == []


def test_flush_of_an_unknown_keyspace_is_not_found(agents: dict[str, AgentUnderTest]) -> None:
    with pytest.raises(grpc.RpcError) as missing:
        agents["node1"].stub.FlushMemtables(
            agent_pb2.FlushMemtablesRequest(keyspace="no_such_keyspace"), timeout=300
        )
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    assert "no_such_keyspace" in (missing.value.details() or "")


# -- freezing a live node ----------------------------------------------------------------------------


def lease(seconds: float) -> duration_pb2.Duration:
    value = duration_pb2.Duration()
    value.FromNanoseconds(int(seconds * 1e9))
    return value


def timed_write(cluster: SandboxCluster, row: int, result: dict[str, float | str]) -> None:
    from cassandra import ConsistencyLevel

    session = cluster.session()
    insert = session.prepare(f"INSERT INTO {KEYSPACE}.{TABLE} (id, body) VALUES (?, ?)")
    insert.consistency_level = ConsistencyLevel.ALL
    started = time.monotonic()
    try:
        session.execute(insert, (row, "written during a freeze"), timeout=30)
        result["seconds"] = time.monotonic() - started
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"


def freeze_all(agents: dict[str, AgentUnderTest], operation: str, seconds: float) -> None:
    with ThreadPoolExecutor(len(agents)) as pool:
        list(
            pool.map(
                lambda a: a.stub.FreezeFilesystems(
                    agent_pb2.FreezeFilesystemsRequest(
                        run_id=operation, lease=lease(seconds), sync_first=True
                    ),
                    timeout=30,
                ),
                agents.values(),
            )
        )


def thaw_all(
    agents: dict[str, AgentUnderTest], operation: str
) -> list[agent_pb2.ThawFilesystemsResponse]:
    with ThreadPoolExecutor(len(agents)) as pool:
        return list(
            pool.map(
                lambda a: a.stub.ThawFilesystems(
                    agent_pb2.ThawFilesystemsRequest(run_id=operation), timeout=30
                ),
                agents.values(),
            )
        )


def test_freeze_stalls_a_cassandra_write_until_thaw(
    sandbox_cluster: SandboxCluster, agents: dict[str, AgentUnderTest], table: str
) -> None:
    write_rows(sandbox_cluster, 5000, 5)  # warm up the prepared statement and connections
    operation = f"it-freeze-{secrets.token_hex(3)}"
    freeze_all(agents, operation, 10)
    result: dict[str, float | str] = {}
    try:
        writer = threading.Thread(target=timed_write, args=(sandbox_cluster, 6000, result))
        writer.start()
        writer.join(0.6)
        assert writer.is_alive(), f"a CL=ALL write went through frozen commit logs: {result}"
    finally:
        responses = thaw_all(agents, operation)
    writer.join(30)
    assert "error" not in result, result
    assert float(result["seconds"]) >= 0.6
    for response in responses:
        assert all(fs.was_frozen for fs in response.filesystems) and len(response.filesystems) == 2


def test_lease_thaws_a_live_node_whose_coordinator_vanished(
    sandbox_cluster: SandboxCluster, agents: dict[str, AgentUnderTest], table: str
) -> None:
    operation = f"it-lease-{secrets.token_hex(3)}"
    freeze_all(agents, operation, 1.0)  # and then nobody thaws
    result: dict[str, float | str] = {}
    timed_write(sandbox_cluster, 7000, result)
    assert "error" not in result, (
        f"writes failed although the lease was below the timeout: {result}"
    )
    assert float(result["seconds"]) <= 1.0 + 1.0
    for response in thaw_all(agents, operation):
        assert response.lease_expired and not any(fs.was_frozen for fs in response.filesystems)


# -- stop and start -----------------------------------------------------------------------------------


def test_stop_and_start_cassandra(
    sandbox_cluster: SandboxCluster, agents: dict[str, AgentUnderTest]
) -> None:
    entry = agents["node3"]
    try:
        stopped = entry.stub.StopCassandra(agent_pb2.StopCassandraRequest(drain=True), timeout=300)
        assert stopped.duration.ToTimedelta().total_seconds() > 0
        assert not sandbox_cluster.node_running("node3")
        with pytest.raises(grpc.RpcError) as down:
            entry.stub.FlushMemtables(agent_pb2.FlushMemtablesRequest(), timeout=300)
        assert down.value.code() == grpc.StatusCode.UNAVAILABLE
        started = entry.stub.StartCassandra(
            agent_pb2.StartCassandraRequest(wait=duration_pb2.Duration(seconds=240)), timeout=600
        )
        assert started.duration.ToTimedelta().total_seconds() > 0
        assert sandbox_cluster.node_running("node3")
        info = entry.stub.GetNodeInfo(agent_pb2.GetNodeInfoRequest(), timeout=120)
        assert info.host_id
    finally:
        if not sandbox_cluster.node_running("node3"):
            sandbox_cluster.start_node("node3")
        sandbox_cluster.wait_until_up_normal()
