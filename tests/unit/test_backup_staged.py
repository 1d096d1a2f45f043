"""The staged group snapshot in the backup workflow: prepare before the freeze, only the commit
inside it, finish after the thaw, abort on every failure path (cancellation included).

Fakes of our own seams (tests.support.fakes, and a staged array here); the driver side is
tested against the ONTAP simulator in tests/plugins/test_ontap.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from ringsnap.coordinator.backup import (
    BackupFailed,
    BackupRun,
    BackupSettings,
    BackupWorkflow,
    NodeTarget,
)
from ringsnap.coordinator.model import NodeVolume, QuiesceMode, VolumeRole
from ringsnap.coordinator.ports import ArrayPort, FreezeReceipt
from ringsnap.plugins.api import PreparedSnapshot
from ringsnap.plugins.errors import ArrayTimeoutError, DriverError
from ringsnap.plugins.middleware import AsyncDriver, RetryPolicy, deadline, wrap
from ringsnap.plugins.types import SnapshotRef, Volume, VolumeSnapshot
from tests.support.fakes import FakeAgent, FakeArray, ScriptedDriver, node_targets, volumes_of


class StagedArray(FakeArray):
    """Records each step with whether every node was frozen at that moment."""

    def __init__(self, name: str, events: list[str], agents: Sequence[FakeAgent]) -> None:
        super().__init__(name, volumes_of(a.node for a in agents), events=events, agents=agents)
        self.delays: dict[str, float] = {}
        self.errors: dict[str, Exception] = {}
        self.gate: asyncio.Event | None = None
        self.frozen_at: dict[str, bool] = {}
        self.prepared: set[str] = set()

    async def create_group_snapshot(self, volumes: Sequence[Volume], name: str) -> SnapshotRef:
        raise AssertionError("the workflow uses the staged steps of a staged port")

    async def delete_snapshot(self, ref: SnapshotRef) -> None:
        self.events.append(f"delete {self.array}")
        self.snapshots.pop(ref.snapshot_name, None)

    async def _step(self, step: str) -> None:
        self.events.append(f"{step} {self.array}")
        self.frozen_at[step] = all(a.frozen for a in self.agents)
        await asyncio.sleep(self.delays.get(step, 0.0))
        if step in self.errors:
            raise self.errors[step]

    async def prepare_group_snapshot(
        self, volumes: Sequence[Volume], name: str
    ) -> PreparedSnapshot:
        await self._step("prepare")
        self.prepared.add(name)
        return PreparedSnapshot(self.array, "staged", name, tuple(volumes), (("group", "g1"),))

    async def commit_group_snapshot(self, prepared: PreparedSnapshot) -> SnapshotRef:
        assert prepared.name in self.prepared and prepared.value("group") == "g1"
        if self.gate is not None:
            self.events.append(f"commit-waits {self.array}")
            await self.gate.wait()
        await self._step("commit")
        ref = SnapshotRef(
            self.array,
            "staged",
            "g1",
            prepared.name,
            prepared.name,
            datetime.now(UTC),
            tuple(VolumeSnapshot(v, prepared.name) for v in prepared.volumes),
        )
        self.snapshots[prepared.name] = ref
        return ref

    async def describe_group_snapshot(
        self, prepared: PreparedSnapshot, ref: SnapshotRef
    ) -> SnapshotRef:
        await self._step("describe")
        return replace(ref, attributes=(("described", "yes"),))

    async def finish_group_snapshot(self, prepared: PreparedSnapshot) -> None:
        await self._step("finish")
        self.prepared.discard(prepared.name)

    async def abort_group_snapshot(self, prepared: PreparedSnapshot) -> None:
        await self._step("abort")
        self.prepared.discard(prepared.name)


def cluster(
    arrays: Sequence[str] = ("a1",),
) -> tuple[BackupWorkflow, list[FakeAgent], dict[str, StagedArray], list[str]]:
    """Three nodes; with several arrays, node i's volumes are on arrays[i % len(arrays)]."""
    events: list[str] = []
    agents = [FakeAgent(f"n{i}", events) for i in range(1, 4)]
    ports = {name: StagedArray(name, events, agents) for name in arrays}
    return (
        BackupWorkflow("c", node_targets(agents, arrays), dict(ports), None),
        agents,
        ports,
        events,
    )


def kinds(events: list[str]) -> list[str]:
    return [event.split()[0] for event in events]


