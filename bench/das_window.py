"""Freeze window of a DAS backup (every node snapshots its own LVs through its agent) against the
array backups of the same run, on one real 3-node sandbox ring under a steady write load.

Both stacks stand around the same ring at once (`sandbox.stack.running_stack`: agents and an
array simulator taking reflink snapshots of the LUNs; `sandbox.das.running_das_stack`: agents each
running the lvm2 2.03.16 emulator over the same LUN images, adopted as LVs), and the backups
alternate, array then DAS, so that both meet the same load and the same machine. The emulator
takes, per lvm2 command, the time real lvm2 would (`REAL_LATENCY`, or `--latency` overrides),
holding the node's lvm2 lock as lvm2 holds its VG lock; the agents' freezes are real FIFREEZEs.

Printed: per kind, the window (first freeze sent to last thaw answered) and its parts (slowest
node's freeze, snapshot call, slowest thaw), median and max; the DAS/array ratio of the medians;
the latencies used; the machine's load average (`uptime`) at the start and the end.

    .venv/bin/python -m bench.das_window [--backups 5] [--rate 100] [--array ontap]
        [--latency lvcreate=0.35 --latency lvs=0.05 ...] [--freeze-budget 1.9]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from ringsnap.config import validate
from ringsnap.coordinator.assembly import open_coordinator
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.model import BackupState, FreezeWindow
from ringsnap.coordinator.scheduler import BackupRequest
from ringsnap.errors import RingsnapError
from ringsnap.logs import configure
from ringsnap.plugins.simulators.lvm2 import REAL_LATENCY
from ringsnap.sandbox.cluster import SandboxCluster
from ringsnap.sandbox.das import running_das_stack
from ringsnap.sandbox.load import WriteLoad
from ringsnap.sandbox.stack import CLUSTER_NAME, running_stack


def backup_window(config: CoordinatorConfig) -> FreezeWindow | str:
    """The backup's freeze window, or why it failed (a failure is a figure too: a snapshot call
    past the freeze budget thaws the nodes and fails the backup)."""

    async def run() -> FreezeWindow | str:
        async with open_coordinator(config, source="<bench>") as coordinator:
            try:
                backup = await coordinator.backup(BackupRequest(CLUSTER_NAME, trigger="bench"))
            except RingsnapError as exc:
                return str(exc)
            if backup.state is not BackupState.COMPLETE or backup.freeze_window is None:
                return f"backup {backup.id} {backup.state.value}: {backup.error}"
            return backup.freeze_window

    return asyncio.run(run())


def _ms(values: Sequence[float]) -> str:
    return f"median {statistics.median(values) * 1000:7.1f} ms, max {max(values) * 1000:7.1f} ms"


def report(kind: str, results: Sequence[FreezeWindow | str]) -> list[str]:
    windows = [w for w in results if isinstance(w, FreezeWindow)]
    failures = [w for w in results if isinstance(w, str)]
    lines = [f"{kind}: {len(windows)} backups complete, {len(failures)} failed"]
    lines += [f"  failed: {reason[:300]}" for reason in failures[:2]]
    if not windows:
        return lines
    return [
        *lines,
        f"  window         {_ms([w.total for w in windows])}",
        f"  slowest freeze {_ms([w.slowest_freeze for w in windows])}",
        f"  snapshot call  {_ms([w.array_call for w in windows])}",
        f"  slowest thaw   {_ms([w.slowest_thaw for w in windows])}",
        f"  overhead       {_ms([w.overhead for w in windows])}",
    ]


def parse_latency(items: Sequence[str]) -> dict[str, float]:
    latency = dict(REAL_LATENCY)
    for item in items:
        command, _, seconds = item.partition("=")
        if command not in latency or not seconds:
            raise SystemExit(
                f"--latency {item!r}: use COMMAND=SECONDS, COMMAND one of {sorted(latency)}"
            )
        latency[command] = float(seconds)
    return latency


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.das_window")
    parser.add_argument("--backups", type=int, default=5, help="backups of each kind")
    parser.add_argument("--rate", type=float, default=100.0, help="client writes per second")
    parser.add_argument("--array", default="ontap", help="the array simulator of the array runs")
    parser.add_argument("--latency", action="append", default=[], help="COMMAND=SECONDS")
    parser.add_argument(
        "--freeze-budget",
        type=float,
        default=None,
        help="both clusters' freeze_budget_seconds (default: the coordinator's)",
    )
    arguments = parser.parse_args()
    latency = parse_latency(arguments.latency)
    configure(json=False, level="warning")
    print(f"uptime at start: {uptime()}")
    print("emulated lvm2 latency (s): " + ", ".join(f"{k}={v}" for k, v in sorted(latency.items())))
    windows: dict[str, list[FreezeWindow | str]] = {"array": [], "das": []}
    budget = (
        {}
        if arguments.freeze_budget is None
        else {"freeze_budget_seconds": arguments.freeze_budget}
    )
    with (
        tempfile.TemporaryDirectory(prefix="bench-das-") as scratch,
        SandboxCluster(f"bench-das-{os.getpid()}", nodes=3) as cluster,
    ):
        workdir = Path(scratch)
        with (
            running_stack(cluster, workdir / "array", vendor=arguments.array) as array,
            running_das_stack(cluster, workdir / "das", latency=latency) as das,
            WriteLoad(cluster.session(), rate=arguments.rate) as load,
        ):
            das_data = das.coordinator_data(workdir / "das-coordinator")
            das_data["clusters"][0].update(budget)
            configs = {
                "array": array.coordinator_config(**budget),
                "das": validate(das_data, CoordinatorConfig, source="<bench das>"),
            }
            for _ in range(arguments.backups):
                for kind, config in configs.items():
                    windows[kind].append(backup_window(config))
        print(f"write load: {load.report.summary()}")
    for kind, measured in windows.items():
        print("\n".join(report(kind if kind == "das" else f"array ({arguments.array})", measured)))
    totals = {
        kind: [w.total for w in measured if isinstance(w, FreezeWindow)]
        for kind, measured in windows.items()
    }
    if totals["das"] and totals["array"]:
        ratio = statistics.median(totals["das"]) / statistics.median(totals["array"])
        print(f"DAS window / array window (medians): {ratio:.2f}x")
    print(f"uptime at end: {uptime()}")


if __name__ == "__main__":
    main()
