"""An operation's watchers get every snapshot in order, however slowly they read (a progress line
sent while a watcher was busy is not lost), those sent before they came first, and the final state
ends each watch."""

from __future__ import annotations

import asyncio

from ringsnap.coordinator.model import OperationState
from ringsnap.coordinator.operations import HISTORY, Operation


def test_a_slow_watcher_gets_every_change_in_order_then_the_end() -> None:
    async def scenario() -> tuple[list[str], list[str]]:
        operation = Operation("backup")
        slow, quick = operation.watch(), operation.watch()
        assert (await anext(slow)).state is OperationState.PENDING
        assert (await anext(quick)).state is OperationState.PENDING
        # Three changes before the slow watcher reads again.
        for message in ("n1: flushed", "n2: flushed", "n3: flushed"):
            await operation.update(state=OperationState.RUNNING, message=message)
        await operation.update(state=OperationState.SUCCEEDED, message="done")
        read_slowly = [s.message async for s in slow]
        read_quickly = [s.message async for s in quick]
        return read_slowly, read_quickly

    slowly, quickly = asyncio.run(scenario())
    assert slowly == quickly == ["n1: flushed", "n2: flushed", "n3: flushed", "done"]


def test_a_watch_of_a_finished_operation_gets_its_history_and_final_state_and_ends() -> None:
    async def scenario() -> list[tuple[OperationState, str]]:
        operation = Operation("backup")
        await operation.update(state=OperationState.RUNNING)
        await operation.update(message="n1: flushed")
        await operation.update(state=OperationState.FAILED, message="array down")
        return [(s.state, s.message) async for s in operation.watch()]

    assert asyncio.run(scenario()) == [
        (OperationState.PENDING, ""),
        (OperationState.RUNNING, ""),
        (OperationState.RUNNING, "n1: flushed"),
        (OperationState.FAILED, "array down"),
    ]


def test_a_watch_that_starts_late_reads_the_lines_it_missed_first() -> None:
    """A command starts a run, then watches it: what the run printed in between is not lost."""

    async def scenario() -> list[str]:
        operation = Operation("restore")
        await operation.update(state=OperationState.RUNNING, message="n1: stopped done")
        await operation.update(message="n2: stopped done")
        watch = operation.watch()
        first = (await anext(watch)).message  # the watch comes here, after two lines
        await operation.update(state=OperationState.SUCCEEDED, message="PROVEN")
        return [first] + [s.message async for s in watch]

    assert asyncio.run(scenario()) == ["", "n1: stopped done", "n2: stopped done", "PROVEN"]


def test_an_operations_history_is_bounded_and_keeps_every_state_change() -> None:
    async def scenario() -> list[tuple[OperationState, str]]:
        operation = Operation("backup")
        await operation.update(state=OperationState.RUNNING)
        for line in range(HISTORY + 10):
            await operation.update(message=f"line {line}")
        await operation.update(state=OperationState.SUCCEEDED, message="done")
        return [(s.state, s.message) async for s in operation.watch()]

    seen = asyncio.run(scenario())
    assert seen[:2] == [(OperationState.PENDING, ""), (OperationState.RUNNING, "")]
    assert [message for _, message in seen[2:-1]] == [f"line {n}" for n in range(10, HISTORY + 10)]
    assert seen[-1] == (OperationState.SUCCEEDED, "done")


def test_a_watcher_that_leaves_is_forgotten() -> None:
    async def scenario() -> int:
        operation = Operation("backup")
        watch = operation.watch()
        await anext(watch)
        await watch.aclose()
        await operation.update(message="after the watcher left")
        return len(operation._watchers)

    assert asyncio.run(scenario()) == 0