def _cancel_when(
    workflow: BackupWorkflow,
    ready: Callable[[], bool],
    *,
    linger: float = 0.0,
    poll: float = 0.01,
) -> BackupRun:
    """Start a backup, cancel it once `ready()`, check that it ends cancelled, then let calls
    still running in 'threads' end for `linger` s. Returns the run."""
    runs: list[BackupRun] = []

    async def started(run: BackupRun) -> None:
        runs.append(run)

    async def main() -> None:
        task = asyncio.create_task(workflow.run(BackupSettings(), trigger="t", on_start=started))
        while not ready():
            await asyncio.sleep(poll)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(linger)

    asyncio.run(main())
    return runs[0]


def test_fakes_are_staged_ports() -> None:
    _, _, ports, _ = cluster()
    assert isinstance(ports["a1"], ArrayPort)


def test_prepare_before_the_freeze_commit_inside_finish_after_the_thaw() -> None:
    workflow, agents, ports, events = cluster()
    run = asyncio.run(workflow.run(BackupSettings(), trigger="test"))
    assert kinds(events) == (
        ["flush"] * 3
        + ["prepare"]
        + ["freeze"] * 3
        + ["commit"]
        + ["thaw"] * 3
        + ["describe", "finish"]
    )
    assert ports["a1"].frozen_at == {
        "prepare": False,
        "commit": True,
        "describe": False,
        "finish": False,
    }
    assert len(run.snapshots) == 1 and len(run.snapshots[0].members) == 6
    assert ports["a1"].prepared == set()
    assert list(run.clock.phases)[:6] == [
        "plan",
        "canary",
        "schema",
        "flush",
        "manifest",
        "prepare",
    ]
    assert "finish" in run.clock.phases
    assert not any(a.frozen for a in agents)


def test_the_freeze_window_holds_only_the_commit() -> None:
    workflow, _, ports, events = cluster()
    ports["a1"].delays = {"prepare": 0.05, "finish": 0.05}
    run = asyncio.run(workflow.run(BackupSettings(), trigger="test"))
    assert run.window is not None
    order = kinds(events)
    first_freeze = order.index("freeze")
    last_freeze = len(order) - 1 - order[::-1].index("freeze")
    first_thaw = order.index("thaw")
    # Prepared before any node froze, committed once all were frozen and before any thawed,
    # finished after every node thawed: nothing but the commit inside the window.
    assert order.index("prepare") < first_freeze
    assert last_freeze < order.index("commit") < first_thaw
    assert order.index("finish") > len(order) - 1 - order[::-1].index("thaw")
    assert run.clock.phases["prepare"] >= 0.05 and run.clock.phases["finish"] >= 0.05


def test_the_snapshot_is_described_after_the_thaw_and_before_the_finish() -> None:
    workflow, _, ports, events = cluster()
    run = asyncio.run(workflow.run(BackupSettings(), trigger="test"))
    order = kinds(events)
    last_thaw = len(order) - 1 - order[::-1].index("thaw")
    assert last_thaw < order.index("describe") < order.index("finish")
    assert ports["a1"].frozen_at["describe"] is False
    assert [ref.attribute("described") for ref in run.snapshots] == ["yes"]


def test_a_failed_description_keeps_the_snapshot_as_committed_with_a_warning() -> None:
    workflow, _, ports, events = cluster()
    ports["a1"].errors["describe"] = DriverError("HTTP 500: read failed", array="a1")
    run = asyncio.run(workflow.run(BackupSettings(), trigger="test"))
    assert [ref.snapshot_name for ref in run.snapshots] == [run.backup_id]
    assert run.snapshots[0].attribute("described") == ""
    assert any("reading its description after the thaw failed" in w for w in run.array_warnings)
    assert "finish a1" in events and "delete a1" not in events


def test_a_failed_commit_thaws_then_aborts() -> None:
    workflow, agents, ports, events = cluster()
    ports["a1"].errors["commit"] = DriverError("HTTP 500: snapshot failed", array="a1")
    with pytest.raises(BackupFailed, match="snapshot failed"):
        asyncio.run(workflow.run(BackupSettings(), trigger="test"))
    assert kinds(events)[-4:] == ["thaw"] * 3 + ["abort"]
    assert "finish a1" not in events
    assert ports["a1"].frozen_at["abort"] is False
    assert ports["a1"].prepared == set()
    assert not any(a.frozen for a in agents)


