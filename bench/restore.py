"""A whole-ring restore to verified, against a plain restart of the same ring, in one run.

The restart is what no restore can beat: every node stopped (drained), then started as the
restore's start step starts them (the cluster's seeds at once until they gossip, then every other
node at once; with no seed configured, the first node), until the ring serves again, through the
same agents. The sandbox names every node a seed, so both start the whole ring at once. The restore adds the pre-restore canary, the
release, the array revert, the attach, the manifest check and the proof. Prints both, each
restore's time per step, and the difference (target: restore <= restart + 10 s).

    .venv/bin/python -m bench.restore [--rounds 2] [--array ontap]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from ringsnap.coordinator.assembly import open_coordinator
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.model import RestoreRecord, RestoreState
from ringsnap.coordinator.restore.plan import RestoreRequest
from ringsnap.coordinator.restore.session import open_restore_session
from ringsnap.coordinator.scheduler import BackupRequest
from ringsnap.logs import configure
from ringsnap.sandbox.cluster import SandboxCluster
from ringsnap.sandbox.stack import CLUSTER_NAME, running_stack


def start_groups(nodes: Sequence[str], seeds: Sequence[str]) -> tuple[list[str], list[str]]:
    """The restore's start order (its start step): the configured seeds first, all at once, else
    the first node; then every other node at once."""
    first = [name for name in nodes if name in seeds] or list(nodes[:1])
    return first, [name for name in nodes if name not in first]


async def _restart(config: CoordinatorConfig) -> float:
    """Stop every node (drain), start them again in the restore's order, wait for the ring."""
    async with open_restore_session(config, CLUSTER_NAME) as session:
        started = time.monotonic()
        agents = session.agents
        await asyncio.gather(*(a.stop_cassandra(drain=True) for a in agents.values()))
        seeds, others = start_groups(list(agents), session.cluster.seeds)
        await asyncio.gather(
            *(agents[name].start_cassandra(wait_seconds=600, until_gossip=True) for name in seeds)
        )
        await asyncio.gather(*(agents[name].start_cassandra(wait_seconds=600) for name in others))
        host_ids = [(await a.node_info()).host_id for a in agents.values()]
        session.ring.reconnect()
        await session.ring.wait_for_ring(host_ids, 600)
        return time.monotonic() - started


async def _restore(config: CoordinatorConfig) -> RestoreRecord:
    async with open_coordinator(config, source="<bench>") as coordinator:
        backup = await coordinator.backup(BackupRequest(CLUSTER_NAME, trigger="bench"))
    async with open_restore_session(config, CLUSTER_NAME) as session:
        plan = await session.plan(RestoreRequest(backup.id, requested_by="bench"))
        if plan.refused:
            raise SystemExit("restore refused: " + "; ".join(plan.refusals))
        return await session.run(plan, "bench")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--array", default="ontap")
    parser.add_argument("--instance", default="bench-restore")
    args = parser.parse_args()
    configure(json=True, level="error")

    with (
        SandboxCluster(args.instance, nodes=3, jit="full") as cluster,
        tempfile.TemporaryDirectory(prefix="ringsnap-bench-") as scratch,
        running_stack(cluster, Path(scratch), vendor=args.array, agent_processes=True) as stack,
    ):
        config = stack.coordinator_config()
        restarts: list[float] = []
        restores: list[RestoreRecord] = []
        for round_ in range(1, args.rounds + 1):
            restarts.append(asyncio.run(_restart(config)))
            cluster.refresh()
            record = asyncio.run(_restore(config))
            cluster.refresh()
            if record.state is not RestoreState.PROVEN:
                raise SystemExit(f"round {round_}: restore {record.id} is {record.state.value}")
            restores.append(record)
            total = (record.finished_at - record.started_at).total_seconds()  # type: ignore[operator]
            print(
                f"round {round_}: restart {restarts[-1]:.1f} s, restore to verified {total:.1f} s"
            )
            for timing in record.timings:
                print(f"    {timing.phase:<22} {timing.seconds:7.2f} s")

        totals = [(r.finished_at - r.started_at).total_seconds() for r in restores]  # type: ignore[operator]
        restart, restore = statistics.median(restarts), statistics.median(totals)
        print(f"\n{args.array}, 3 nodes, {args.rounds} rounds (medians)")
        print(f"plain restart of the ring:   {restart:.1f} s")
        print(f"restore to verified:         {restore:.1f} s")
        print(f"difference:                  {restore - restart:+.1f} s (target <= +10 s)")
        print(f"ratio restore / restart:     {restore / restart:.2f}")


if __name__ == "__main__":
    main()
