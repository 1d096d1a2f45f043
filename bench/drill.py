"""Restore drills beside the live sandbox ring, one node after another, through the drill host's
agent (the agent contract called directly: clone, MountClones, StartDrill, GetDrill, StopDrill,
UnmountClones, delete the clones).

Prints per drill node: the time of each step (clone on the array, mount, digests, start until CQL
answered, the CQL checks, teardown of the node and namespace, unmount and detach, clone deletion),
the CPU seconds and peak RSS of the drill Cassandra (read from /proc while it runs), and the CPU
the live ring's three Cassandra processes used meanwhile, beside their CPU over the same time
without a drill.

    .venv/bin/python -m bench.drill [--rows 20000] [--instance bench-drill]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from cassandra.concurrent import execute_concurrent_with_args

from ringsnap.agent.drill import netns
from ringsnap.api.v1 import agent_pb2, agent_pb2_grpc
from ringsnap.coordinator.assembly import open_coordinator
from ringsnap.coordinator.model import Backup, BackupState
from ringsnap.coordinator.scheduler import BackupRequest
from ringsnap.logs import configure
from ringsnap.plugins.api import Cloneable
from ringsnap.plugins.registry import build_driver
from ringsnap.sandbox.agents import BackgroundAgent
from ringsnap.sandbox.cluster import SandboxCluster
from ringsnap.sandbox.stack import ARRAY_NAME, CLUSTER_NAME, Stack, running_stack
from ringsnap.wire import duration

KEYSPACE = "bench_drill"
_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def _peak_rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _live_ring_pids() -> list[int]:
    """The CassandraDaemon processes in the host's own network namespace: the live ring."""
    own = os.readlink("/proc/self/ns/net")
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                if b"CassandraDaemon" not in cmdline.read():
                    continue
            if os.readlink(f"/proc/{entry}/ns/net") == own:
                found.append(int(entry))
    return found


def _ring_cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += _cpu_seconds(pid)
    return total


@dataclasses.dataclass
class NodeFigures:
    node: str
    state: str
    steps: dict[str, float]
    cpu_seconds: float
    peak_rss_mib: float
    bytes_verified: int
    wall_seconds: float
    ring_cpu_seconds: float


def _backup(stack: Stack) -> Backup:
    async def run() -> Backup:
        async with open_coordinator(stack.coordinator_config(), source="<bench>") as coordinator:
            return await coordinator.backup(BackupRequest(CLUSTER_NAME, trigger="bench"))

    backup = asyncio.run(run())
    if backup.state is not BackupState.COMPLETE:
        raise SystemExit(f"backup failed: {backup.error}")
    return backup


