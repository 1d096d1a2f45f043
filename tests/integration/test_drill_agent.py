"""The drill host's agent on the real sandbox: a backed-up node's snapshot cloned by the ONTAP
simulator (through the driver's `clone`), the clones attached and mounted by MountClones (the pool's
loop-device hook), the node started by StartDrill in a network namespace of its own on the
production node's own address, PROVEN; the clones' manifest equal to the backup's; the live ring
sees no new endpoint and no host id change before, during and after; nothing left behind. And a
clone whose SSTable was damaged by hand fails the drill at the digest step, naming the file.

Real Cassandra on both sides (the live ring in containers, the drill node a real CassandraDaemon of
the host's Java), the real agent process over mutual TLS, the agent contract called directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import re
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
from cassandra.concurrent import execute_concurrent_with_args

from ringsnap.agent.drill import netns
from ringsnap.api.v1 import agent_pb2, agent_pb2_grpc
from ringsnap.coordinator.assembly import open_coordinator
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.model import Backup, BackupState
from ringsnap.coordinator.scheduler import BackupRequest
from ringsnap.plugins.api import Cloneable
from ringsnap.plugins.registry import build_driver
from ringsnap.plugins.types import Volume
from ringsnap.sandbox.agents import BackgroundAgent
from ringsnap.sandbox.cluster import SandboxCluster
from ringsnap.sandbox.stack import ARRAY_NAME, CLUSTER_NAME, Stack, running_stack
from ringsnap.wire import duration

pytestmark = pytest.mark.integration

KEYSPACE = "drill_agent_test"
ROWS = 2000
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@dataclasses.dataclass
class Bed:
    cluster: SandboxCluster
    stack: Stack
    backup: Backup
    stub: agent_pb2_grpc.AgentServiceStub
    driver: Any

    @property
    def drill_root(self) -> Path:
        return self.stack.workdir / "drill-host"


@pytest.fixture(scope="module")
def bed(sandbox_cluster: SandboxCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bed]:
    workdir = tmp_path_factory.mktemp("drill-agent")
    with running_stack(sandbox_cluster, workdir / "stack", drill_host=True) as stack:
        session = sandbox_cluster.session()
        session.execute(
            f"CREATE KEYSPACE IF NOT EXISTS {KEYSPACE} WITH replication ="
            " {'class': 'SimpleStrategy', 'replication_factor': 3}"
        )
        session.execute(f"CREATE TABLE IF NOT EXISTS {KEYSPACE}.rows (id int PRIMARY KEY, v text)")
        insert = session.prepare(f"INSERT INTO {KEYSPACE}.rows (id, v) VALUES (?, ?)")
        execute_concurrent_with_args(session, insert, [(i, "x" * 200) for i in range(ROWS)])
        config = stack.coordinator_config()

        async def backup() -> Backup:
            async with open_coordinator(config, source="<test>") as coordinator:
                return await coordinator.backup(BackupRequest(CLUSTER_NAME, trigger="test"))

        made = asyncio.run(backup())
        assert made.state is BackupState.COMPLETE, made.error
        assert stack.drill_agent is not None
        driver = build_driver(ARRAY_NAME, stack.array.table, source="<test>")
        with stack.pki.channel(stack.drill_agent.address) as channel:
            yield Bed(
                sandbox_cluster, stack, made, agent_pb2_grpc.AgentServiceStub(channel), driver
            )
        driver.close()
    sandbox_cluster.wait_until_up_normal()


# -- helpers -------------------------------------------------------------------------------------


def _node_facts(bed: Bed, name: str) -> Any:
    agent = bed.stack.agents[name]
    assert isinstance(agent, BackgroundAgent)
    return agent.call(agent.server.agent.node_info())


def _clone(bed: Bed, name: str, suffix: str) -> list[tuple[str, Volume]]:
    """(role, clone) for each volume of the node, made by the driver from the backup's snapshot."""
    node = bed.backup.node(name)
    (ref,) = bed.backup.snapshots
    roles = {volume.volume: volume.role.value for volume in node.volumes}
    members = tuple(m for m in ref.members if m.volume.name in roles)
    assert isinstance(bed.driver, Cloneable)
    clones = bed.driver.clone(dataclasses.replace(ref, members=members), suffix)
    return [(roles[m.volume.name], c) for m, c in zip(members, clones, strict=True)]


def _mount(bed: Bed, drill_id: str, name: str, clones: Sequence[tuple[str, Volume]]) -> Any:
    node = bed.cluster.node(name)
    sources = {
        "data": str(node.data_lun.mount_point),
        "commitlog": str(node.commitlog_lun.mount_point),
    }
    return bed.stub.MountClones(
        agent_pb2.MountClonesRequest(
            purpose_id=drill_id,
            volumes=[
                agent_pb2.CloneVolume(
                    role=role,
                    array=ARRAY_NAME,
                    volume=clone.name,
                    wwn=clone.wwn,
                    source_mount_point=sources[role],
                )
                for role, clone in clones
            ],
        ),
        timeout=300,
    )