def test_a_failed_prepare_aborts_the_prepared_arrays_and_never_freezes() -> None:
    workflow, _agents, ports, events = cluster(("a1", "a2"))
    ports["a2"].errors["prepare"] = DriverError("volume is in another group", array="a2")
    with pytest.raises(BackupFailed, match="array a2: preparing the snapshot failed"):
        asyncio.run(workflow.run(BackupSettings(), trigger="test"))
    assert "abort a1" in events and "abort a2" not in events
    assert not any(e.startswith(("freeze", "commit")) for e in events)
    assert ports["a1"].prepared == set()


def test_a_failed_freeze_aborts_without_committing() -> None:
    workflow, agents, ports, events = cluster()
    agents[0].fail_freeze = True
    with pytest.raises(BackupFailed, match="freeze failed"):
        asyncio.run(workflow.run(BackupSettings(), trigger="test"))
    assert "commit a1" not in events and events[-1] == "abort a1"
    assert ports["a1"].prepared == set()


def test_a_failure_after_the_commit_finishes_and_deletes_the_snapshot() -> None:
    workflow, _, ports, events = cluster()
    ports["a1"].delays["commit"] = 0.3

    async def no_renewal(*_: object) -> None:
        await asyncio.sleep(3600)

    workflow._renew = no_renewal  # type: ignore[method-assign,assignment]
    with pytest.raises(BackupFailed, match="lease ran out"):
        asyncio.run(workflow.run(BackupSettings(lease=0.1, freeze_budget=1.0), trigger="test"))
    assert "abort a1" not in events
    assert events.index("finish a1") < events.index("delete a1")
    assert ports["a1"].snapshots == {}


def test_a_finish_that_fails_keeps_the_backup_and_reports_the_leftover() -> None:
    workflow, _, ports, _ = cluster()
    ports["a1"].errors["finish"] = DriverError(
        "HTTP 500", array="a1", left_on_array=("temporary consistency group g1",)
    )
    run = asyncio.run(workflow.run(BackupSettings(), trigger="test"))
    assert len(run.snapshots) == 1
    assert run.array_warnings == [
        "finish of the prepared snapshot failed: array 'a1': HTTP 500;"
        " left behind: temporary consistency group g1"
    ]
    assert run.pending_cleanups == []


def test_an_overrunning_commit_is_finished_and_deleted_after_it_ends() -> None:
    workflow, agents, ports, events = cluster()
    ports["a1"].delays["commit"] = 0.6
    settings = BackupSettings(freeze_budget=0.2, lease=0.5, straggler_grace=5)
    with pytest.raises(BackupFailed, match="still running after the freeze budget"):
        asyncio.run(workflow.run(settings, trigger="test"))
    # No abort while the commit ran; finish once it had made its snapshot, then the delete.
    assert "abort a1" not in events
    assert events.index("thaw n1") < events.index("finish a1") < events.index("delete a1")
    assert ports["a1"].snapshots == {} and ports["a1"].prepared == set()
    assert not any(a.frozen for a in agents)


def test_cancelled_during_prepare_aborts_what_was_prepared() -> None:
    workflow, _agents, ports, events = cluster(("a1", "a2"))
    ports["a2"].delays["prepare"] = 5
    _cancel_when(workflow, lambda: "prepare a2" in events and bool(ports["a1"].prepared))
    assert "abort a1" in events
    assert not any(e.startswith(("freeze", "commit")) for e in events)
    assert ports["a1"].prepared == set()


def test_cancelled_during_the_commit_thaws_finishes_the_done_and_leaves_the_running() -> None:
    workflow, agents, ports, events = cluster(("a1", "a2"))
    ports["a1"].gate = asyncio.Event()  # never opened: a1's commit hangs
    run = _cancel_when(workflow, lambda: "commit a2" in events and "commit-waits a1" in events)
    assert not any(a.frozen for a in agents)
    # a2 had its snapshot: finished and deleted. a1's commit was still running: not aborted under
    # it, and its snapshot is left for cleanup by name.
    assert events.index("finish a2") < events.index("delete a2")
    assert "abort a1" not in events and "finish a1" not in events
    (leftover,) = run.pending_cleanups
    assert leftover.array == "a1" and leftover.snapshot_name == run.backup_id


def test_a_port_with_the_default_steps_snapshots_under_the_freeze() -> None:
    events: list[str] = []
    agents = [FakeAgent(f"n{i}", events) for i in range(1, 4)]
    array = FakeArray("a1", volumes_of(a.node for a in agents), events=events, agents=agents)
    workflow = BackupWorkflow("c", node_targets(agents), {"a1": array}, None)
    asyncio.run(workflow.run(BackupSettings(quiesce=QuiesceMode.FREEZE), trigger="test"))
    assert kinds(events) == ["flush"] * 3 + ["freeze"] * 3 + ["snapshot"] + ["thaw"] * 3
    assert array.frozen_during_snapshot == [True]


