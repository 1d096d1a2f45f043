"""What the machine did while a client write was slow: CPU and I/O pressure, and the nodes' GC
pauses and compactions, all on the machine's monotonic clock.

- `PressureSampler`: a thread reading the kernel's pressure stall information (`/proc/pressure/cpu`
  and `io`, cumulative microseconds during which at least one runnable task waited for a CPU, or
  for I/O) every 20 ms; `share(start, end)` is the fraction of [start, end] under pressure. On
  2 cores shared with other engineers' work, a write that waited for a CPU shows here.
- `node_log_spans`: from each node's container log, every GC pause Cassandra reports (its
  GCInspector logs pauses of 200 ms and more) and every compaction, as (start, end) spans.

    with PressureSampler() as pressure:
        ...
    pressure.share(start, end)          # {"cpu": 0.42, "io": 0.05, "io_full": 0.01}
    node_log_spans(["c-node1", ...], since_wall=t0)   # {"gc": [...], "compaction": [...]}
"""

from __future__ import annotations

import bisect
import re
import subprocess
import threading
import time
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path

_PRESSURE = Path("/proc/pressure")
_TOTAL = re.compile(r"total=(\d+)")
# INFO  [Service Thread] 2026-11-24 21:06:12,345 GCInspector.java:294 - G1 Young Generation GC in 312ms.
_LOG_TIME = re.compile(r"^\w+\s+\[[^\]]*\] (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
_GC = re.compile(r"GCInspector\.java:\d+ - .* GC in (\d+)ms")
_COMPACTED = re.compile(r"Compacted \(.* in ([\d,]+)ms")


def _totals() -> tuple[int, int, int]:
    """(cpu some, io some, io full) cumulative stall microseconds."""
    cpu = (_PRESSURE / "cpu").read_text().splitlines()
    io = (_PRESSURE / "io").read_text().splitlines()
    return (
        int(_TOTAL.search(cpu[0]).group(1)),  # type: ignore[union-attr]
        int(_TOTAL.search(io[0]).group(1)),  # type: ignore[union-attr]
        int(_TOTAL.search(io[1]).group(1)),  # type: ignore[union-attr]
    )


class PressureSampler:
    """Samples the machine's CPU and I/O stall totals until closed."""

    def __init__(self, interval: float = 0.02) -> None:
        self.available = (_PRESSURE / "cpu").is_file() and (_PRESSURE / "io").is_file()
        self._interval = interval
        self._times: list[float] = []
        self._samples: list[tuple[int, int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pressure", daemon=True)

    def __enter__(self) -> PressureSampler:
        if self.available:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.is_set():
            # Stamped at the middle of the read: a sampler descheduled between reading the
            # totals and stamping them would pair them with a later time.
            before = time.monotonic()
            sample = _totals()
            self._times.append((before + time.monotonic()) / 2)
            self._samples.append(sample)
            self._stop.wait(self._interval)

    def share(self, start: float, end: float) -> dict[str, float]:
        """Fraction of [start, end] (widened to the samples around it) under each pressure."""
        times = list(self._times)
        if len(times) < 2:
            return {}
        first = max(0, bisect.bisect_right(times, start) - 1)
        last = min(len(times) - 1, bisect.bisect_left(times, end))
        if last <= first:
            return {}
        seconds = times[last] - times[first]
        before, after = self._samples[first], self._samples[last]
        names = ("cpu", "io", "io_full")
        # At most all of the span: the stamps are only as exact as the sampler's scheduling.
        return {
            name: min(1.0, (after[i] - before[i]) / 1e6 / seconds) for i, name in enumerate(names)
        }


def _wall_to_monotonic() -> float:
    """What to add to a Unix time to get the machine's monotonic clock."""
    return time.monotonic() - time.time()


def parse_node_log(lines: Iterable[str], offset: float) -> dict[str, list[tuple[float, float]]]:
    """GC pauses and compactions in a Cassandra log, as monotonic (start, end) spans: each line
    is logged when the work ended, with its duration."""
    spans: dict[str, list[tuple[float, float]]] = {"gc": [], "compaction": []}
    for line in lines:
        stamp = _LOG_TIME.match(line)
        if stamp is None:
            continue
        for kind, pattern in (("gc", _GC), ("compaction", _COMPACTED)):
            found = pattern.search(line)
            if found is None:
                continue
            when = datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=UTC)
            end = when.timestamp() + offset
            spans[kind].append((end - int(found.group(1).replace(",", "")) / 1000, end))
    return spans


def node_log_spans(
    containers: Sequence[str], *, since_wall: float
) -> dict[str, list[tuple[float, float]]]:
    """Every GC pause (>= 200 ms) and compaction the nodes logged since `since_wall`."""
    offset = _wall_to_monotonic()
    merged: dict[str, list[tuple[float, float]]] = {"gc": [], "compaction": []}
    since = datetime.fromtimestamp(since_wall, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    for container in containers:
        result = subprocess.run(
            ["docker", "logs", "--since", since, container],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
        found = parse_node_log((result.stdout + result.stderr).splitlines(), offset)
        for kind, spans in found.items():
            merged[kind].extend(spans)
    return merged