def _start(bed: Bed, drill_id: str, name: str) -> agent_pb2.DrillStatus:
    facts = _node_facts(bed, name)
    node = bed.backup.node(name)
    return bed.stub.StartDrill(
        agent_pb2.StartDrillRequest(
            drill_id=drill_id,
            node=name,
            cluster_name=facts.cluster_name,
            address=bed.cluster.node(name).address,
            host_id=node.host_id,
            data_directories=list(facts.data_directories),
            commitlog_directory=facts.commitlog_directory,
            canary_keyspace="ringsnap",
            canary_key=node.canary_id,
            backup_id=bed.backup.id,
            deadline=duration(900),
            num_tokens=len(facts.tokens),
            datacenter=facts.datacenter,
            rack=facts.rack,
        ),
        timeout=60,
    )


def _ring_views(cluster: SandboxCluster) -> dict[str, object]:
    """The live ring as nodetool status, gossipinfo (both from the first node) and the driver see
    it: endpoints with their host ids (and gossip generations)."""
    status = {}
    for line in cluster.nodetool(cluster.nodes[0], "status").splitlines():
        fields = line.split()
        if fields and re.fullmatch(r"[UD][NLJM]", fields[0]):
            status[fields[1]] = next(f for f in fields if _UUID.fullmatch(f))
    gossip: dict[str, list[str]] = {}
    endpoint = ""
    for line in cluster.nodetool(cluster.nodes[0], "gossipinfo").splitlines():
        if not line.startswith(" ") and "/" in line:
            endpoint = line.strip().split("/")[-1]
            gossip[endpoint] = []
        elif endpoint and line.strip().startswith(("generation:", "HOST_ID:")):
            key, _, value = line.strip().partition(":")
            gossip[endpoint].append(f"{key}={value.rsplit(':', 1)[-1].strip()}")
    hosts = cluster.session().cluster.metadata.all_hosts()
    driver = sorted((str(h.endpoint.address), str(h.host_id)) for h in hosts)
    return {"status": status, "gossip": gossip, "driver": driver}


def _wait_final(bed: Bed, drill_id: str, during: list[dict[str, object]]) -> agent_pb2.DrillStatus:
    """Poll GetDrill until the drill ends; once the drill node has had time to start and gossip
    (it tries its remembered peers at once), sample the live ring's views into `during`."""
    deadline = time.monotonic() + 900
    start_seen: float | None = None
    while time.monotonic() < deadline:
        status = bed.stub.GetDrill(agent_pb2.DrillRequest(drill_id=drill_id), timeout=30)
        if status.state in ("proven", "failed", "stopped"):
            return status
        if status.step == "start" and start_seen is None:
            start_seen = time.monotonic()
        # From 6 s into the start the drill node's JVM runs and gossips (it starts in ~10 s).
        if start_seen is not None and time.monotonic() - start_seen > 6 and len(during) < 2:
            during.append(_ring_views(bed.cluster))
        time.sleep(1.0)
    raise AssertionError(f"drill {drill_id} did not end in time")


def _leftovers(bed: Bed, clone_names: Sequence[str]) -> dict[str, list[str]]:
    with open("/proc/self/mountinfo", encoding="utf-8") as mounts:
        points = [line.split()[4] for line in mounts]
    processes = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                if str(bed.drill_root / "drills").encode() in cmdline.read():
                    processes.append(entry)
    loops = []
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        with contextlib.suppress(OSError):
            if any(name in backing.read_text() for name in clone_names):
                loops.append(backing.parent.parent.name)
    return {
        "mounts": [p for p in points if p.startswith(str(bed.drill_root))],
        "namespaces": netns.existing(),
        "processes": processes,
        "loop devices": loops,
    }


def _manifest_key(entries: Any) -> set[tuple[object, ...]]:
    return {
        (
            e.data_directory,
            e.keyspace,
            e.table_directory,
            e.generation,
            e.data_digest_crc32,
            tuple(sorted((c.name, c.path, c.size_bytes) for c in e.components)),
        )
        for e in entries
    }


def _teardown(bed: Bed, drill_id: str, clones: Sequence[tuple[str, Volume]]) -> None:
    bed.stub.StopDrill(agent_pb2.DrillRequest(drill_id=drill_id), timeout=300)
    bed.stub.UnmountClones(agent_pb2.UnmountClonesRequest(purpose_id=drill_id), timeout=300)
    for _, clone in clones:
        bed.driver.delete_clone(clone)


# -- the tests -----------------------------------------------------------------------------------