def _drill_one(
    stack: Stack, stub: Any, driver: Any, backup: Backup, name: str, ring: list[int]
) -> NodeFigures:
    cluster = stack.cluster
    node = backup.node(name)
    sandbox_node = cluster.node(name)
    agent = stack.agents[name]
    assert isinstance(agent, BackgroundAgent)
    facts = agent.call(agent.server.agent.node_info())
    drill_id = f"bench-{uuid.uuid4().hex[:8]}"
    steps: dict[str, float] = {}
    began = time.monotonic()
    ring_before = _ring_cpu(ring)

    (ref,) = backup.snapshots
    roles = {volume.volume: volume.role.value for volume in node.volumes}
    members = tuple(m for m in ref.members if m.volume.name in roles)
    assert isinstance(driver, Cloneable)
    since = time.monotonic()
    clones = driver.clone(dataclasses.replace(ref, members=members), drill_id.replace("-", "_"))
    steps["clone"] = time.monotonic() - since
    sources = {
        "data": str(sandbox_node.data_lun.mount_point),
        "commitlog": str(sandbox_node.commitlog_lun.mount_point),
    }
    since = time.monotonic()
    stub.MountClones(
        agent_pb2.MountClonesRequest(
            run_id=drill_id,
            volumes=[
                agent_pb2.CloneVolume(
                    role=roles[m.volume.name],
                    array=ARRAY_NAME,
                    volume=c.name,
                    wwn=c.wwn,
                    source_mount_point=sources[roles[m.volume.name]],
                )
                for m, c in zip(members, clones, strict=True)
            ],
        ),
        timeout=600,
    )
    steps["mount"] = time.monotonic() - since
    stub.StartDrill(
        agent_pb2.StartDrillRequest(
            run_id=drill_id,
            node=name,
            cluster_name=facts.cluster_name,
            address=sandbox_node.address,
            host_id=node.host_id,
            data_directories=list(facts.data_directories),
            commitlog_directory=facts.commitlog_directory,
            canary_keyspace="ringsnap",
            canary_key=node.canary_id,
            backup_id=backup.id,
            deadline=duration(1800),
            num_tokens=len(facts.tokens),
            datacenter=facts.datacenter,
            rack=facts.rack,
        ),
        timeout=60,
    )
    cpu = rss = 0.0
    namespace = netns.name_for(drill_id)
    while True:
        status = stub.GetDrill(agent_pb2.DrillRequest(run_id=drill_id), timeout=30)
        for pid in asyncio.run(netns.pids(namespace)):
            with contextlib.suppress(OSError):
                cpu_now, rss_now = _cpu_seconds(pid), _peak_rss_mib(pid)
                cpu, rss = max(cpu, cpu_now), max(rss, rss_now)
        if status.state in ("proven", "failed", "stopped"):
            break
        time.sleep(0.25)
    stub.StopDrill(agent_pb2.DrillRequest(run_id=drill_id), timeout=300)
    since = time.monotonic()
    stub.UnmountClones(agent_pb2.UnmountClonesRequest(run_id=drill_id), timeout=600)
    steps["unmount"] = time.monotonic() - since
    since = time.monotonic()
    for clone in clones:
        driver.delete_clone(clone)
    steps["delete clones"] = time.monotonic() - since
    agent_steps = dict(status.step_seconds)
    for step in ("digests", "start", "verify", "teardown"):
        steps[step] = agent_steps.get(step, 0.0)
    if status.state != "proven":
        print(f"  {name}: {status.state} at {status.step}: {status.message[:500]}")
    return NodeFigures(
        node=name,
        state=status.state,
        steps=steps,
        cpu_seconds=cpu,
        peak_rss_mib=rss,
        bytes_verified=status.bytes_verified,
        wall_seconds=time.monotonic() - began,
        ring_cpu_seconds=_ring_cpu(ring) - ring_before,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=20000, help="rows written before the backup")
    parser.add_argument("--instance", default="bench-drill")
    args = parser.parse_args()
    configure(json=False, level="warning")
    with (
        tempfile.TemporaryDirectory(prefix="ringsnap-bench-drill-") as tmp,
        SandboxCluster(args.instance, nodes=3, jit="full") as cluster,
        running_stack(cluster, Path(tmp) / "stack", drill_host=True) as stack,
    ):
        session = cluster.session()
        session.execute(
            f"CREATE KEYSPACE IF NOT EXISTS {KEYSPACE} WITH replication ="
            " {'class': 'SimpleStrategy', 'replication_factor': 3}"
        )
        session.execute(f"CREATE TABLE IF NOT EXISTS {KEYSPACE}.rows (id int PRIMARY KEY, v text)")
        insert = session.prepare(f"INSERT INTO {KEYSPACE}.rows (id, v) VALUES (?, ?)")
        # Random payloads: what the digests read is what a real table's SSTables would hold
        # (a constant string compresses to almost nothing).
        rows = [(i, os.urandom(250).hex()) for i in range(args.rows)]
        execute_concurrent_with_args(session, insert, rows)
        backup = _backup(stack)
        ring = _live_ring_pids()
        # The live ring's idle CPU over 30 s, to put the figures during a drill beside.
        idle_before = _ring_cpu(ring)
        time.sleep(30)
        idle = (_ring_cpu(ring) - idle_before) / 30
        driver = build_driver(ARRAY_NAME, stack.array.table, source="<bench>")
        assert stack.drill_agent is not None
        figures = []
        with stack.pki.channel(stack.drill_agent.address) as channel:
            stub = agent_pb2_grpc.AgentServiceStub(channel)
            for node in cluster.nodes:
                figures.append(_drill_one(stack, stub, driver, backup, node.name, ring))
        driver.close()
    order = ["clone", "mount", "digests", "start", "verify", "teardown", "unmount", "delete clones"]
    print(f"\ndrill of backup {backup.id}, {args.rows} rows (RF 3), one node at a time")
    print("node   state   " + " ".join(f"{s:>9}" for s in order) + "     total   CPU s  peak RSS")
    for f in figures:
        cells = " ".join(f"{f.steps.get(s, 0.0):9.2f}" for s in order)
        print(
            f"{f.node:6} {f.state:7} {cells} {f.wall_seconds:9.1f} {f.cpu_seconds:7.1f}"
            f" {f.peak_rss_mib:6.0f} MiB  ({f.bytes_verified / 1e6:.1f} MB digested)"
        )
    ring_total = sum(f.wall_seconds for f in figures)
    print(f"ring: {ring_total:.1f} s for {len(figures)} nodes one at a time")
    for f in figures:
        print(
            f"live ring CPU during {f.node}'s drill: {f.ring_cpu_seconds / f.wall_seconds:.2f}"
            f" cores (idle: {idle:.2f} cores)"
        )


if __name__ == "__main__":
    main()
