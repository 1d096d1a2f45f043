"""Coordination overhead of the freeze barrier with many simulated agents.

Runs the real `BackupWorkflow` against in-process agents whose freeze and thaw are fake (a short
sleep standing in for the ioctl) and an array whose snapshot call takes a fixed time, then reports
the freeze window and its parts: overhead = window - (slowest freeze + array call + slowest thaw).

    .venv/bin/python -m bench.freeze_window_simulated [--agents 1000] [--runs 10]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics

from ringsnap.coordinator.backup import BackupSettings, BackupWorkflow
from ringsnap.logs import configure
from tests.support.fakes import FakeAgent, FakeArray, node_targets, volumes_of

FREEZE_S = 0.002
THAW_S = 0.001
ARRAY_CALL_S = 0.010


def build(agents: int) -> BackupWorkflow:
    nodes = [
        FakeAgent(f"n{i}", leases=False, freeze_seconds=FREEZE_S, thaw_seconds=THAW_S)
        for i in range(agents)
    ]
    array = FakeArray("sim", volumes_of(node.node for node in nodes))
    array.delay = ARRAY_CALL_S
    return BackupWorkflow("bench", node_targets(nodes, ["sim"]), {"sim": array}, None)


async def measure(agents: int, runs: int) -> None:
    workflow = build(agents)
    settings = BackupSettings(freeze_budget=5.0, lease=2.0)
    windows = []
    for _ in range(runs):
        run = await workflow.run(settings, trigger="bench")
        assert run.window is not None
        windows.append(run.window)
    med = statistics.median
    print(
        f"agents={agents} runs={runs} "
        f"window_ms={med(w.total for w in windows) * 1000:.1f} "
        f"slowest_freeze_ms={med(w.slowest_freeze for w in windows) * 1000:.1f} "
        f"array_call_ms={med(w.array_call for w in windows) * 1000:.1f} "
        f"slowest_thaw_ms={med(w.slowest_thaw for w in windows) * 1000:.1f} "
        f"overhead_ms_median={med(w.overhead for w in windows) * 1000:.1f} "
        f"overhead_ms_max={max(w.overhead for w in windows) * 1000:.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--agents", type=int, nargs="*", default=[3, 100, 1000])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    configure(json=True, level="warning")
    for count in args.agents:
        asyncio.run(measure(count, args.runs))


if __name__ == "__main__":
    main()
