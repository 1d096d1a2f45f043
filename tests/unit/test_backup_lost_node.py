"""A node lost while frozen (a partition, against fakes of our own seams): the freeze barrier fails
the run naming it, keeps the others' leases alive, thaws them at once, and never waits on the lost
node's answers for longer than a lease. The real-parts proof is tests/integration/test_partitions.py.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime

import pytest

from ringsnap.coordinator.backup import BackupFailed, BackupRun, BackupSettings, BackupWorkflow
from ringsnap.coordinator.ports import AgentError, ThawReceipt
from ringsnap.plugins.errors import DriverError
from tests.support.fakes import FakeAgent, FakeArray, node_targets, volumes_of


def cluster() -> tuple[BackupWorkflow, list[FakeAgent], FakeArray, list[str]]:
    events: list[str] = []
    agents = [FakeAgent(f"n{i}", events) for i in range(1, 4)]
    array = FakeArray("a1", volumes_of(a.node for a in agents), events=events, agents=agents)
    return BackupWorkflow("c", node_targets(agents), {"a1": array}, None), agents, array, events


async def _never(*_: object) -> datetime:
    await asyncio.sleep(3600)
    raise AssertionError("unreachable")


def _thawed_at(agent: FakeAgent, started: float, seen: dict[str, float]) -> None:
    """Remember when `agent` stopped being frozen (polled from the test's own task)."""
    if agent.node not in seen and not agent.frozen and agent.thaws:
        seen[agent.node] = time.monotonic() - started


async def _run_watching(
    workflow: BackupWorkflow, agents: list[FakeAgent], settings: BackupSettings
) -> tuple[BaseException, float, dict[str, float]]:
    seen: dict[str, float] = {}
    started = time.monotonic()
    run = asyncio.ensure_future(workflow.run(settings, trigger="test"))
    while not run.done():
        for agent in agents:
            _thawed_at(agent, started, seen)
        await asyncio.sleep(0.005)
    error = run.exception()
    assert error is not None, "the run succeeded"
    return error, time.monotonic() - started, seen


def test_a_node_that_stops_answering_renewals_fails_the_run_and_the_others_thaw_at_once() -> None:
    workflow, agents, array, events = cluster()
    lost = agents[0]
    lost.renew = _never  # type: ignore[method-assign,assignment]
    array.delay = 4.0  # the array holds the snapshot call well past the lease
    settings = BackupSettings(lease=0.6, freeze_budget=4.0, straggler_grace=5)

    error, took, thawed = asyncio.run(_run_watching(workflow, agents, settings))

    assert isinstance(error, BackupFailed)
    assert str(error).startswith("node n1: no lease renewal confirmed"), error
    # The others were renewed while n1 did not answer: none of them thawed by its lease ...
    assert "lease-thaw n2" not in events and "lease-thaw n3" not in events
    # ... and they were thawed when n1 was lost (about a lease in), before the array answered; the
    # bound is the array's answer itself, so a loaded machine cannot make the test flaky.
    assert thawed["n2"] < array.delay and thawed["n3"] < array.delay, thawed
    # The snapshot the array made after that is not a quiesced image: deleted.
    assert took >= array.delay and array.snapshots == {}
    assert "delete" in events[-1]


def test_a_thaw_that_never_answers_is_not_waited_for_and_fails_the_run_naming_the_node() -> None:
    workflow, agents, array, _ = cluster()
    silent = agents[1]

    async def no_answer(operation_id: str) -> ThawReceipt:
        silent.frozen = False  # its lease thaws it, as the agent's does
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    silent.thaw = no_answer  # type: ignore[method-assign]
    settings = BackupSettings(lease=0.3, freeze_budget=1.0)

    async def bounded_run() -> BaseException:
        with pytest.raises(BackupFailed) as failed:
            await asyncio.wait_for(workflow.run(settings, trigger="test"), 10)
        return failed.value

    started = time.monotonic()
    error = asyncio.run(bounded_run())
    # Awaited for the floor of the thaw wait (1 s, the lease is shorter), not the 30 s of a gRPC
    # call (the 10 s bound of the run is far below that, far above the floor).
    assert time.monotonic() - started < 10
    assert "the thaw of n2 was not confirmed within 1 s" in str(error)
    assert array.snapshots == {}
    assert not any(a.frozen for a in agents)


def test_a_renewal_the_agent_refuses_fails_the_run_at_once() -> None:
    workflow, agents, array, _ = cluster()

    async def refused(operation_id: str, lease_seconds: float) -> datetime:
        raise AgentError(
            "node n3 (x): RenewLease: FAILED_PRECONDITION: the lease has run out",
            code="FAILED_PRECONDITION",
        )

    agents[2].renew = refused  # type: ignore[method-assign]
    array.delay = 3.0
    settings = BackupSettings(lease=0.6, freeze_budget=4.0, straggler_grace=5)

    error, _took, thawed = asyncio.run(_run_watching(workflow, agents, settings))

    assert "node n3: its freeze has ended before the snapshot was taken" in str(error)
    # At the first renewal (a third of the lease), not when the array answered.
    assert max(thawed.values()) < array.delay, thawed
    assert array.snapshots == {}


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (None, "ended after the thaw; its snapshot 'rs-late' was deleted"),
        (
            DriverError("connection reset", array="a1"),
            "failed after the thaw (array 'a1': connection reset); the snapshot the array may"
            " have made anyway is a pending cleanup, looked for by name",
        ),
    ],
)
def test_the_failed_runs_record_says_where_its_late_snapshot_went(
    error: Exception | None, said: str
) -> None:
    workflow, _agents, array, _ = cluster()
    array.delay = 0.5  # past the budget: a straggler, awaited after the thaw
    array.error = error
    runs: list[BackupRun] = []

    async def keep(run: BackupRun) -> None:
        runs.append(run)

    settings = BackupSettings(freeze_budget=0.2, lease=0.5, straggler_grace=5)
    with pytest.raises(BackupFailed, match="still running after the freeze budget"):
        asyncio.run(workflow.run(settings, trigger="test", backup_id="rs-late", on_start=keep))
    (run,) = runs
    assert run.array_warnings == [
        f"array a1: the snapshot call that outlived the freeze budget {said}"
    ]
    assert array.snapshots == {}
    assert [c.snapshot_name for c in run.pending_cleanups] == (["rs-late"] if error else [])


