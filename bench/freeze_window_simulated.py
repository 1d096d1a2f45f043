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
import time
from collections.abc import Sequence
from datetime import UTC, datetime

from ringsnap.coordinator.backup import BackupSettings, BackupWorkflow, NodeTarget, VolumeTarget
from ringsnap.coordinator.ports import FreezeReceipt, NodeFacts, SSTable, ThawReceipt
from ringsnap.logs import configure
from ringsnap.plugins.types import SnapshotInfo, SnapshotRef, Volume, VolumeSnapshot

FREEZE_S = 0.002
THAW_S = 0.001
ARRAY_CALL_S = 0.010


class SimulatedAgent:
    def __init__(self, node: str) -> None:
        self._node = node

    @property
    def node(self) -> str:
        return self._node

    async def node_info(self) -> NodeFacts:
        return NodeFacts("bench", f"host-{self._node}", "dc1", "r1", "5.0.7", "127.0.0.1")

    async def flush(self) -> float:
        return 0.0

    async def freeze(self, operation_id: str, lease_seconds: float) -> FreezeReceipt:
        started = time.perf_counter()
        await asyncio.sleep(FREEZE_S)
        return FreezeReceipt(
            ("/data", "/commitlog"), time.perf_counter() - started, datetime.now(UTC)
        )

    async def renew(self, operation_id: str, lease_seconds: float) -> datetime:
        return datetime.now(UTC)

    async def thaw(self, operation_id: str) -> ThawReceipt:
        started = time.perf_counter()
        await asyncio.sleep(THAW_S)
        return ThawReceipt(("/data", "/commitlog"), time.perf_counter() - started, 0.0, False)

    async def manifest(self) -> list[SSTable]:
        return []


class SimulatedArray:
    def __init__(self, volumes: Sequence[Volume]) -> None:
        self._volumes = list(volumes)

    @property
    def array(self) -> str:
        return "sim"

    async def check(self) -> None:
        return None

    async def list_volumes(self) -> Sequence[Volume]:
        return self._volumes

    async def create_group_snapshot(self, volumes: Sequence[Volume], name: str) -> SnapshotRef:
        await asyncio.sleep(ARRAY_CALL_S)
        members = tuple(VolumeSnapshot(v, name) for v in volumes)
        return SnapshotRef("sim", "sim", "g", name, name, datetime.now(UTC), members)

    async def list_snapshots(self, volumes: Sequence[Volume]) -> Sequence[SnapshotInfo]:
        return []

    async def delete_snapshot(self, ref: SnapshotRef) -> None:
        return None


def build(agents: int) -> BackupWorkflow:
    nodes = []
    volumes = []
    for i in range(agents):
        name = f"n{i}"
        targets = (
            VolumeTarget("sim", f"{name}-data", "data"),
            VolumeTarget("sim", f"{name}-cl", "commitlog"),
        )
        volumes += [Volume(t.volume, t.volume) for t in targets]
        nodes.append(NodeTarget(name, SimulatedAgent(name), targets))
    return BackupWorkflow("bench", nodes, {"sim": SimulatedArray(volumes)}, None)


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
