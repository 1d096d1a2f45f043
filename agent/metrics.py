"""Prometheus metrics of one agent, in a registry of its own (several agents share a process in
the sandbox and the tests), served on `[metrics] listen` when `[metrics] enabled` (off by default).

What only the node sees: freezes and their durations, lease renewals and expirations (the agent
thawed by itself: the coordinator stopped renewing), thaw-all runs at start, flushes, the bytes and
files each S3 transfer moved and the transfers that failed, the restore steps it ran. Series exist
from the start at zero, so that `increase()` in an alert sees the first event.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ringsnap import package_version
from ringsnap.agent.s3.progress import Progress

DIRECTIONS = ("upload", "download")
RESULTS = ("ok", "failed")
#: The restore steps an agent runs, in the order a restore asks for them.
RESTORE_STEPS = (
    "stop_cassandra",
    "release_volumes",
    "attach_volumes",
    "discard_replay_state",
    "restore_snapshot",
    "install_s3",
    "start_cassandra",
)
# A FIFREEZE takes milliseconds (seconds when the filesystem must write back a lot first); a
# filesystem stays frozen for the backup's window, 250 ms on a good day.
_FREEZE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_FROZEN_BUCKETS = (0.05, 0.1, 0.15, 0.25, 0.35, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0)
_FLUSH_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
_STEP_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)


class AgentMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.freezes = Counter(
            "ringsnap_agent_freezes",
            "Freeze operations, by result (failed: a filesystem could not be frozen).",
            ["result"],
            registry=r,
        )
        self.freeze_seconds = Histogram(
            "ringsnap_agent_freeze_duration_seconds",
            "Time the FIFREEZE of one filesystem took.",
            buckets=_FREEZE_BUCKETS,
            registry=r,
        )
        self.frozen_seconds = Histogram(
            "ringsnap_agent_frozen_duration_seconds",
            "Time one filesystem stayed frozen, freeze to thaw.",
            buckets=_FROZEN_BUCKETS,
            registry=r,
        )
        self.lease_renewals = Counter(
            "ringsnap_agent_lease_renewals", "Freeze leases renewed by the coordinator.", registry=r
        )
        self.lease_expirations = Counter(
            "ringsnap_agent_lease_expirations",
            "Freeze leases that ran out: the agent thawed by itself.",
            registry=r,
        )
        self.thaw_all_runs = Counter(
            "ringsnap_agent_thaw_all_runs",
            "Thaws of every recorded freeze at the agent's start (what a previous process left).",
            registry=r,
        )
        self.thaw_all_thawed = Counter(
            "ringsnap_agent_thaw_all_thawed_filesystems",
            "Filesystems those runs found frozen and thawed.",
            registry=r,
        )
        self.flushes = Counter(
            "ringsnap_agent_flushes", "Memtable flushes, by result.", ["result"], registry=r
        )
        self.flush_seconds = Histogram(
            "ringsnap_agent_flush_duration_seconds",
            "Time a memtable flush took.",
            buckets=_FLUSH_BUCKETS,
            registry=r,
        )
        self.transfer_bytes = Counter(
            "ringsnap_agent_transfer_bytes",
            "Bytes moved to (upload) or from (download) S3.",
            ["direction"],
            registry=r,
        )
        self.transfer_files = Counter(
            "ringsnap_agent_transfer_files",
            "Files moved to or from S3 (the ones already in place not counted).",
            ["direction"],
            registry=r,
        )
        self.transfer_errors = Counter(
            "ringsnap_agent_transfer_errors",
            "S3 exports (upload) and downloads that failed (not the ones their caller cancelled).",
            ["direction"],
            registry=r,
        )
        self.restore_steps = Counter(
            "ringsnap_agent_restore_steps",
            "Restore steps run on this node, by step and result.",
            ["step", "result"],
            registry=r,
        )
        self.restore_step_seconds = Histogram(
            "ringsnap_agent_restore_step_duration_seconds",
            "Time a restore step took on this node.",
            ["step"],
            buckets=_STEP_BUCKETS,
            registry=r,
        )
        self.lvm_pool_used = Gauge(
            "ringsnap_agent_lvm_pool_used_percent",
            "Use of a thin pool of this node's [lvm] volumes (part: data or metadata), as of the"
            " last space check before a node-local snapshot.",
            ["pool", "part"],
            registry=r,
        )
        self.lvm_free_bytes = Gauge(
            "ringsnap_agent_lvm_volume_group_free_bytes",
            "Free bytes of a volume group holding thick [lvm] volumes (their snapshots' copy-on-"
            "write space comes from it), as of the last space check.",
            ["vg"],
            registry=r,
        )
        Gauge(
            "ringsnap_agent_build_info",
            "Always 1; the version label says which.",
            ["version"],
            registry=r,
        ).labels(version=package_version()).set(1)
        for result in RESULTS:
            self.freezes.labels(result=result)
            self.flushes.labels(result=result)
            for step in RESTORE_STEPS:
                self.restore_steps.labels(step=step, result=result)
        for step in RESTORE_STEPS:
            self.restore_step_seconds.labels(step=step)
        for direction in DIRECTIONS:
            self.transfer_bytes.labels(direction=direction)
            self.transfer_files.labels(direction=direction)
            self.transfer_errors.labels(direction=direction)

    @contextlib.asynccontextmanager
    async def restore_step(self, step: str) -> AsyncIterator[None]:
        """Count and time one restore step; a step that raises counts as failed."""
        if step not in RESTORE_STEPS:
            raise ValueError(f"restore step must be one of {RESTORE_STEPS}, not {step!r}")
        started = time.monotonic()
        result = "failed"
        try:
            yield
            result = "ok"
        finally:
            self.restore_steps.labels(step=step, result=result).inc()
            self.restore_step_seconds.labels(step=step).observe(time.monotonic() - started)

    def meter(
        self, direction: str, report: Callable[[Progress], None] | None = None
    ) -> Callable[[Progress], None]:
        """A progress reporter for one transfer (one `Tracker`) that adds what moved since its last
        report to the counters, then passes the report on to `report`. Called from the transfer
        threads; a tracker's figures only grow (but for a retried part, which is taken back)."""
        if direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {DIRECTIONS}, not {direction!r}")
        lock = threading.Lock()
        seen = {"bytes": 0, "files": 0}
        moved_bytes = self.transfer_bytes.labels(direction=direction)
        moved_files = self.transfer_files.labels(direction=direction)

        def observe(progress: Progress) -> None:
            with lock:
                more_bytes = progress.bytes_transferred - seen["bytes"]
                more_files = progress.files_transferred - seen["files"]
                seen["bytes"] = max(seen["bytes"], progress.bytes_transferred)
                seen["files"] = max(seen["files"], progress.files_transferred)
            if more_bytes > 0:
                moved_bytes.inc(more_bytes)
            if more_files > 0:
                moved_files.inc(more_files)
            if report is not None:
                report(progress)

        return observe

    def transfer_failed(self, direction: str) -> None:
        self.transfer_errors.labels(direction=direction).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