def _driver(failures: int = 0) -> ScriptedDriver:
    """A driver with the default staged steps; its create fails retryably `failures` times."""
    return ScriptedDriver(
        [DriverError("HTTP 503", array="a1", retryable=True) for _ in range(failures)]
    )


def test_default_steps_commit_is_create_and_the_middleware_logs_each_step() -> None:
    from structlog.testing import capture_logs

    driver = _driver(failures=1)
    port = AsyncDriver(wrap(driver, retry=RetryPolicy(attempts=3, initial_delay=0.01)))
    assert isinstance(port, ArrayPort)

    async def steps() -> SnapshotRef:
        prepared = await port.prepare_group_snapshot([Volume("v1", "id-v1")], "s1")
        assert driver.calls == 0  # the default prepare asks the array nothing
        ref = await port.commit_group_snapshot(prepared)
        await port.finish_group_snapshot(prepared)
        await port.abort_group_snapshot(prepared)
        return ref

    with capture_logs() as logs:
        ref = asyncio.run(steps())
    assert ref.snapshot_name == "s1" and driver.calls == 2
    ops = [(e["op"], e.get("attempts")) for e in logs if e["event"] == "array operation"]
    assert ops == [
        ("prepare_group_snapshot", 1),
        ("commit_group_snapshot", 2),
        ("finish_group_snapshot", 1),
        ("abort_group_snapshot", 1),
    ]


def test_a_commit_retry_inside_the_freeze_respects_the_callers_deadline() -> None:
    driver = _driver(failures=100)
    managed = wrap(driver, retry=RetryPolicy(attempts=50, initial_delay=0.1, jitter=0))
    prepared = managed.prepare_group_snapshot([Volume("v1", "id-v1")], "s1")
    with deadline(0.35) as budget, pytest.raises(DriverError, match="HTTP 503"):
        managed.commit_group_snapshot(prepared)
    assert 1 < driver.calls < 6
    assert isinstance(budget.last_error, DriverError)


class ThreadLikeArray(StagedArray):
    """A prepare and commit that go on when their caller stops waiting, like a driver call in
    `AsyncDriver`'s worker thread (cancelling the coroutine does not stop the thread)."""

    async def prepare_group_snapshot(
        self, volumes: Sequence[Volume], name: str
    ) -> PreparedSnapshot:
        return await asyncio.shield(super().prepare_group_snapshot(volumes, name))

    async def commit_group_snapshot(self, prepared: PreparedSnapshot) -> SnapshotRef:
        return await asyncio.shield(super().commit_group_snapshot(prepared))


def threadlike_cluster(
    arrays: Sequence[str] = ("a1",),
) -> tuple[BackupWorkflow, list[FakeAgent], dict[str, StagedArray], list[str]]:
    workflow, agents, staged, events = cluster(arrays)
    ports: dict[str, StagedArray] = {name: ThreadLikeArray(name, events, agents) for name in staged}
    workflow.arrays = dict(ports)
    return workflow, agents, ports, events


def _run_and_keep(
    workflow: BackupWorkflow, settings: BackupSettings, *, linger: float = 0.0
) -> tuple[BackupRun, BaseException]:
    """Run a backup that fails; then let calls still running in 'threads' end for `linger` s."""
    runs: list[BackupRun] = []

    async def started(run: BackupRun) -> None:
        runs.append(run)

    async def main() -> BaseException:
        try:
            await workflow.run(settings, trigger="t", on_start=started)
        except BackupFailed as exc:
            await asyncio.sleep(linger)
            return exc
        raise AssertionError("the run did not fail")

    error = asyncio.run(main())
    return runs[0], error


def test_a_commit_that_failed_may_still_have_made_its_snapshot_so_it_is_left_for_cleanup() -> None:
    # E.g. the POST timed out after the array took the snapshot and the freeze budget stopped the
    # retries: the run cannot know, and must not forget the name.
    workflow, _, ports, _ = cluster()
    ports["a1"].errors["commit"] = ArrayTimeoutError("did not answer within 10s", array="a1")
    run, error = _run_and_keep(workflow, BackupSettings())
    assert "did not answer" in str(error)
    (leftover,) = run.pending_cleanups
    assert (leftover.array, leftover.snapshot_name, leftover.ref) == ("a1", run.backup_id, None)
    assert "may have made it" in leftover.reason


