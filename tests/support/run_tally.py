"""A kind of run for the engine's tests: three steps per node (`fetch`, `apply`, `seal`), `apply`
not idempotent, each with an undo; every effect appended to a file (so that it survives a
SIGKILL) as "<node>:<step>" or "<node>:undo-<step>".

Run as a module it is the process the tests kill: `python -m tests.support.run_tally CATALOG
EFFECTS KILL_AT [FAIL_NODE]` opens the catalog, resumes the run found there (or plans a new one)
and SIGKILLs itself just after the KILL_AT-th save that marked a step reached (-1: never; 0: just
after the run's first save). It prints the ids of the runs the catalog marked interrupted at open.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from pydantic import TypeAdapter

from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.runs.engine import RunEngine, StepContext
from ringsnap.coordinator.runs.journal import StoredRuns
from ringsnap.coordinator.runs.kind import Step
from ringsnap.coordinator.runs.model import NodeProgress, RunRecord

RUN_ID = "tally-1"
NODES = ("node1", "node2", "node3")
STEPS = ("fetch", "apply", "seal")


@dataclass(frozen=True)
class Tally:
    """The kind's payload: what the run counted (to show steps can change it)."""

    applied: tuple[str, ...] = ()


ADAPTER: TypeAdapter[RunRecord[Tally]] = TypeAdapter(RunRecord[Tally])


class TallyKind:
    name = "tally"

    def __init__(self, effects: Path, *, fail: str = "", scope_run: bool = False) -> None:
        self.effects = effects
        #: "<node>:<step>" that raises.
        self.fail = fail
        self.scope_run = scope_run

    def _note(self, line: str) -> None:
        with self.effects.open("a", encoding="utf-8") as out:
            out.write(line + "\n")
            out.flush()
            os.fsync(out.fileno())

    def steps(self) -> Sequence[Step[Tally]]:
        def do(step: str) -> Step[Tally]:
            async def call(ctx: StepContext[Tally]) -> None:
                if f"{ctx.node}:{step}" == self.fail:
                    raise RuntimeError(f"{step} broke on {ctx.node}")
                self._note(f"{ctx.node}:{step}")
                if step == "apply":
                    node = ctx.node
                    await ctx.update(lambda t: replace(t, applied=(*t.applied, node)))

            async def undo(ctx: StepContext[Tally]) -> None:
                self._note(f"{ctx.node}:undo-{step}")

            return Step(step, call, undo=undo, idempotent=step != "apply")

        return [do(s) for s in STEPS]


def plan(nodes: Sequence[str] = NODES) -> RunRecord[Tally]:
    return RunRecord(
        id=RUN_ID,
        kind="tally",
        cluster="c1",
        started_at=datetime.now(UTC),
        nodes=tuple(NodeProgress(n) for n in nodes),
        payload=Tally(),
    )


class KillingJournal:
    """Saves to the catalog; SIGKILLs the process after the `kill_at`-th reached-step save."""

    def __init__(self, runs: StoredRuns[Tally], kill_at: int) -> None:
        self.runs = runs
        self.kill_at = kill_at
        self.boundaries = 0
        self.reached = 0

    async def save(self, record: RunRecord[Tally]) -> None:
        await self.runs.save(record)
        reached = sum(STEPS.index(n.reached) + 1 for n in record.nodes if n.reached)
        if reached > self.reached or self.boundaries == 0:
            self.reached = reached
            if self.boundaries == self.kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            self.boundaries += 1


async def _main(catalog_path: str, effects: str, kill_at: int, fail: str) -> None:
    with Catalog(catalog_path) as catalog:
        print("interrupted:" + ",".join(catalog.interrupted_runs()), flush=True)
        runs = StoredRuns(catalog, ADAPTER)
        record = await runs.find(RUN_ID) or plan()
        # One node at a time: a kill at a boundary never lands inside another node's
        # non-idempotent step (that case has its own test).
        engine = RunEngine(
            TallyKind(Path(effects), fail=fail), KillingJournal(runs, kill_at), parallel_nodes=1
        )
        done = await engine.run(record)
        print("state:" + done.state.value, flush=True)


if __name__ == "__main__":
    asyncio.run(
        _main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else "")
    )
