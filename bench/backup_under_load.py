"""Backups of a real 3-node cluster under a steady write load, against the same load without them,
and against the floor: the same freeze of the same LUNs with nothing of ringsnap in between.

Agents run as their own processes (as on real nodes), the array is a vendor simulator taking reflink
snapshots of the loop-mounted LUNs, the coordinator is the real one. Each round prints, from the
same cluster and load:
- the freeze window of each backup and its parts on the coordinator's clock (freezing: first
  freeze sent to the last answer; array call; thawing), the agents' own figures beside them (the
  slowest node's freeze and thaw, each a span of its parallel ioctls), and the coordination
  overhead = window - (agents' slowest freeze + array call + agents' slowest thaw); and the
  longest any filesystem stayed frozen, as the agents report it (what a write may stall);
- the floor (`bench.floor`): syncfs + FIFREEZE of every LUN's filesystem in parallel threads, a
  reflink of every LUN image, FITHAW in parallel; as many as there were backups, spaced as the
  backups were, under the same load; and the ratio of ringsnap's window to it (median and p95);
- client write errors and p99/max write latency during the backups, during the floors, and during
  the same time without either (baseline), with the ratio of backups to baseline; the client
  writes from a process of its own (`bench.load_process`), so that the coordinator's CPU work in
  this process never shows up as write latency; the slowest writes (every one over 0.5 s) during
  the backups, the floors and the baseline, each with how long it overlapped a freeze window, a
  memtable flush, a GC pause or a compaction the nodes logged, and the share of its time the
  machine's CPUs or disks had tasks waiting (`bench.machine_stalls`): a write stalled by one of
  them overlaps it by about its latency;
- the array call split into the simulator's handler (before the reflinks, the reflinks, after)
  and driver+HTTP (`bench.array_timing`), and the work E-Series' simulator defers past the answer;
- the load average of the machine at the end of the round.

    .venv/bin/python -m bench.backup_under_load [--backups 20] [--rate 200] [--array ontap]
        [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.array_timing import SnapshotRequests
from bench.floor import Floor, FloorRun, targets_of
from bench.load_process import WriteLoadProcess
from bench.machine_stalls import PressureSampler, node_log_spans
from ringsnap.coordinator.assembly import open_coordinator
from ringsnap.coordinator.model import Backup, FreezeWindow
from ringsnap.coordinator.scheduler import BackupRequest
from ringsnap.coordinator.service import Coordinator
from ringsnap.errors import RingsnapError
from ringsnap.logs import configure
from ringsnap.sandbox.cluster import SandboxCluster
from ringsnap.sandbox.load import LoadReport
from ringsnap.sandbox.stack import CLUSTER_NAME, running_stack


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


def _load_line(label: str, report: LoadReport, seconds: float) -> str:
    return f"{label}: {report.summary()} over {seconds:.1f} s"


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


def _figures(name: str, values: list[float]) -> str:
    return (
        f"  {name:15s} median_ms={_ms(statistics.median(values))}"
        f" p95_ms={_ms(_p95(values))} max_ms={_ms(max(values))}"
    )


def _floors(floor: Floor, count: int, spacing: float) -> list[FloorRun]:
    """`count` floors, one every `spacing` seconds (as the backups came), so that the load dirties
    the filesystems between two of them as much as between two backups."""
    runs: list[FloorRun] = []
    for _ in range(count):
        began = time.monotonic()
        runs.append(floor.take())
        time.sleep(max(0.0, spacing - (time.monotonic() - began)))
    return runs


def _flushes_alone(
    config: Any, count: int, spacing: float, *, one_by_one: bool = False
) -> list[tuple[float, float]]:
    """The backup's flush step alone (every agent's FlushMemtables at once, as the run asks it;
    or, `one_by_one`, each node after the other, to see what staggering would spare the
    clients), `count` times, one every `spacing` seconds: what the flush does to client writes
    without a freeze or a snapshot. Each node's flush as a (start, end) span."""
    spans: list[tuple[float, float]] = []

    async def flush(agent: Any) -> None:
        began = time.monotonic()
        try:
            await agent.flush()
        finally:
            spans.append((began, time.monotonic()))

    async def run() -> None:
        async with open_coordinator(config, source="<bench>") as coordinator:
            agents = [
                a for runtime in coordinator.clusters.values() for a in runtime.agents.values()
            ]
            for _ in range(count):
                began = time.monotonic()
                if one_by_one:
                    for agent in agents:
                        await flush(agent)
                else:
                    await asyncio.gather(*(flush(agent) for agent in agents))
                await asyncio.sleep(max(0.0, spacing - (time.monotonic() - began)))

    asyncio.run(run())
    return spans


