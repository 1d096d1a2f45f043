"""The coordinator under load: 20 clusters backed up every minute, a catalog of 100,000 backups.

    .venv/bin/python -m bench.coordinator_load [--clusters 20] [--backups 100000] [--minutes 3]

The coordinator is the real one (scheduler, workflow, catalog, gRPC API on loopback with its
token); the agents and the array are the in-memory fakes of the test suite, so the figures are the
coordinator's own cost. The catalog is filled in bulk before the start (5,000 backups a cluster for
the defaults) and every cluster has a schedule of `* * * * *` under a policy that keeps them all, so
each minute's retention plan judges the whole history. Printed:
- schedules: for each due minute, how late each cluster's backup started after the minute (p50,
  max) and how many of the expected runs happened (a run skipped or missed is a failure);
- the API while the schedules run: `ListBackups` (first page of 100, one cluster and all),
  `GetStatus`, `PlanRetention` of one cluster (p50/p99/max of repeated calls through gRPC);
- the process's CPU time and peak RSS.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import grpc

from bench.catalog import ref_for
from ringsnap.api.v1 import coordinator_pb2 as pb
from ringsnap.api.v1 import coordinator_pb2_grpc
from ringsnap.config import validate
from ringsnap.coordinator.api.listeners import CoordinatorServer
from ringsnap.coordinator.api.token import token_path, write_token
from ringsnap.coordinator.catalog import Catalog, codec
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.metrics import CoordinatorMetrics
from ringsnap.coordinator.model import BackupNode, NodeVolume, VolumeRole
from ringsnap.coordinator.ports import AgentPort
from ringsnap.coordinator.service import ClusterRuntime, Coordinator
from ringsnap.logs import configure
from tests.support.fakes import FakeAgent, FakeArray, volumes_of

ARRAY = "a1"
NODES = 3


def _names(clusters: int) -> dict[str, list[str]]:
    return {f"c{c:02d}": [f"c{c:02d}n{k}" for k in range(1, NODES + 1)] for c in range(clusters)}


def _config(tmp: Path, clusters: dict[str, list[str]]) -> CoordinatorConfig:
    for name in ("coordinator.crt", "coordinator.key", "ca.crt"):
        (tmp / name).write_text("not read by this benchmark\n")
    port = iter(range(20000, 30000))
    data: dict[str, Any] = {
        "coordinator": {
            "listen": "127.0.0.1:0",
            "catalog": str(tmp / "catalog.db"),
            "metrics_listen": "",
        },
        "tls": {
            "cert_file": str(tmp / "coordinator.crt"),
            "key_file": str(tmp / "coordinator.key"),
            "ca_file": str(tmp / "ca.crt"),
        },
        "clusters": [
            {
                "name": cluster,
                "contact_points": ["127.0.0.1"],
                "nodes": [
                    {
                        "name": node,
                        "agent": f"127.0.0.1:{next(port)}",  # never dialled
                        "volumes": [
                            {"array": ARRAY, "volume": f"{node}-data", "role": "data"},
                            {"array": ARRAY, "volume": f"{node}-cl", "role": "commitlog"},
                        ],
                    }
                    for node in nodes
                ],
            }
            for cluster, nodes in clusters.items()
        ],
        "arrays": {ARRAY: {"driver": "fake"}},
        "schedules": [
            {"name": f"every-minute-{c}", "cluster": c, "cron": "* * * * *", "policy": "all"}
            for c in clusters
        ],
        "retention": {"all": {"min_count": 1_000_000, "failed_grace_days": 0}},
    }
    return validate(data, CoordinatorConfig, source="<bench config>")


def _fill(catalog: Catalog, clusters: dict[str, list[str]], total: int) -> None:
    """Bulk insert (setup, not measured): `total` complete backups spread over the clusters,
    hourly, ending an hour ago."""
    names = list(clusters)
    start = datetime.now(UTC) - timedelta(hours=total // len(names) + 1)
    conn = catalog._connection()
    conn.execute("BEGIN IMMEDIATE")
    for cluster_index, cluster in enumerate(names):
        nodes = [
            BackupNode(
                name=node,
                host_id=f"00000000-0000-0000-0000-{cluster_index:06d}{k:06d}",
                canary_id=f"canary-{node}",
                volumes=(
                    NodeVolume(
                        array=ARRAY,
                        volume=f"{node}-data",
                        role=VolumeRole.DATA,
                        volume_id=f"id-{node}-data",
                    ),
                    NodeVolume(
                        array=ARRAY,
                        volume=f"{node}-cl",
                        role=VolumeRole.COMMITLOG,
                        volume_id=f"id-{node}-cl",
                    ),
                ),
            )
            for k, node in enumerate(clusters[cluster], start=1)
        ]
        encoded = {n.name: codec.encode_volumes(n.volumes) for n in nodes}
        rows = []
        for i in range(total // len(names)):
            started = start + timedelta(hours=i)
            us = (started - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
            rows.append((f"rs-{cluster}-{i:07d}", cluster, us, us + 60_000_000))
        conn.executemany(
            "INSERT INTO backups (id, cluster, state, quiesce_mode, trigger, policy, started_us,"
            " finished_us) VALUES (?, ?, 'complete', 'freeze', 'schedule:hourly', 'all', ?, ?)",
            rows,
        )
        pks = conn.execute(
            "SELECT pk, id FROM backups WHERE cluster = ? ORDER BY id", (cluster,)
        ).fetchall()
        conn.executemany(
            "INSERT INTO backup_nodes (backup, name, host_id, volumes, canary_id, excluded_reason,"
            " sstable_count, bytes) VALUES (?, ?, ?, ?, ?, '', 1200, 1073741824)",
            [(pk, n.name, n.host_id, encoded[n.name], n.canary_id) for pk, _ in pks for n in nodes],
        )
        conn.executemany(
            "INSERT INTO snapshots (backup, array, ref) VALUES (?, ?, ?)",
            [(pk, ARRAY, codec.encode_ref(ref_for(backup_id, nodes))) for pk, backup_id in pks],
        )
    conn.execute("COMMIT")


def _percentiles(values: list[float]) -> str:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return (
        f"p50 {statistics.median(ordered) * 1000:7.1f} ms  p99 {p99 * 1000:7.1f} ms"
        f"  max {ordered[-1] * 1000:7.1f} ms  (n={len(ordered)})"
    )


async def _probe_api(
    address: str, token: str, cluster: str, until: float
) -> dict[str, list[float]]:
    """Repeated read calls through gRPC while the schedules run, one after another."""
    credentials = grpc.composite_channel_credentials(
        grpc.local_channel_credentials(grpc.LocalConnectionType.LOCAL_TCP),
        grpc.access_token_call_credentials(token),
    )
    calls: dict[str, Any] = {}
    async with grpc.aio.secure_channel(address, credentials) as channel:
        stub = coordinator_pb2_grpc.CoordinatorServiceStub(channel)
        calls = {
            "ListBackups (one cluster, 100)": lambda: stub.ListBackups(
                pb.ListBackupsRequest(cluster=cluster, page_size=100), timeout=60
            ),
            "ListBackups (all, 100)": lambda: stub.ListBackups(
                pb.ListBackupsRequest(page_size=100), timeout=60
            ),
            "GetStatus": lambda: stub.GetStatus(pb.GetStatusRequest(), timeout=60),
            "PlanRetention (one cluster)": lambda: stub.PlanRetention(
                pb.PlanRetentionRequest(cluster=cluster, policy="all"), timeout=60
            ),
        }
        timings: dict[str, list[float]] = {name: [] for name in calls}
        while time.monotonic() < until:
            for name, call in calls.items():
                began = time.perf_counter()
                await call()
                timings[name].append(time.perf_counter() - began)
            await asyncio.sleep(0.2)
    return timings


async def _run(args: argparse.Namespace, tmp: Path) -> None:
    clusters = _names(args.clusters)
    config = _config(tmp, clusters)
    catalog = Catalog(config.coordinator.catalog)
    filled = time.perf_counter()
    _fill(catalog, clusters, args.backups)
    print(
        f"catalog: {args.backups} backups in {len(clusters)} clusters filled in"
        f" {time.perf_counter() - filled:.1f} s (setup)"
    )
    every_node = [node for nodes in clusters.values() for node in nodes]
    array = FakeArray(ARRAY, volumes_of(every_node))
    agents = {node: FakeAgent(node, leases=False) for node in every_node}
    runtimes = {
        section.name: ClusterRuntime(
            section, {n.name: cast(AgentPort, agents[n.name]) for n in section.nodes}, None
        )
        for section in config.clusters
    }
    coordinator = Coordinator(
        config, catalog, CoordinatorMetrics(clusters), {ARRAY: array}, runtimes
    )
    cpu_before = time.process_time()
    await coordinator.start()
    token = write_token(token_path(config.coordinator.catalog))
    server = CoordinatorServer(coordinator, "127.0.0.1:0", token, "<bench>")
    port = await server.start()
    # Measure whole minutes: from the next minute boundary on.
    now = datetime.now(UTC)
    first = now.replace(second=0, microsecond=0) + timedelta(minutes=1)
    end = first + timedelta(minutes=args.minutes, seconds=20)
    until = time.monotonic() + (end - now).total_seconds()
    try:
        timings = await _probe_api(f"127.0.0.1:{port}", token, "c00", until)
        await coordinator.scheduler.wait_idle()
    finally:
        await server.stop(0)
        await coordinator.stop()
    cpu = time.process_time() - cpu_before

    delays: list[float] = []
    ran = 0
    for cluster in clusters:
        page = catalog.list_backups(cluster, page_size=args.minutes + 5, page_token="")
        for backup in page.backups:
            minute = backup.started_at.replace(second=0, microsecond=0)
            last = first + timedelta(minutes=args.minutes)
            if not first <= minute < last or not backup.trigger.startswith("schedule:"):
                continue
            delays.append((backup.started_at - minute).total_seconds())
            ran += 1
    expected = args.minutes * len(clusters)
    print(
        f"schedules: {len(clusters)} clusters every minute for {args.minutes} min: {ran} of"
        f" {expected} runs started; start after the minute p50 {statistics.median(delays):.3f} s,"
        f" max {max(delays):.3f} s"
        if delays
        else f"schedules: no scheduled run recorded (expected {expected})"
    )
    print("API while the schedules run (through gRPC on loopback):")
    for name, values in timings.items():
        print(f"  {name:30s} {_percentiles(values)}")
    print(
        f"coordinator process: {cpu:.1f} s CPU over {args.minutes} min;"
        f" peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB"
    )
    catalog.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clusters", type=int, default=20)
    parser.add_argument("--backups", type=int, default=100_000)
    parser.add_argument("--minutes", type=int, default=3)
    args = parser.parse_args()
    configure(json=True, level="warning")
    with tempfile.TemporaryDirectory(prefix="ringsnap-coordinator-load-") as tmp:
        asyncio.run(_run(args, Path(tmp)))


if __name__ == "__main__":
    main()