def test_a_lease_that_ran_out_only_after_the_snapshot_answered_does_not_fail_the_run() -> None:
    """On a lossy link a thaw can arrive after the lease ran out; the coordinator's own clock shows
    the lease held until after the array answered, so the snapshot is of frozen filesystems."""
    workflow, agents, array, events = cluster()
    agents[0].thaw_seconds = 0.5  # the thaw is held up on its way past the lease
    run = asyncio.run(workflow.run(BackupSettings(lease=0.3, freeze_budget=1.0), trigger="test"))
    assert "lease-thaw n1" in events  # its lease did run out, after the snapshot
    assert array.frozen_during_snapshot == [True]
    assert run.snapshots and array.snapshots


def test_a_lease_that_ran_out_before_the_snapshot_answered_still_fails_the_run() -> None:
    workflow, _agents, array, _ = cluster()
    array.delay = 0.5
    renewed: list[str] = []

    async def no_renewal(*_: object) -> None:
        renewed.append("started")
        await asyncio.sleep(3600)

    workflow._renew = no_renewal  # type: ignore[method-assign,assignment]
    with pytest.raises(BackupFailed, match="lease ran out on n1, n2, n3 before the snapshot"):
        asyncio.run(workflow.run(BackupSettings(lease=0.2, freeze_budget=1.0), trigger="test"))
    assert renewed and array.snapshots == {}


def test_a_node_lost_as_the_array_call_overran_is_named_beside_the_arrays_error() -> None:
    """The two failures at once (on a loaded machine the renewer and the budget end together):
    the record names the lost node too, not only the array."""
    workflow, agents, array, _ = cluster()

    async def no_answer(operation_id: str) -> ThawReceipt:
        agents[0].frozen = False
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    agents[0].thaw = no_answer  # type: ignore[method-assign]
    array.delay = 0.5
    settings = BackupSettings(freeze_budget=0.2, lease=0.5, straggler_grace=5)
    with pytest.raises(BackupFailed) as failed:
        asyncio.run(workflow.run(settings, trigger="test"))
    said = str(failed.value)
    assert said.startswith("array a1: snapshot call still running after the freeze budget")
    assert "; the thaw of n1 was not confirmed within 1 s" in said
    assert array.snapshots == {}
