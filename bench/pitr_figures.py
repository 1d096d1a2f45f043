"""The arithmetic of `bench.pitr`, apart from the ring so that it can be checked cheaply: which
phases ship, which writes fall in a phase's measured window, the p99 of each side and their ratio,
the recovery-point lag's median and max, and the commit-log replay each node logged."""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

#: Cassandra 5.0's own line at the end of start-up replay (`CommitLog.recoverSegmentsOnDisk`).
_REPLAY = re.compile(r"Log replay complete, (\d+) replayed mutations in (\d+) ms")


def shipping_phases(count: int) -> list[bool]:
    """on/off/on/off...: alternate phases on the same ring, so that drift (compaction, the page
    cache filling, the machine's other load) falls on both sides alike."""
    if count < 2 or count % 2:
        raise ValueError(f"--phases {count}: give an even number >= 2 (on/off pairs)")
    return [index % 2 == 0 for index in range(count)]


def percentile(values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile (as `ringsnap.sandbox.load.LoadReport`), 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def in_windows(
    starts: Sequence[float], latencies: Sequence[float], windows: Iterable[tuple[float, float]]
) -> list[float]:
    """The latencies of the writes that started inside one of `windows` (same clock as `starts`)."""
    spans = list(windows)
    return [
        latency
        for start, latency in zip(starts, latencies, strict=False)
        if any(low <= start < high for low, high in spans)
    ]


@dataclass(frozen=True)
class Side:
    """One side of the on/off comparison."""

    label: str
    latencies: tuple[float, ...]
    #: The phases' measured seconds together (the rate the writer kept).
    seconds: float

    @property
    def p99(self) -> float:
        return percentile(self.latencies, 0.99)

    def line(self) -> str:
        return (
            f"{self.label:13s} writes={len(self.latencies)}"
            f" ({len(self.latencies) / self.seconds if self.seconds else 0:.0f}/s)"
            f" p50_ms={percentile(self.latencies, 0.5) * 1000:.1f}"
            f" p99_ms={self.p99 * 1000:.1f} max_ms={max(self.latencies, default=0) * 1000:.1f}"
        )


def p99_worse_percent(on: Side, off: Side) -> float:
    """How much worse the p99 is with shipping on, in percent of the p99 with it off."""
    if off.p99 <= 0:
        raise ValueError("no writes measured with shipping off")
    return (on.p99 / off.p99 - 1) * 100


def lag_line(lags: Sequence[float], target: float) -> str:
    if not lags:
        return "recovery-point lag: no samples"
    return (
        f"recovery-point lag: median {statistics.median(lags):.1f} s, max {max(lags):.1f} s"
        f" over {len(lags)} samples (target <= {target:.0f} s)"
    )


@dataclass(frozen=True)
class Replay:
    mutations: int
    milliseconds: int

    @property
    def rate(self) -> float:
        """Mutations per second (0 when Cassandra replayed nothing)."""
        return self.mutations / (self.milliseconds / 1000) if self.milliseconds else 0.0


def replays(log_text: str) -> list[Replay]:
    """Every start-up replay a node's log reports, in order."""
    return [Replay(int(m), int(ms)) for m, ms in _REPLAY.findall(log_text)]


def replay_line(node: str, found: Sequence[Replay]) -> str:
    if not found:
        return f"{node}: no replay logged"
    last = found[-1]
    return (
        f"{node}: {last.mutations} mutations replayed in {last.milliseconds} ms"
        f" ({last.rate:,.0f} mutations/s)"
    )


def marginal_line(node: str, to_time: Sequence[Replay], plain: Sequence[Replay]) -> str:
    """What the restore to a time's replay added over the plain restore's on the same node: the
    start-up replay has a fixed cost (reading the restored segments, flushing), so the rate that
    says how fast shipped commit log is replayed is the extra mutations over the extra time."""
    if not to_time or not plain:
        return f"{node}: no replay to compare"
    extra = to_time[-1].mutations - plain[-1].mutations
    extra_ms = to_time[-1].milliseconds - plain[-1].milliseconds
    if extra_ms <= 0:
        return f"{node}: {extra} more mutations replayed in no more time ({extra_ms} ms)"
    return (
        f"{node}: {extra} more mutations in {extra_ms} more ms"
        f" ({extra / (extra_ms / 1000):,.0f} mutations/s)"
    )