def test_a_node_drilled_beside_the_live_ring_is_proven_and_the_ring_never_sees_it(
    bed: Bed,
) -> None:
    name = bed.cluster.nodes[0].name
    drill_id = f"drill-{uuid.uuid4().hex[:8]}"
    before = _ring_views(bed.cluster)
    assert len(before["driver"]) == 3, before  # type: ignore[arg-type]
    clones = _clone(bed, name, drill_id.replace("-", "_"))
    try:
        mounted = _mount(bed, drill_id, name, clones)
        assert sorted(m.role for m in mounted.mounts) == ["commitlog", "data"]
        assert all(m.mount_point.startswith(str(bed.drill_root)) for m in mounted.mounts)
        started = _start(bed, drill_id, name)
        assert started.state in ("starting", "verifying"), started
        # Idempotent per purpose: mounting again returns the same mounts.
        assert _mount(bed, drill_id, name, clones) == mounted
        during: list[dict[str, object]] = []
        final = _wait_final(bed, drill_id, during)
        assert final.state == "proven", (final.step, final.message, list(final.proof))
        print(f"\ndrill {drill_id} of {name}: {dict(final.step_seconds)}", *final.proof, sep="\n  ")
        proof = "\n".join(final.proof)
        for expected in ("digests:", "isolation:", "system.local:", "canary:", "own data:"):
            assert expected in proof, proof
        rows = int(re.search(r"own data: (\d+) rows", proof).group(1))  # type: ignore[union-attr]
        assert rows > 0, proof
        assert final.bytes_verified > 0

        # The clones' manifest is the node's manifest at the backup.
        streamed = [
            entry
            for batch in bed.stub.GetDrillManifest(
                agent_pb2.DrillRequest(drill_id=drill_id), timeout=300
            )
            for entry in batch.entries
        ]
        with Catalog(bed.stack.coordinator_config().coordinator.catalog, exclusive=False) as c:
            recorded = c.load_manifest(bed.backup.id, name)
        assert _manifest_key(streamed) == _manifest_key(recorded)
        assert any(e.keyspace == KEYSPACE for e in streamed)

        # The live ring saw nothing: same endpoints, host ids, generations, during and after.
        assert during, "the ring was never sampled while the drill node ran"
        for sample in during:
            assert sample == before
    finally:
        _teardown(bed, drill_id, clones)
    assert _ring_views(bed.cluster) == before
    # StopDrill and UnmountClones are idempotent.
    again = bed.stub.StopDrill(agent_pb2.DrillRequest(drill_id=drill_id), timeout=60)
    assert again.state == "stopped"
    assert not bed.stub.UnmountClones(
        agent_pb2.UnmountClonesRequest(purpose_id=drill_id), timeout=60
    ).detached_volumes
    assert _leftovers(bed, [c.name for _, c in clones]) == {
        "mounts": [],
        "namespaces": [],
        "processes": [],
        "loop devices": [],
    }


def test_a_clone_damaged_by_hand_fails_the_drill_at_the_digest_step_naming_the_file(
    bed: Bed,
) -> None:
    name = bed.cluster.nodes[1].name
    drill_id = f"drill-{uuid.uuid4().hex[:8]}"
    clones = _clone(bed, name, drill_id.replace("-", "_"))
    try:
        mounted = _mount(bed, drill_id, name, clones)
        data = next(m.mount_point for m in mounted.mounts if m.role == "data")
        (damaged,) = sorted(Path(data).glob(f"data/{KEYSPACE}/rows-*/*-Data.db"))[:1]
        with open(damaged, "r+b") as stream:
            stream.seek(damaged.stat().st_size // 2)
            byte = stream.read(1)
            stream.seek(-1, os.SEEK_CUR)
            stream.write(bytes([byte[0] ^ 0xFF]))
        _start(bed, drill_id, name)
        final = _wait_final(bed, drill_id, [])
        assert final.state == "failed" and final.step == "digests", final
        assert str(damaged) in final.message and "Digest.crc32 says" in final.message, final
    finally:
        _teardown(bed, drill_id, clones)
    assert _leftovers(bed, [c.name for _, c in clones]) == {
        "mounts": [],
        "namespaces": [],
        "processes": [],
        "loop devices": [],
    }


def test_an_agent_without_a_drill_section_refuses_start_drill(bed: Bed) -> None:
    name = bed.cluster.nodes[0].name
    agent = bed.stack.agents[name]
    with (
        bed.stack.pki.channel(agent.address) as channel,
        pytest.raises(grpc.RpcError) as refused,
    ):
        agent_pb2_grpc.AgentServiceStub(channel).StartDrill(
            agent_pb2.StartDrillRequest(drill_id="drill-x"), timeout=30
        )
    error = refused.value
    assert isinstance(error, grpc.Call)
    assert error.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "[drill]" in (error.details() or "")
