"""An operation's watchers get every snapshot in order, however slowly they read (a progress line
sent while a watcher was busy is not lost), and the final state ends each watch."""

from __future__ import annotations

import asyncio

from ringsnap.coordinator.model import OperationState
from ringsnap.coordinator.operations import Operation


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


def test_a_watch_of_a_finished_operation_gets_its_final_state_and_ends() -> None:
    async def scenario() -> list[OperationState]:
        operation = Operation("backup")
        await operation.update(state=OperationState.FAILED, message="array down")
        return [s.state async for s in operation.watch()]

    assert asyncio.run(scenario()) == [OperationState.FAILED]


def test_a_watcher_that_leaves_is_forgotten() -> None:
    async def scenario() -> int:
        operation = Operation("backup")
        watch = operation.watch()
        await anext(watch)
        await watch.aclose()
        await operation.update(message="after the watcher left")
        return len(operation._watchers)

    assert asyncio.run(scenario()) == 0