def test_a_straggling_commit_that_fails_late_is_left_for_cleanup_by_name() -> None:
    workflow, agents, ports, events = cluster()
    ports["a1"].delays["commit"] = 0.5
    ports["a1"].errors["commit"] = ArrayTimeoutError("did not answer within 10s", array="a1")
    settings = BackupSettings(freeze_budget=0.2, lease=0.5, straggler_grace=5)
    run, _ = _run_and_keep(workflow, settings)
    (leftover,) = run.pending_cleanups
    assert (leftover.array, leftover.snapshot_name) == ("a1", run.backup_id)
    assert events.index("thaw n1") < events.index("abort a1")
    assert not any(a.frozen for a in agents)


def test_a_prepare_that_outlives_its_timeout_is_aborted_once_it_ends() -> None:
    workflow, _, ports, events = threadlike_cluster(("a1", "a2"))
    ports["a2"].delays["prepare"] = 0.4
    settings = BackupSettings(agent_timeout=0.1, straggler_grace=5)
    run, error = _run_and_keep(workflow, settings, linger=0.5)
    assert "array a2: preparing the snapshot: no answer within 0.1 s" in str(error)
    assert not any(e.startswith(("freeze", "commit")) for e in events)
    # a2's prepare set up its group after the run stopped waiting: removed, not leaked.
    assert "abort a1" in events and "abort a2" in events
    assert ports["a1"].prepared == set() and ports["a2"].prepared == set()
    assert run.array_warnings == []


def test_a_prepare_that_never_ends_is_reported_with_the_run() -> None:
    workflow, _, ports, _ = threadlike_cluster()
    ports["a1"].delays["prepare"] = 0.5
    settings = BackupSettings(agent_timeout=0.05, straggler_grace=0.05)
    run, _ = _run_and_keep(workflow, settings)
    (warning,) = run.array_warnings
    assert warning.startswith("array a1: no answer while preparing the snapshot")


def test_cancelled_while_a_prepare_runs_reports_what_it_may_leave() -> None:
    workflow, _, ports, events = threadlike_cluster(("a1", "a2"))
    ports["a2"].delays["prepare"] = 0.3
    run = _cancel_when(
        workflow, lambda: "prepare a2" in events and bool(ports["a1"].prepared), linger=0.4
    )
    assert "abort a1" in events
    (warning,) = run.array_warnings
    assert warning.startswith("array a2: the run was cancelled while preparing the snapshot")


def test_a_commit_abandoned_under_cancellation_reports_its_set_up() -> None:
    workflow, agents, ports, events = cluster(("a1", "a2"))
    ports["a1"].gate = asyncio.Event()  # never opened: a1's commit hangs
    run = _cancel_when(workflow, lambda: "commit a2" in events and "commit-waits a1" in events)
    assert "abort a1" not in events and not any(a.frozen for a in agents)
    (warning,) = run.array_warnings
    assert warning.startswith("array a1: cancelled while its snapshot call was running")
    assert "group g1" in warning


def test_a_commit_that_never_returns_reports_its_set_up() -> None:
    workflow, agents, ports, events = threadlike_cluster()
    ports["a1"].delays["commit"] = 1.0
    settings = BackupSettings(freeze_budget=0.2, lease=0.5, straggler_grace=0.1)
    run, _ = _run_and_keep(workflow, settings)
    assert "abort a1" not in events and "finish a1" not in events
    (leftover,) = run.pending_cleanups
    assert leftover.snapshot_name == run.backup_id
    warning, late = run.array_warnings
    assert warning.startswith("array a1: its snapshot call never returned")
    # The record says where the snapshot the call may still make goes.
    assert late.startswith("array a1: the snapshot call that outlived the freeze budget did not")
    assert late.endswith("is a pending cleanup, looked for by name")
    assert not any(a.frozen for a in agents)


class SlowFreezeAgent(FakeAgent):
    async def freeze(self, operation_id: str, lease_seconds: float) -> FreezeReceipt:
        await asyncio.sleep(0.3)
        return await super().freeze(operation_id, lease_seconds)


