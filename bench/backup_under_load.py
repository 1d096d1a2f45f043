"""Backups of a real 3-node cluster under a steady write load, against the same load without them.

Agents run as their own processes (as on real nodes), the array is a vendor simulator taking reflink
snapshots of the loop-mounted LUNs, the coordinator is the real one. Prints, from the same run:
- the freeze window of each backup and its parts on the coordinator's clock (freezing: first
  freeze sent to the last answer; array call; thawing), the agents' own figures beside them (the
  slowest node's freeze and thaw, each a span of its parallel ioctls), and the coordination
  overhead = window - (agents' slowest freeze + array call + agents' slowest thaw);
- client write errors and p99/max write latency during N back-to-back backups, and during the same
  time without backups (baseline), with their ratio.

    .venv/bin/python -m bench.backup_under_load [--backups 20] [--rate 200] [--array ontap]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from ringsnap.coordinator.assembly import open_coordinator
from ringsnap.coordinator.model import Backup, BackupState
from ringsnap.coordinator.scheduler import BackupRequest
from ringsnap.logs import configure
from ringsnap.sandbox.cluster import SandboxCluster
from ringsnap.sandbox.load import LoadReport, WriteLoad
from ringsnap.sandbox.stack import CLUSTER_NAME, running_stack


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


def _load_line(label: str, report: LoadReport, seconds: float) -> str:
    return f"{label}: {report.summary()} over {seconds:.1f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backups", type=int, default=20)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--array", default="ontap")
    parser.add_argument("--instance", default="bench-load")
    args = parser.parse_args()
    configure(json=True, level="error")

    with (
        SandboxCluster(args.instance, nodes=3) as cluster,
        tempfile.TemporaryDirectory(prefix="ringsnap-bench-") as scratch,
        running_stack(cluster, Path(scratch), vendor=args.array, agent_processes=True) as stack,
    ):
        config = stack.coordinator_config()
        session = cluster.session()
        backups: list[Backup] = []

        async def back_to_back() -> None:
            async with open_coordinator(config, source="<bench>") as coordinator:
                for _ in range(args.backups):
                    request = BackupRequest(CLUSTER_NAME, trigger="bench")
                    backups.append(await coordinator.backup(request))

        with WriteLoad(session, rate=args.rate) as warmup:
            time.sleep(10)  # connections, prepared statements, JIT
        del warmup
        started = time.monotonic()
        with WriteLoad(session, rate=args.rate) as during:
            asyncio.run(back_to_back())
        busy = time.monotonic() - started
        with WriteLoad(session, rate=args.rate) as baseline:
            time.sleep(busy)

    windows = [b.freeze_window for b in backups if b.freeze_window is not None]
    assert all(b.state is BackupState.COMPLETE for b in backups)
    med = statistics.median
    print(f"array={args.array} nodes=3 backups={len(backups)} rate={args.rate:g}/s")
    for name, values in (
        ("window", [w.total for w in windows]),
        ("freezing", [w.freezing or 0.0 for w in windows]),
        ("array_call", [w.array_call for w in windows]),
        ("thawing", [w.thawing or 0.0 for w in windows]),
        ("agents_freeze", [w.slowest_freeze for w in windows]),
        ("agents_thaw", [w.slowest_thaw for w in windows]),
        ("overhead", [w.overhead for w in windows]),
    ):
        print(f"  {name:15s} median_ms={_ms(med(values))} max_ms={_ms(max(values))}")
    print(_load_line("  writes with backups   ", during.report, busy))
    print(_load_line("  writes without backups", baseline.report, busy))
    base_p99 = baseline.report.percentile(0.99) or 1e-9
    base_max = baseline.report.max_latency or 1e-9
    print(
        f"  ratio with/without: p99 {during.report.percentile(0.99) / base_p99:.2f}x,"
        f" max {during.report.max_latency / base_max:.2f}x"
    )


if __name__ == "__main__":
    main()
