"""Point-in-time recovery on the real 3-node sandbox (the session's ring): every agent ships its
commit log to a real S3 server (S3Proxy) as it grows; rows are written with known timestamps, a
backup is taken, more rows are written; the ring is restored to a time T between two writes well
after the backup. Every row acknowledged at or before T is back at ALL, none stamped after T, and
every node proves T with its time canaries (the newest at or before T present, none after).

T is chosen only once every node's shipped point, minus the commit-log sync period (10 s in the
sandbox: the `sync window`, which a write acknowledged may still wait for), is past it: the
restore refuses any later T.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cassandra import ConsistencyLevel
from cassandra.query import SimpleStatement

from ringsnap.agent.pitr.keys import PitrKeys
from ringsnap.agent.s3.client import make_client
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.config import validate
from ringsnap.coordinator.canary import CanaryStore
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.model import RestoreState
from ringsnap.coordinator.pitr.time_canaries import ClusterTimeCanaries
from ringsnap.coordinator.pitr.time_canary import TimeCanaries
from ringsnap.coordinator.pitr.window import status_lines
from ringsnap.coordinator.restore.pitr import PLACE, PROVE
from ringsnap.coordinator.restore.pitr_session import plan_point_in_time, run_point_in_time
from ringsnap.sandbox.cluster import SandboxCluster
from ringsnap.sandbox.s3proxy import S3Server, running_s3proxy
from ringsnap.sandbox.stack import CLUSTER_NAME, Stack, running_stack
from tests.support.ring_runs import assert_proven, complete_backup, create_keyspace
from tests.support.s3_bucket import fresh_bucket, with_s3

pytestmark = pytest.mark.integration

KEYSPACE = "pitr_test"


@pytest.fixture(scope="module")
def s3_server() -> Iterator[S3Server]:
    with running_s3proxy() as server:
        yield server


@pytest.fixture
def shipping(
    sandbox_cluster: SandboxCluster, s3_server: S3Server, tmp_path: Path
) -> Iterator[tuple[Stack, dict[str, Any]]]:
    keys = tmp_path / "s3-keys"
    keys.mkdir()
    table = fresh_bucket(s3_server, keys)
    with running_stack(
        sandbox_cluster, tmp_path / "stack", vendor="flasharray", s3=table, pitr=True
    ) as stack:
        yield stack, table
    sandbox_cluster.wait_until_up_normal()


class StampedWriter:
    """Rows (id, stamp) at QUORUM from threads (ids interleaved), each written `USING TIMESTAMP`
    its stamp (the client's clock when the write began, in ms): the truth a restore to a time is
    judged by."""

    def __init__(self, session: Any, threads: int = 2) -> None:
        self._session = session
        self._threads_count = threads
        self.stamps: dict[int, int] = {}
        self.acked: set[int] = set()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(n,), daemon=True) for n in range(threads)
        ]

    def _run(self, first: int) -> None:
        next_id = first
        while not self._stop.is_set():
            stamp = int(time.time() * 1000)
            statement = SimpleStatement(
                f"INSERT INTO {KEYSPACE}.rows (id, stamp) VALUES (%s, %s)"
                f" USING TIMESTAMP {stamp * 1000}",
                consistency_level=ConsistencyLevel.QUORUM,
            )
            self.stamps[next_id] = stamp
            try:
                self._session.execute(statement, (next_id, stamp), timeout=10)
                self.acked.add(next_id)
            except Exception:
                pass
            next_id += self._threads_count
            time.sleep(0.002)

    def __enter__(self) -> StampedWriter:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)


def _points(table: dict[str, Any], nodes: list[str]) -> dict[str, dict[str, Any]]:
    settings = S3Settings.model_validate(table)
    client = make_client(settings)
    points: dict[str, dict[str, Any]] = {}
    for node in nodes:
        key = PitrKeys(settings.prefix, node).point
        with contextlib.suppress(client.exceptions.NoSuchKey):
            points[node] = json.loads(
                client.get_object(Bucket=settings.bucket, Key=key)["Body"].read()
            )
    return points


def _wait_for_points(
    table: dict[str, Any], nodes: list[str], past_ms: int, timeout: float, lags: list[float]
) -> None:
    """Until every node's recoverable point is past `past_ms`; each node's recovery-point lag
    (now minus its recoverable point) is sampled into `lags` meanwhile."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        points = _points(table, nodes)
        now_ms = time.time() * 1000
        lags.extend((now_ms - p["recoverable_through_ms"]) / 1000 for p in points.values())
        if len(points) == len(nodes) and all(
            p["recoverable_through_ms"] >= past_ms for p in points.values()
        ):
            return
        time.sleep(1)
    raise AssertionError(f"shipped points never passed {past_ms}: {_points(table, nodes)}")


def test_the_ring_restored_to_a_time_holds_exactly_the_rows_up_to_it(
    sandbox_cluster: SandboxCluster, shipping: tuple[Stack, dict[str, Any]]
) -> None:
    stack, table = shipping
    data = with_s3(stack, table)
    data["clusters"][0]["pitr"] = True
    config = validate(data, CoordinatorConfig, source="<pitr test>")
    nodes = [n.name for n in sandbox_cluster.nodes]
    lags: list[float] = []
    _wait_for_points(table, nodes, 0, 60, [])

    sandbox_cluster.wait_for_session()
    session = sandbox_cluster.session()
    create_keyspace(session, KEYSPACE)
    session.execute(f"DROP TABLE IF EXISTS {KEYSPACE}.rows", timeout=120)
    session.execute(f"CREATE TABLE {KEYSPACE}.rows (id int PRIMARY KEY, stamp bigint)", timeout=120)
    # Tables of the proof exist before the base backup: a table created after it is not in the
    # schema Cassandra loads before replay (docs/pitr.md, pitfalls).
    dcs = {h.datacenter for h in session.cluster.metadata.all_hosts()}
    CanaryStore(session).ensure_schema(dcs)
    TimeCanaries(session).ensure_schema()

    with StampedWriter(session) as writer:
        time.sleep(3)
        backup = complete_backup(config)
        assert backup.finished_at is not None
        # The coordinator daemon's writer of the cluster's time canaries, one per node a second.
        ticker = ClusterTimeCanaries(config.clusters[0]).start()
        time.sleep(8)
        # T: the stamp of a write 8 s after the backup, minus 1 ms (between two writes).
        target_ms = max(writer.stamps[i] for i in writer.acked) - 1
        time.sleep(6)
        stamps, acked = dict(writer.stamps), set(writer.acked)
    try:
        _wait_for_points(table, nodes, target_ms + 5000, 120, lags)
    finally:
        ticker.stop()
    assert ticker.ticks > 10
    with Catalog(config.coordinator.catalog, exclusive=False) as catalog:
        window = status_lines(config, catalog)
    assert window[0].startswith("sandbox: point-in-time window "), window
    assert not any("hole" in line for line in window), window

    # --dry-run: the base backup and each node's shipped segments; a time past the window refused.
    plan = asyncio.run(plan_point_in_time(config, CLUSTER_NAME, target_ms))
    assert plan.base.id == backup.id and not plan.refusals, plan.refusals
    assert set(plan.placements) == set(nodes)
    assert all(p.segments and p.restore_point for p in plan.placements.values())
    late = asyncio.run(plan_point_in_time(config, CLUSTER_NAME, int(time.time() * 1000) + 60_000))
    assert len(late.refusals) == len(nodes) and all("reaches" in r for r in late.refusals)

    started = time.monotonic()
    record = asyncio.run(run_point_in_time(config, CLUSTER_NAME, target_ms, "test"))
    seconds = time.monotonic() - started
    assert_proven(record)
    assert record.state is RestoreState.PROVEN
    assert record.backup_id == backup.id
    for node in record.nodes:
        assert any(line.startswith("point in time: time canary at") for line in node.proof), node
    timings = {t.phase for t in record.timings}
    assert {PLACE, PROVE} <= timings

    sandbox_cluster.wait_for_session()
    rows = {
        r.id: r.stamp
        for r in sandbox_cluster.session().execute(
            SimpleStatement(
                f"SELECT id, stamp FROM {KEYSPACE}.rows",
                consistency_level=ConsistencyLevel.ALL,
                fetch_size=5000,
            ),
            timeout=60,
        )
    }
    up_to = {i for i in acked if stamps[i] <= target_ms}
    after = {i for i, s in stamps.items() if s > target_ms}
    missing = up_to - set(rows)
    assert not missing, f"{len(missing)} rows acknowledged at or before T are not back"
    assert not (after & set(rows)), f"{len(after & set(rows))} rows stamped after T are back"
    assert all(s <= target_ms for s in rows.values())
    print(
        f"PITR: {len(up_to)} rows up to T back, {len(after)} after T absent,"
        f" restore {seconds:.1f} s, phases {[(t.phase, t.seconds) for t in record.timings]};"
        f" recovery-point lag under load: median {statistics.median(lags):.1f} s,"
        f" max {max(lags):.1f} s over {len(lags)} samples"
    )
