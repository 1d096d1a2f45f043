"""What the point-in-time ring test reads and writes: rows stamped with the client's clock (the
truth a restore to a time is judged by), each node's shipped point in the bucket, the coordinator's
lag metric, and the rows a restore brought back compared with the stamps."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cassandra import ConsistencyLevel
from cassandra.query import SimpleStatement

from ringsnap.agent.pitr.keys import PitrKeys, SegmentState, list_segments
from ringsnap.agent.pitr.segment import SegmentName, synced_end
from ringsnap.agent.s3.client import S3Client, make_client
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.coordinator.pitr.window import PitrCollector

KEYSPACE = "pitr_test"
LAG_METRIC = "ringsnap_pitr_recovery_point_lag_seconds"


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


def quick_settings(table: dict[str, Any]) -> S3Settings:
    """The bucket's settings with short timeouts and no retry: the test's own reads must not hang
    for minutes on a bucket it made unreachable."""
    return S3Settings.model_validate(
        {**table, "connect_timeout_seconds": 2, "read_timeout_seconds": 5, "max_attempts": 2}
    )


def points(table: dict[str, Any], nodes: list[str]) -> dict[str, dict[str, Any]]:
    settings = quick_settings(table)
    client = make_client(settings)
    found: dict[str, dict[str, Any]] = {}
    for node in nodes:
        key = PitrKeys(settings.prefix, node).point
        with contextlib.suppress(client.exceptions.NoSuchKey):
            found[node] = json.loads(
                client.get_object(Bucket=settings.bucket, Key=key)["Body"].read()
            )
    return found


def lags_of(table: dict[str, Any], nodes: list[str]) -> dict[str, float]:
    """Each node's recovery-point lag now: now minus its recoverable point, in seconds."""
    now_ms = time.time() * 1000
    return {
        n: (now_ms - p["recoverable_through_ms"]) / 1000 for n, p in points(table, nodes).items()
    }


def wait_for_points(
    table: dict[str, Any], nodes: list[str], past_ms: int, timeout: float, lags: list[float]
) -> None:
    """Until every node's recoverable point is past `past_ms`; each node's recovery-point lag
    (now minus its recoverable point) is sampled into `lags` meanwhile."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = points(table, nodes)
        now_ms = time.time() * 1000
        lags.extend((now_ms - p["recoverable_through_ms"]) / 1000 for p in found.values())
        if len(found) == len(nodes) and all(
            p["recoverable_through_ms"] >= past_ms for p in found.values()
        ):
            return
        time.sleep(1)
    raise AssertionError(f"shipped points never passed {past_ms}: {points(table, nodes)}")


def coordinator_lags(collector: PitrCollector) -> dict[str, float]:
    """The coordinator's recovery-point lag gauge, one sample per node, as a scrape reads it."""
    for family in collector.collect():
        if family.name == LAG_METRIC:
            return {s.labels["node"]: s.value for s in family.samples}
    raise AssertionError(f"{LAG_METRIC} not collected")


@dataclass(frozen=True)
class ActiveSegment:
    name: str
    synced: int


def active_segment(commitlog_directory: Path) -> ActiveSegment:
    """The segment Cassandra appends to and its synced bytes: the newest one holding synced
    bytes (Cassandra creates the next segment ahead of need; it holds nothing synced yet)."""
    names = {
        n: p for n in (e.name for e in commitlog_directory.iterdir()) if (p := SegmentName.parse(n))
    }
    newest: ActiveSegment | None = None
    for name, parsed in sorted(names.items(), key=lambda kv: kv[1].id, reverse=True):
        newest = ActiveSegment(name, synced_end(commitlog_directory / name, parsed.id))
        if newest.synced > 0:
            return newest
    assert newest is not None, f"no commit-log segment in {commitlog_directory}"
    return newest


def shipped_segments(table: dict[str, Any], node: str) -> dict[str, SegmentState]:
    settings = quick_settings(table)
    client: S3Client = make_client(settings)
    return list_segments(client, settings.bucket, PitrKeys(settings.prefix, node))


def rows_at_all(session: Any) -> dict[int, int]:
    return {
        r.id: r.stamp
        for r in session.execute(
            SimpleStatement(
                f"SELECT id, stamp FROM {KEYSPACE}.rows",
                consistency_level=ConsistencyLevel.ALL,
                fetch_size=5000,
            ),
            timeout=60,
        )
    }


def assert_exactly_up_to(
    rows: dict[int, int], stamps: dict[int, int], acked: set[int], target_ms: int
) -> tuple[int, int]:
    """Every row acknowledged at or before T is back, none stamped after T; (back, absent)."""
    up_to = {i for i in acked if stamps[i] <= target_ms}
    after = {i for i, s in stamps.items() if s > target_ms}
    missing = up_to - set(rows)
    assert not missing, f"{len(missing)} rows acknowledged at or before T are not back"
    assert not (after & set(rows)), f"{len(after & set(rows))} rows stamped after T are back"
    assert all(s <= target_ms for s in rows.values())
    return len(up_to), len(after)