def _tap_windows(coordinator: Coordinator, windows: dict[str, FreezeWindow]) -> None:
    """Keep each backup's freeze window as the run measured it: the catalog keeps only some of its
    parts (not `freezing` and `thawing`, the coordinator's own figures)."""
    complete = coordinator.catalog.complete_backup

    def complete_backup(backup_id: str, **details: Any) -> Backup:
        window = details.get("freeze_window")
        if window is not None:
            windows[backup_id] = window
        return complete(backup_id, **details)

    coordinator.catalog.complete_backup = complete_backup  # type: ignore[method-assign]


def _tap_freezes(
    coordinator: Coordinator,
    spans: dict[str, list[float]],
    frozen_for: dict[str, list[float]],
    flushes: list[tuple[float, float]] | None = None,
) -> None:
    """Each backup's freeze on the machine's monotonic clock: [first freeze request sent, last
    thaw answered], to set the slowest client writes beside it; and each node's memtable flush
    (`flushes`), the phase before."""
    flushes = [] if flushes is None else flushes
    for runtime in coordinator.clusters.values():
        for agent in runtime.agents.values():
            freeze, thaw = agent.freeze, agent.thaw

            async def timed_freeze(run_id: str, lease: float, freeze: Any = freeze) -> Any:
                span = spans.setdefault(run_id, [time.monotonic(), 0.0])
                span[0] = min(span[0], time.monotonic())
                return await freeze(run_id, lease)

            async def timed_thaw(run_id: str, thaw: Any = thaw) -> Any:
                receipt = None
                try:
                    receipt = await thaw(run_id)
                    return receipt
                finally:
                    span = spans.setdefault(run_id, [time.monotonic(), 0.0])
                    span[1] = max(span[1], time.monotonic())
                    # The longest any filesystem of the node stayed frozen (agent's clock): what
                    # a write to it may have stalled.
                    frozen = getattr(receipt, "frozen_for_seconds", 0.0)
                    frozen_for.setdefault(run_id, []).append(frozen)

            flush = agent.flush

            async def timed_flush(flush: Any = flush) -> Any:
                began = time.monotonic()
                try:
                    return await flush()
                finally:
                    flushes.append((began, time.monotonic()))

            agent.flush = timed_flush  # type: ignore[method-assign]
            agent.freeze = timed_freeze  # type: ignore[method-assign,assignment]
            agent.thaw = timed_thaw  # type: ignore[method-assign]


def _overlap(start: float, end: float, spans: Sequence[Sequence[float]]) -> float:
    """How long [start, end] overlapped the union of `spans` (which may overlap each other)."""
    covered, reached = 0.0, start
    for a, b in sorted((max(a, start), min(b, end)) for a, b in spans):
        if b > a and b > reached:
            covered += b - max(a, reached)
            reached = b
    return covered


@dataclass
class _Context:
    """What a slow write is set beside: the round's freeze windows and memtable flushes, the
    nodes' GC pauses and compactions, and the machine's CPU and I/O pressure."""

    began: float
    spans: list[list[float]]
    flushes: Sequence[tuple[float, float]]
    node_spans: dict[str, list[tuple[float, float]]]
    pressure: PressureSampler


def _slowest_line(label: str, load: WriteLoadProcess, context: _Context, count: int = 5) -> str:
    """The slowest writes (and every one over 0.5 s, up to 12), each with when it started in the
    round and how long it overlapped a freeze (first freeze sent to last thaw answered), a memtable
    flush, a GC pause, a compaction; and the share of its time the machine's CPUs, or its disks,
    had tasks waiting (pressure stall information). A write stalled by one of these overlaps it by
    about its latency."""
    slow = load.slowest_writes(12)
    chosen = [pair for index, pair in enumerate(slow) if index < count or pair[1] > 0.5]
    parts = []
    for start, latency in chosen:
        end = start + latency
        overlaps = {
            "frozen": _overlap(start, end, context.spans),
            "flush": _overlap(start, end, context.flushes),
            "gc": _overlap(start, end, context.node_spans.get("gc", [])),
            "compaction": _overlap(start, end, context.node_spans.get("compaction", [])),
        }
        pressure = context.pressure.share(start, end)
        described = ", ".join(
            [f"{name} {seconds * 1000:.0f}" for name, seconds in overlaps.items() if seconds]
            + [f"{name} {share * 100:.0f}%" for name, share in pressure.items()]
        )
        parts.append(f"{latency * 1000:.0f} at {start - context.began:.1f} s ({described})")
    return f"  slowest writes {label}, ms: " + "; ".join(parts)


