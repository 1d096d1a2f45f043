"""The backup-under-load benchmark's evidence for a slow write: node log spans on the monotonic
clock, the simulator's request split, and the overlap of a write with a set of spans."""

from __future__ import annotations

from pathlib import Path

from bench.array_timing import SnapshotRequests
from bench.backup_under_load import _overlap
from bench.machine_stalls import PressureSampler, parse_node_log
from ringsnap.plugins.simulators.lunpool import LunPool
from ringsnap.plugins.simulators.server import HttpError, Request, Response, SimulatorApp

GC = (
    "INFO  [Service Thread] 2026-11-24 21:06:12,345 GCInspector.java:294 - G1 Young Generation"
    " GC in 312ms.  G1 Eden Space: 1048576 -> 0"
)
COMPACTED = (
    "INFO  [CompactionExecutor:3] 2026-11-24 21:06:14,000 CompactionTask.java:253 - Compacted"
    " (1f2e) 4 sstables to [/d/nb-5-big,] to level=0.  1.2MiB to 1.1MiB (~91% of original) in"
    " 1,234ms.  Read Throughput = 1MiB/s"
)


def test_gc_pauses_and_compactions_end_when_logged() -> None:
    spans = parse_node_log(
        [GC, "INFO  [main] 2026-11-24 21:06:13,000 X.java:1 - other", COMPACTED], 0.0
    )
    ((gc_start, gc_end),) = spans["gc"]
    assert round(gc_end - gc_start, 3) == 0.312
    assert gc_end == 1795554372.345
    ((start, end),) = spans["compaction"]
    assert round(end - start, 3) == 1.234


def test_the_offset_moves_spans_to_the_monotonic_clock() -> None:
    plain, shifted = parse_node_log([GC], 0.0), parse_node_log([GC], -1795554000.0)
    assert round(plain["gc"][0][1] - shifted["gc"][0][1], 3) == 1795554000.0


def test_a_write_overlaps_the_union_of_spans() -> None:
    spans = [(1.0, 2.0), (1.5, 3.0), (10.0, 11.0)]
    assert _overlap(0.0, 2.5, spans) == 1.5
    assert _overlap(4.0, 5.0, spans) == 0.0


def test_pressure_share_is_stall_time_over_the_span() -> None:
    sampler = PressureSampler()
    sampler._times = [0.0, 1.0, 2.0]
    sampler._samples = [(0, 0, 0), (500_000, 100_000, 0), (1_000_000, 100_000, 50_000)]
    assert sampler.share(0.2, 1.8) == {"cpu": 0.5, "io": 0.05, "io_full": 0.025}


class _Pooled(SimulatorApp):
    vendor = "fake"

    def __init__(self, pool: LunPool) -> None:
        super().__init__()
        self.pool = pool

    def handle(self, request: Request) -> Response:
        if request.method == "POST":
            self.pool.snapshot_group([])
        return Response(200, {})

    def error_response(self, error: HttpError) -> Response:
        return Response(error.status, {})


def test_only_requests_that_reflinked_are_timed(tmp_path: Path) -> None:
    app = _Pooled(LunPool(tmp_path))
    timed = SnapshotRequests(app)
    app.handle(Request("GET", "/x", {}, {}))
    app.handle(Request("POST", "/x", {}, {}))
    (request,) = timed.requests
    assert request.began <= request.reflinks_began <= request.reflinks_ended <= request.ended
    assert request.before + request.reflinks + request.after == request.handler
