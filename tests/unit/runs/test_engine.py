"""The run engine with a kind of three steps per node on three fake nodes: order, records saved
under one lock while nodes run in parallel, failures that stop a node and the run before its next
run step, undo on failure, abort in reverse (and an abort that is itself stopped, resumed), skips,
cancellation; and the catalog marking runs found running at open interrupted."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.runs.engine import RunEngine, RunFailed, RunRefused, StepContext
from ringsnap.coordinator.runs.journal import StoredRuns
from ringsnap.coordinator.runs.kind import Scope, Step
from ringsnap.coordinator.runs.model import RUN, RunRecord, RunState
from tests.support.run_tally import ADAPTER, NODES, RUN_ID, Tally, TallyKind, plan


class Journal:
    def __init__(self) -> None:
        self.saved: list[RunRecord[Tally]] = []
        self.calls = 0

    async def save(self, record: RunRecord[Tally]) -> None:
        # A save yields, as the catalog's does, some longer than others: without the engine's
        # lock a later record could land before an earlier one.
        self.calls += 1
        await asyncio.sleep(0.002 * (self.calls % 3))
        self.saved.append(record)


def effects(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def run(kind: TallyKind, record: RunRecord[Tally] | None = None) -> RunRecord[Tally]:
    return asyncio.run(RunEngine(kind, Journal()).run(record or plan()))


def test_every_node_goes_through_its_steps_in_order_and_the_record_says_so(
    tmp_path: Path,
) -> None:
    journal = Journal()
    engine = RunEngine(TallyKind(tmp_path / "e"), journal, parallel_nodes=3)
    record = asyncio.run(engine.run(plan()))
    assert record.state is RunState.SUCCEEDED and record.finished_at is not None
    for node in NODES:
        mine = [e for e in effects(tmp_path / "e") if e.startswith(node + ":")]
        assert mine == [f"{node}:fetch", f"{node}:apply", f"{node}:seal"]
        progress = record.progress(node)
        assert (progress.reached, progress.begun, progress.error) == ("seal", "", "")
        assert [s for s, _ in progress.timings] == ["fetch", "apply", "seal"]
    # Three nodes changed the payload concurrently: no change was lost (one lock, latest record).
    assert sorted(record.payload.applied) == sorted(NODES)
    # Saved after every change: begun and reached of each step on each node, plus start and end.
    assert len(journal.saved) == 2 + 3 * 3 * 2 + 3
    assert journal.saved[-1] == record
    # In order: each record saved holds every change of the one before (one lock).
    for before, after in zip(journal.saved, journal.saved[1:], strict=False):
        assert set(before.payload.applied) <= set(after.payload.applied)
        assert sum(len(n.timings) for n in before.nodes) <= sum(len(n.timings) for n in after.nodes)


def test_a_failed_node_keeps_its_error_the_others_finish_and_the_run_fails(tmp_path: Path) -> None:
    journal = Journal()
    engine = RunEngine(TallyKind(tmp_path / "e", fail="node2:apply"), journal)
    with pytest.raises(RunFailed, match=r"node node2: apply: apply broke on node2") as failed:
        asyncio.run(engine.run(plan()))
    record = journal.saved[-1]
    assert failed.value.record == record
    assert record.state is RunState.FAILED and "node node2: apply" in record.error
    assert record.progress("node2").reached == "fetch"
    assert record.progress("node2").error == "apply: apply broke on node2"
    assert all(record.progress(n).reached == "seal" for n in ("node1", "node3"))
    # A resume runs node2 from its step: nothing the others did runs again.
    before = effects(tmp_path / "e")
    engine = RunEngine(TallyKind(tmp_path / "e"), journal)
    done = asyncio.run(engine.run(record))
    assert done.state is RunState.SUCCEEDED and not done.error
    assert effects(tmp_path / "e")[len(before) :] == ["node2:apply", "node2:seal"]


class WithRunSteps(TallyKind):
    """The tally, then a run step `publish`, with a node step `prepare` before the tally whose
    undo runs at once when a later step of its node fails."""

    def steps(self) -> Sequence[Step[Tally]]:
        async def prepare(ctx: StepContext[Tally]) -> None:
            self._note(f"{ctx.node}:prepare")

        async def unprepare(ctx: StepContext[Tally]) -> None:
            self._note(f"{ctx.node}:undo-prepare")

        async def publish(ctx: StepContext[Tally]) -> None:
            self._note("run:publish")

        return [
            Step("prepare", prepare, undo=unprepare, undo_on_failure=True),
            *super().steps(),
            Step("publish", publish, scope=Scope.RUN),
        ]


def test_a_failure_undoes_what_must_not_outlive_it_and_stops_before_the_run_step(
    tmp_path: Path,
) -> None:
    journal = Journal()
    engine = RunEngine(WithRunSteps(tmp_path / "e", fail="node3:seal"), journal)
    with pytest.raises(RunFailed):
        asyncio.run(engine.run(plan()))
    seen = effects(tmp_path / "e")
    assert "run:publish" not in seen, "the run step ran after a node failed"
    assert seen[-1] == "node3:undo-prepare"
    # Its mark went back before `prepare`: a resume prepares again.
    assert journal.saved[-1].progress("node3").reached == ""
    assert "undo-prepare" not in " ".join(e for e in seen if not e.startswith("node3"))
    done = asyncio.run(RunEngine(WithRunSteps(tmp_path / "e"), journal).run(journal.saved[-1]))
    assert done.state is RunState.SUCCEEDED and done.run.reached == "publish"
    assert effects(tmp_path / "e")[-1] == "run:publish"
    assert [e for e in effects(tmp_path / "e") if e.startswith("node3:")][-4:] == [
        "node3:prepare",
        "node3:fetch",
        "node3:apply",
        "node3:seal",
    ]


def test_abort_undoes_every_step_reached_in_reverse(tmp_path: Path) -> None:
    journal = Journal()
    with pytest.raises(RunFailed):
        asyncio.run(RunEngine(TallyKind(tmp_path / "e", fail="node2:apply"), journal).run(plan()))
    start = len(effects(tmp_path / "e"))
    aborted = asyncio.run(RunEngine(TallyKind(tmp_path / "e"), journal).abort(journal.saved[-1]))
    assert aborted.state is RunState.ABORTED and aborted.finished_at is not None
    undone = effects(tmp_path / "e")[start:]
    assert sorted(undone[:2]) == ["node1:undo-seal", "node3:undo-seal"]
    assert sorted(undone[2:4]) == ["node1:undo-apply", "node3:undo-apply"]
    assert sorted(undone[4:]) == ["node1:undo-fetch", "node2:undo-fetch", "node3:undo-fetch"]
    assert all(n.reached == "" for n in aborted.nodes)
    with pytest.raises(RunRefused, match="aborted"):
        asyncio.run(RunEngine(TallyKind(tmp_path / "e"), journal).abort(aborted))


class BrokenUndo(TallyKind):
    def steps(self) -> Sequence[Step[Tally]]:
        steps = list(super().steps())

        async def broken(ctx: StepContext[Tally]) -> None:
            raise RuntimeError(f"array down for {ctx.node}")

        return [replace(steps[0], undo=broken), *steps[1:]]


def test_an_abort_that_stops_keeps_the_run_and_a_second_abort_goes_on(tmp_path: Path) -> None:
    journal = Journal()
    with pytest.raises(RunFailed):
        asyncio.run(RunEngine(TallyKind(tmp_path / "x", fail="node2:seal"), journal).run(plan()))
    with pytest.raises(RunFailed, match=r"abort stopped: node node\d: undo of fetch: array down"):
        asyncio.run(RunEngine(BrokenUndo(tmp_path / "x"), journal).abort(journal.saved[-1]))
    stopped = journal.saved[-1]
    assert stopped.state is RunState.FAILED and stopped.error.startswith("abort stopped")
    # The undos that ran stepped their marks back: the second abort does not run them again.
    assert all(n.reached == "fetch" for n in stopped.nodes)
    start = len(effects(tmp_path / "x"))
    aborted = asyncio.run(RunEngine(TallyKind(tmp_path / "x"), journal).abort(stopped))
    assert aborted.state is RunState.ABORTED
    assert sorted(effects(tmp_path / "x")[start:]) == [f"{n}:undo-fetch" for n in NODES]


def test_a_step_that_does_not_apply_to_a_node_is_passed(tmp_path: Path) -> None:
    class Skipping(TallyKind):
        def steps(self) -> Sequence[Step[Tally]]:
            steps = list(super().steps())
            return [replace(steps[0], applies=lambda r, node: node != "node2"), *steps[1:]]

    record = run(Skipping(tmp_path / "e"))
    assert record.state is RunState.SUCCEEDED
    assert "node2:fetch" not in effects(tmp_path / "e")
    assert "node2:apply" in effects(tmp_path / "e")


def test_cancel_stops_before_the_next_step_and_says_so(tmp_path: Path) -> None:
    journal = Journal()
    kind = TallyKind(tmp_path / "e")
    engine = RunEngine(kind, journal, parallel_nodes=1)
    steps = list(kind.steps())

    async def fetch_then_cancel(ctx: StepContext[Tally]) -> None:
        await steps[0].do(ctx)
        engine.cancel("the operator pressed Ctrl-C")

    kind.steps = lambda: [replace(steps[0], do=fetch_then_cancel), *steps[1:]]  # type: ignore[method-assign]
    engine = RunEngine(kind, journal, parallel_nodes=1)
    with pytest.raises(RunFailed, match="the operator pressed Ctrl-C"):
        asyncio.run(engine.run(plan()))
    assert effects(tmp_path / "e") == ["node1:fetch"]
    assert journal.saved[-1].state is RunState.FAILED


def test_a_cancelled_task_leaves_its_record_failed_and_resumable(tmp_path: Path) -> None:
    journal = Journal()
    kind = TallyKind(tmp_path / "e")
    steps = list(kind.steps())
    started = asyncio.Event()

    async def hangs(ctx: StepContext[Tally]) -> None:
        started.set()
        await asyncio.sleep(3600)

    kind.steps = lambda: [steps[0], replace(steps[1], do=hangs), steps[2]]  # type: ignore[method-assign]

    async def main() -> None:
        task = asyncio.create_task(RunEngine(kind, journal, parallel_nodes=1).run(plan()))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    record = journal.saved[-1]
    assert record.state is RunState.FAILED and record.error.startswith("cancelled")
    assert record.progress("node1").begun == "apply"


def test_a_run_of_another_kind_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RunRefused, match="is a restore, not a tally"):
        run(TallyKind(tmp_path / "e"), replace(plan(), kind="restore"))


def test_runs_found_running_at_open_are_marked_interrupted(tmp_path: Path) -> None:
    path = tmp_path / "catalog.db"
    with Catalog(path) as catalog:
        runs = StoredRuns(catalog, ADAPTER)
        asyncio.run(runs.save(plan()))
        asyncio.run(runs.save(replace(plan(), id="tally-2", state=RunState.FAILED)))
        assert catalog.interrupted_runs() == []
    with Catalog(path, exclusive=False) as reader:  # a reader changes nothing
        assert '"state":"running"' in (reader.find_run_document(RUN_ID) or "")
    with Catalog(path) as catalog:
        assert catalog.interrupted_runs() == [RUN_ID]
        found = asyncio.run(StoredRuns(catalog, ADAPTER).find(RUN_ID))
        other = asyncio.run(StoredRuns(catalog, ADAPTER).find("tally-2"))
    assert found is not None and found.state is RunState.INTERRUPTED
    assert other is not None and other.state is RunState.FAILED
    assert found.progress(RUN).name == RUN


def test_a_run_id_of_another_kind_is_refused_by_the_catalog(tmp_path: Path) -> None:
    from ringsnap.coordinator.catalog import CatalogError

    with Catalog(tmp_path / "catalog.db") as catalog:
        asyncio.run(StoredRuns(catalog, ADAPTER).save(plan()))
        with pytest.raises(CatalogError, match="already used by a run of another kind"):
            asyncio.run(StoredRuns(catalog, ADAPTER).save(replace(plan(), kind="export")))


class Committing(WithRunSteps):
    """`prepare` undone on failure, until `apply` (which commits) finished."""

    def steps(self) -> Sequence[Step[Tally]]:
        steps = list(super().steps())
        return [replace(s, commits=s.name == "apply") for s in steps]


def test_after_a_committing_step_a_failure_no_longer_undoes_the_steps_before(
    tmp_path: Path,
) -> None:
    journal = Journal()
    with pytest.raises(RunFailed, match="node node1: seal"):
        asyncio.run(RunEngine(Committing(tmp_path / "e", fail="node1:seal"), journal).run(plan()))
    assert "node1:undo-prepare" not in effects(tmp_path / "e")
    assert journal.saved[-1].progress("node1").reached == "apply"
    start = len(effects(tmp_path / "e"))
    done = asyncio.run(RunEngine(Committing(tmp_path / "e"), journal).run(journal.saved[-1]))
    assert done.state is RunState.SUCCEEDED
    assert effects(tmp_path / "e")[start:] == ["node1:seal", "run:publish"]


def test_a_cancelled_node_runs_its_failure_undos_before_the_cancellation_goes_on(
    tmp_path: Path,
) -> None:
    journal = Journal()
    kind = WithRunSteps(tmp_path / "e")
    steps = list(kind.steps())
    started = asyncio.Event()

    async def hangs(ctx: StepContext[Tally]) -> None:
        started.set()
        await asyncio.sleep(3600)

    kind.steps = lambda: [steps[0], replace(steps[1], do=hangs), *steps[2:]]  # type: ignore[method-assign]

    async def main() -> None:
        task = asyncio.create_task(RunEngine(kind, journal, parallel_nodes=1).run(plan()))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert effects(tmp_path / "e") == ["node1:prepare", "node1:undo-prepare"]
    record = journal.saved[-1]
    assert record.state is RunState.FAILED and record.progress("node1").reached == ""


def test_barrier_steps_finish_on_every_node_before_the_next_starts(tmp_path: Path) -> None:
    class Barriers(TallyKind):
        def steps(self) -> Sequence[Step[Tally]]:
            return [replace(s, barrier=True) for s in super().steps()]

    run(Barriers(tmp_path / "b"))
    seen = [e.split(":")[1] for e in effects(tmp_path / "b")]
    assert seen == ["fetch"] * 3 + ["apply"] * 3 + ["seal"] * 3
    # Without barriers, a node goes on without waiting (one node at a time: its three steps).
    asyncio.run(RunEngine(TallyKind(tmp_path / "p"), Journal(), parallel_nodes=1).run(plan()))
    assert [e.split(":")[1] for e in effects(tmp_path / "p")][:3] == ["fetch", "apply", "seal"]
