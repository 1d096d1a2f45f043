"""A watcher that stops reading (a stuck client) holds at most `backlog` progress snapshots: past
that the oldest progress is dropped, never a state change nor the final state; one that reads
within the bound still gets every change (`test_operation_watch`)."""

from __future__ import annotations

import asyncio

import pytest

from ringsnap.coordinator.model import OperationState
from ringsnap.coordinator.operations import WATCH_BACKLOG, Operation

RUNNING, SUCCEEDED = OperationState.RUNNING, OperationState.SUCCEEDED


def test_a_stuck_watcher_keeps_the_newest_progress_and_every_state_change() -> None:
    async def scenario() -> tuple[list[tuple[str, str]], list[int]]:
        operation = Operation("backup", backlog=3)
        stuck = operation.watch()
        await anext(stuck)  # PENDING; then it reads nothing while the run goes on
        await operation.update(state=RUNNING, message="started")
        held = []
        for n in range(50):
            await operation.update(message=f"progress {n}")
            held.append(operation.unread_counts()[0])
        await operation.update(state=SUCCEEDED, message="done")
        read = [(s.state.value, s.message) async for s in stuck]
        return read, held

    read, held = asyncio.run(scenario())
    assert max(held) == 1 + 3, "more than the bound held besides the state change"
    assert read == [
        ("running", "started"),
        ("running", "progress 47"),
        ("running", "progress 48"),
        ("running", "progress 49"),
        ("succeeded", "done"),
    ]


def test_state_changes_are_kept_beyond_the_bound() -> None:
    async def scenario() -> list[str]:
        operation = Operation("backup", backlog=1)
        stuck = operation.watch()
        await anext(stuck)
        await operation.update(state=RUNNING, message="started")
        await operation.update(message="one")
        await operation.update(message="two")
        await operation.update(state=OperationState.FAILED, message="array down")
        return [s.message async for s in stuck]

    assert asyncio.run(scenario()) == ["started", "two", "array down"]


def test_the_default_bound_holds_a_long_runs_progress_for_a_slow_reader() -> None:
    """Within the default bound a watcher that reads late still reads every line."""

    async def scenario() -> list[str]:
        operation = Operation("backup")
        late = operation.watch()
        await anext(late)
        lines = [f"file {n}" for n in range(WATCH_BACKLOG)]
        for line in lines:
            await operation.update(state=RUNNING, message=line)
        await operation.update(state=SUCCEEDED, message="done")
        return [s.message async for s in late]

    read = asyncio.run(scenario())
    assert read == [f"file {n}" for n in range(WATCH_BACKLOG)] + ["done"]


def test_a_backlog_must_hold_at_least_one_snapshot() -> None:
    with pytest.raises(ValueError, match="backlog"):
        Operation("backup", backlog=0)