def _array_lines(
    windows: Sequence[FreezeWindow], requests: Sequence[Any], deferred: Sequence[float]
) -> list[str]:
    """The array call on the coordinator's clock split into the simulator's handler (its work
    before the reflinks, the reflinks, its work after) and the rest: driver, HTTP, TLS; and the
    work the simulator deferred to after the answer (E-Series' purge policy)."""
    lines = [_figures("sim_deferred", list(deferred))] if deferred else []
    if not requests or len(requests) != len(windows):
        return [*lines, f"  (array requests timed: {len(requests)} for {len(windows)} windows)"]
    return lines + [
        _figures(name, values)
        for name, values in (
            ("sim_handler", [r.handler for r in requests]),
            ("sim_before", [r.before for r in requests]),
            ("sim_reflinks", [r.reflinks for r in requests]),
            ("sim_after", [r.after for r in requests]),
            (
                "driver+http",
                [w.array_call - r.handler for w, r in zip(windows, requests, strict=True)],
            ),
        )
    ]


def _round(
    args: argparse.Namespace,
    number: int,
    config: Any,
    floor: Floor,
    array: SnapshotRequests,
    containers: Sequence[str],
) -> None:
    backups: list[Backup] = []
    failures: list[str] = []
    windows: dict[str, FreezeWindow] = {}
    spans: dict[str, list[float]] = {}
    frozen_for: dict[str, list[float]] = {}
    flushes: list[tuple[float, float]] = []

    async def back_to_back() -> None:
        async with open_coordinator(config, source="<bench>") as coordinator:
            _tap_windows(coordinator, windows)
            _tap_freezes(coordinator, spans, frozen_for, flushes)
            for _ in range(args.backups):
                request = BackupRequest(CLUSTER_NAME, trigger="bench")
                try:
                    backups.append(await coordinator.backup(request))
                except RingsnapError as exc:  # reported with the round's figures
                    failures.append(str(exc))

    async def delete_them() -> None:
        # Outside the measurements: each round starts from the same array (E-Series keeps at
        # most 32 images per consistency group, and every array's copies pile up otherwise).
        async with open_coordinator(config, source="<bench>") as coordinator:
            for backup in backups:
                try:
                    await coordinator.delete_backup(backup.id, reason="benchmark round done")
                except RingsnapError as exc:
                    print(f"  could not delete {backup.id}: {exc}")
            left = await coordinator.run_pending_cleanups()
            if left:
                print(f"  {left} snapshot clean-ups still pending after the round")

    round_wall, round_began = time.time(), time.monotonic()
    first_request, first_deferred = len(array.requests), len(array.deferred)
    with PressureSampler() as pressure:
        with WriteLoadProcess(args.instance, rate=args.rate) as during:
            started = time.monotonic()
            asyncio.run(back_to_back())
            busy = time.monotonic() - started
        commits = array.requests[first_request:]
        deferred = array.deferred[first_deferred:]
        with WriteLoadProcess(args.instance, rate=args.rate) as floored:
            started = time.monotonic()
            floors = _floors(floor, args.backups, busy / max(1, args.backups))
            floor_busy = time.monotonic() - started
        with WriteLoadProcess(args.instance, rate=args.rate) as baseline:
            time.sleep(busy)
        flushed: WriteLoadProcess | None = None
        alone: list[tuple[float, float]] = []
        flush_busy = 0.0
        if args.flush_phase:
            with WriteLoadProcess(args.instance, rate=args.rate) as flushed:
                started = time.monotonic()
                alone = _flushes_alone(
                    config,
                    args.backups,
                    busy / max(1, args.backups),
                    one_by_one=args.flush_phase == "one-by-one",
                )
                flush_busy = time.monotonic() - started
    asyncio.run(delete_them())
    context = _Context(
        began=round_began,
        spans=[span for span in spans.values() if span[1]],
        flushes=[*flushes, *alone],
        node_spans=node_log_spans(containers, since_wall=round_wall - 2),
        pressure=pressure,
    )

    measured = list(windows.values())
    load = os.getloadavg()
    print(
        f"round {number}: array={args.array} nodes=3 backups={len(backups)} rate={args.rate:g}/s"
        f" load_average={load[0]:.2f},{load[1]:.2f},{load[2]:.2f}"
    )
    if failures:
        print(f"  FAILED backups ({len(failures)}): {'; '.join(failures)}")
    totals = [w.total for w in measured]
    for name, values in (
        ("window", totals),
        ("freezing", [w.freezing or 0.0 for w in measured]),
        ("array_call", [w.array_call for w in measured]),
        ("thawing", [w.thawing or 0.0 for w in measured]),
        ("agents_freeze", [w.slowest_freeze for w in measured]),
        ("agents_thaw", [w.slowest_thaw for w in measured]),
        ("overhead", [w.overhead for w in measured]),
        ("agents_frozen", [max(values) for values in frozen_for.values() if values]),
        # Each node's memtable flush (the phase before the freeze), on the coordinator's clock.
        ("agents_flush", [end - began for began, end in flushes]),
        ("floor", [f.window for f in floors]),
        ("floor_freezing", [f.freezing for f in floors]),
        ("floor_reflinks", [f.snapshot for f in floors]),
        ("floor_thawing", [f.thawing for f in floors]),
    ):
        if values:
            print(_figures(name, values))
    floor_totals = [f.window for f in floors]
    if totals:
        print(
            f"  window/floor: median {statistics.median(totals) / statistics.median(floor_totals):.2f}x,"
            f" p95 {_p95(totals) / _p95(floor_totals):.2f}x"
        )
    for line in _array_lines(measured, commits, deferred):
        print(line)
    print(_load_line("  writes with backups   ", during.report, busy))
    print(_slowest_line("with backups", during, context))
    print(_load_line("  writes with floors    ", floored.report, floor_busy))
    print(_slowest_line("with floors", floored, context))
    print(_load_line("  writes without either ", baseline.report, busy))
    print(_slowest_line("without either", baseline, context))
    if flushed is not None:
        print(_figures("flush_alone", [end - began for began, end in alone]))
        print(
            _load_line(
                f"  writes with flushes alone ({args.flush_phase})", flushed.report, flush_busy
            )
        )
        print(_slowest_line("with flushes alone", flushed, context))
    gc = context.node_spans.get("gc", [])
    print(
        f"  nodes' GC pauses >= 200 ms in the round: {len(gc)}"
        f" (longest {max((b - a for a, b in gc), default=0.0) * 1000:.0f} ms),"
        f" compactions: {len(context.node_spans.get('compaction', []))}"
    )
    base_p99 = baseline.report.percentile(0.99) or 1e-9
    base_max = baseline.report.max_latency or 1e-9
    print(
        f"  ratio backups/baseline: p99 {during.report.percentile(0.99) / base_p99:.2f}x,"
        f" max {during.report.max_latency / base_max:.2f}x",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backups", type=int, default=20)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--array", default="ontap")
    parser.add_argument("--rounds", type=int, default=1, help="measurements in a row, same cluster")
    parser.add_argument("--instance", default="bench-load")
    parser.add_argument(
        "--flush-phase",
        choices=("together", "one-by-one"),
        help="also time client writes during the backups' flush step alone, spaced as they came:"
        " every node at once (as the run flushes) or one node after the other",
    )
    args = parser.parse_args()
    configure(json=True, level="error")

    with (
        SandboxCluster(args.instance, nodes=3, jit="full") as cluster,
        tempfile.TemporaryDirectory(prefix="ringsnap-bench-") as scratch,
        running_stack(cluster, Path(scratch), vendor=args.array, agent_processes=True) as stack,
        Floor(targets_of(cluster.nodes), cluster.pool_dir / ".floor") as floor,
    ):
        config = stack.coordinator_config()
        array = SnapshotRequests(stack.array.app)
        containers = [node.container_name for node in cluster.nodes]
        with WriteLoadProcess(args.instance, rate=args.rate):
            time.sleep(10)  # connections, prepared statements, JIT
        for number in range(1, args.rounds + 1):
            _round(args, number, config, floor, array, containers)


if __name__ == "__main__":
    main()