def test_a_freeze_that_used_the_whole_budget_starts_no_snapshot() -> None:
    events: list[str] = []
    agents = [SlowFreezeAgent("n1", events), FakeAgent("n2", events)]
    port = StagedArray("a1", events, agents)
    nodes = [
        NodeTarget(
            a.node, a, (NodeVolume(array="a1", volume=f"{a.node}-data", role=VolumeRole.DATA),)
        )
        for a in agents
    ]
    workflow = BackupWorkflow("c", nodes, {"a1": port}, None)
    settings = BackupSettings(freeze_budget=0.2, lease=1.0)
    run, error = _run_and_keep(workflow, settings)
    # Bounded by the budget itself, or finished with none of it left: no snapshot either way.
    assert "freeze budget" in str(error)
    assert "commit a1" not in events
    assert events.index("thaw n1") < events.index("abort a1")
    assert not any(a.frozen for a in agents) and run.pending_cleanups == []


def test_a_failed_prepare_that_may_have_left_set_up_reports_it() -> None:
    workflow, _, ports, _ = cluster(("a1", "a2"))
    ports["a2"].errors["prepare"] = ArrayTimeoutError(
        "did not answer within 10s", array="a2", left_on_array=("temporary consistency group g2",)
    )
    run, _ = _run_and_keep(workflow, BackupSettings())
    (warning,) = run.array_warnings
    assert warning.startswith("array a2: preparing the snapshot failed and may have left")
    assert "temporary consistency group g2" in warning


def test_a_cancellation_while_the_renewer_stops_is_not_swallowed() -> None:
    workflow, agents, ports, events = cluster()

    async def slow_to_stop(*_: object) -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            events.append("renewer-stopping")
            await asyncio.sleep(0.3)
            raise

    workflow._renew = slow_to_stop  # type: ignore[method-assign,assignment]
    _cancel_when(workflow, lambda: "renewer-stopping" in events, poll=0.005)
    assert not any(a.frozen for a in agents)
    # The stopped run discards its snapshot instead of going on to record it.
    assert events.index("finish a1") < events.index("delete a1")
    assert ports["a1"].snapshots == {}


class ArrayWithTheName(StagedArray):
    """An array that already holds a complete snapshot of the run's name."""

    async def prepare_group_snapshot(
        self, volumes: Sequence[Volume], name: str
    ) -> PreparedSnapshot:
        await super().prepare_group_snapshot(volumes, name)
        old = SnapshotRef(
            self.array,
            "staged",
            "g0",
            name,
            name,
            datetime(2020, 1, 1, tzinfo=UTC),
            tuple(VolumeSnapshot(v, name) for v in volumes),
        )
        self.snapshots[name] = old
        return PreparedSnapshot(self.array, "staged", name, tuple(volumes), existing=old)

    async def commit_group_snapshot(self, prepared: PreparedSnapshot) -> SnapshotRef:
        self.events.append(f"commit {self.array}")
        assert prepared.existing is not None
        return prepared.existing  # what every driver's commit does with it


def test_a_snapshot_of_that_name_taken_before_the_freeze_is_never_this_backup() -> None:
    workflow, agents, _, events = cluster()
    port = ArrayWithTheName("a1", events, agents)
    workflow.arrays = {"a1": port}
    run, error = _run_and_keep(workflow, BackupSettings())
    assert "exists already" in str(error)
    assert not any(e.startswith(("freeze", "commit", "delete")) for e in events)
    assert run.snapshots == [] and run.pending_cleanups == []
    assert run.backup_id in port.snapshots  # not this run's to delete


def test_a_run_cancelled_again_while_it_cleans_up_finishes_the_clean_up_first() -> None:
    # A coordinator stopping twice (SIGTERM, then again): the record must still list what the
    # clean-up found, so the run only lets the cancellation go once the clean-up has ended.
    workflow, agents, ports, events = cluster()
    ports["a1"].errors["commit"] = DriverError("HTTP 500", array="a1")
    ports["a1"].delays["abort"] = 0.5
    ports["a1"].errors["abort"] = DriverError(
        "HTTP 500", array="a1", left_on_array=("temporary consistency group g1",)
    )
    runs: list[BackupRun] = []

    async def started(run: BackupRun) -> None:
        runs.append(run)

    async def main() -> None:
        task = asyncio.create_task(workflow.run(BackupSettings(), trigger="t", on_start=started))
        while "abort a1" not in events:
            await asyncio.sleep(0.01)
        for _ in range(2):
            task.cancel()
            await asyncio.sleep(0.05)
        assert not task.done(), "the clean-up was cut short"
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    (warning,) = runs[0].array_warnings
    assert "temporary consistency group g1" in warning
    assert not any(a.frozen for a in agents)
