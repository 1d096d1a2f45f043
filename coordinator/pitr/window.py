"""The recoverable window of a cluster: from its oldest retained backup to the newest point every
node's shipped commit log reaches (each node's `point.json` in the bucket, written by its agent's
shipper: ringsnap.agent.pitr.shipper), with its holes. `ringsnap status` prints it; the
coordinator's metrics export each node's recovery-point lag and holes from it (read when scraped,
at most every `CACHE_SECONDS`)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ringsnap.agent.pitr.keys import PitrKeys, gaps, list_segments
from ringsnap.agent.s3.client import S3Client, make_client
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.coordinator.model import BackupSummary
from ringsnap.logs import get_logger

CACHE_SECONDS = 10.0

log = get_logger(__name__)


@dataclass(frozen=True)
class NodePoint:
    node: str
    shipped_at_ms: int
    recoverable_through_ms: int
    holes: tuple[str, ...]


@dataclass(frozen=True)
class Window:
    cluster: str
    #: The oldest retained backup's end (None: no backup to start from).
    start_ms: int | None
    #: The newest point every node reaches (None: a node ships nothing).
    end_ms: int | None
    points: dict[str, NodePoint]
    #: Nodes with nothing in the bucket.
    silent: tuple[str, ...] = field(default=())
    #: Per node, what the bucket lost (`ringsnap.agent.pitr.keys.gaps`), when it was listed.
    lost: dict[str, list[str]] = field(default_factory=dict)

    @property
    def holes(self) -> dict[str, tuple[str, ...]]:
        return {n: p.holes for n, p in self.points.items() if p.holes}


def read_points(
    client: S3Client, settings: S3Settings, nodes: Iterable[str]
) -> dict[str, NodePoint]:
    points: dict[str, NodePoint] = {}
    for node in nodes:
        key = PitrKeys(settings.prefix, node).point
        try:
            raw: dict[str, Any] = json.loads(
                client.get_object(Bucket=settings.bucket, Key=key)["Body"].read()
            )
        except client.exceptions.NoSuchKey:
            continue
        points[node] = NodePoint(
            node,
            int(raw.get("shipped_at_ms", 0)),
            int(raw.get("recoverable_through_ms", 0)),
            tuple(str(h) for h in raw.get("holes", ())),
        )
    return points


def compute_window(
    cluster: str,
    nodes: Sequence[str],
    points: dict[str, NodePoint],
    summaries: Sequence[BackupSummary],
) -> Window:
    ends = [
        s.finished_at.timestamp() * 1000
        for s in summaries
        if s.restorable and s.finished_at is not None
    ]
    silent = tuple(n for n in nodes if n not in points)
    end = None if silent or not points else min(p.recoverable_through_ms for p in points.values())
    return Window(cluster, int(min(ends)) if ends else None, end, points, silent)


def _utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")


def window_lines(window: Window, now_ms: int | None = None) -> list[str]:
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    name = window.cluster
    if window.start_ms is None:
        head = f"{name}: point-in-time window: none (no restorable backup to start from)"
    elif window.end_ms is None:
        who = ", ".join(window.silent) or "every node"
        head = f"{name}: point-in-time window: none (no commit log shipped by {who})"
    elif window.end_ms < window.start_ms:
        head = f"{name}: point-in-time window: none (the shipped log ends before the oldest backup)"
    else:
        head = (
            f"{name}: point-in-time window {_utc(window.start_ms)} to {_utc(window.end_ms)}"
            f" (`ringsnap restore --to TIME`)"
        )
    lines = [head]
    for node, point in sorted(window.points.items()):
        lag = max(0.0, (now_ms - point.shipped_at_ms) / 1000)
        lines.append(
            f"  {node}: recoverable through {_utc(point.recoverable_through_ms)},"
            f" shipped {lag:.0f} s ago"
        )
        for hole in point.holes:
            lines.append(f"    hole: segment {hole} (its tail may be lost; no --to across it)")
        for gap in window.lost.get(node, ()):
            lines.append(f"    hole in the bucket: {gap} (no --to across it)")
    return lines


class PitrCollector(Collector):
    """Each node's recovery-point lag and holes, read from the bucket when scraped (cached)."""

    def __init__(
        self,
        settings: S3Settings,
        clusters: dict[str, list[str]],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._clock = clock
        self._settings = settings
        self._clusters = clusters
        self._client: S3Client | None = None
        self._lock = threading.Lock()
        self._cached: tuple[float, dict[str, dict[str, NodePoint]]] = (0.0, {})

    def _points(self) -> dict[str, dict[str, NodePoint]]:
        with self._lock:
            read_at, points = self._cached
            if time.monotonic() - read_at < CACHE_SECONDS and read_at:
                return points
            if self._client is None:
                self._client = make_client(self._settings)
            try:
                points = {
                    c: read_points(self._client, self._settings, nodes)
                    for c, nodes in self._clusters.items()
                }
            except Exception as exc:  # the bucket unreachable: the lag keeps growing
                log.warning("shipped commit-log points not read", error=str(exc))
            self._cached = (time.monotonic(), points)
            return points

    def collect(self) -> Iterator[GaugeMetricFamily]:
        lag = GaugeMetricFamily(
            "ringsnap_pitr_recovery_point_lag_seconds",
            "Seconds between now and the newest point a node's shipped commit log reaches (its"
            " shipped point minus the commit-log sync period).",
            labels=["cluster", "node"],
        )
        holes = GaugeMetricFamily(
            "ringsnap_pitr_holes",
            "Commit-log segments of a node reported lost (no restore to a time across them).",
            labels=["cluster", "node"],
        )
        now = self._clock()
        for cluster, points in self._points().items():
            for node, point in points.items():
                lag.add_metric([cluster, node], max(0.0, now - point.recoverable_through_ms / 1000))
                holes.add_metric([cluster, node], len(point.holes))
        yield lag
        yield holes

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())


def pitr_clusters(config: Any) -> dict[str, list[str]]:
    """The clusters whose window is read: those with `pitr = true`, when the coordinator has
    `[s3]`."""
    if config.s3 is None:
        return {}
    return {c.name: [n.name for n in c.nodes] for c in config.clusters if c.pitr}


def status_lines(config: Any, catalog: Any, cluster: str | None = None) -> list[str]:
    """`ringsnap status`'s point-in-time lines (nothing without `[s3]` or a shipped log); with
    `cluster`, that cluster's only (`ringsnap show` of one of its backups)."""
    clusters = pitr_clusters(config)
    if cluster is not None:
        clusters = {c: n for c, n in clusters.items() if c == cluster}
    if not clusters:
        return []
    client = make_client(config.s3)
    lines: list[str] = []
    for name, nodes in clusters.items():
        points = read_points(client, config.s3, nodes)
        if not points:
            continue
        window = compute_window(name, nodes, points, catalog.backup_summaries(name))
        for node in points:
            # Listing every piece: for the operator's status, not for every scrape.
            found = gaps(list_segments(client, config.s3.bucket, PitrKeys(config.s3.prefix, node)))
            if found:
                window.lost[node] = found
        lines += window_lines(window)
    return lines
