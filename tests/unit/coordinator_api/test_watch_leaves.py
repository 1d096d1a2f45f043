"""A WatchOperation whose caller leaves forgets its watcher: grpc.aio cancels the handler's task
and never closes the handler's generator, which the garbage collector's finalizer closes later;
closing it must close the operation's watch with it, not leave that to another finalizer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from types import SimpleNamespace
from typing import Any, cast

from ringsnap.api.v1 import coordinator_pb2 as pb
from ringsnap.api.v1 import types_pb2
from ringsnap.coordinator.api.servicer import CoordinatorServicer
from ringsnap.coordinator.operations import Operation, Operations
from ringsnap.coordinator.service import Coordinator

from .conftest import Harness


def test_closing_the_rpcs_generator_forgets_the_watcher_at_once() -> None:
    async def scenario() -> tuple[int, int]:
        operations = Operations()

        async def forever(_op: Operation) -> None:
            await asyncio.Event().wait()

        operation = operations.start("backup", forever)
        servicer = CoordinatorServicer(cast(Coordinator, SimpleNamespace(operations=operations)))
        stream = cast(
            AsyncGenerator[types_pb2.Operation, None],
            servicer.WatchOperation(
                pb.WatchOperationRequest(operation_id=operation.current.operation_id),
                cast(Any, None),
            ),
        )
        stuck = asyncio.Event()  # a client that stopped reading: its write never completes

        async def serve() -> None:  # what grpc.aio does with a streaming handler
            async for _message in stream:
                await stuck.wait()

        serving = asyncio.create_task(serve())
        while not operation.unread_counts():
            await asyncio.sleep(0)
        watching = len(operation.unread_counts())
        serving.cancel()  # the caller cancelled: grpc.aio cancels the handler's task
        await asyncio.wait([serving])
        await stream.aclose()  # as the finalizer does once the handler is dropped
        left = len(operation.unread_counts())  # no other task has run since
        assert operation.task is not None
        operation.task.cancel()
        await asyncio.wait([operation.task])
        return watching, left

    assert asyncio.run(scenario()) == (1, 0)


def test_a_caller_that_cancels_its_watch_is_forgotten(harness: Harness) -> None:
    stub = harness.stub()
    harness.hold_flush("n1")
    started = stub.StartBackup(pb.StartBackupRequest(cluster="prod", trigger="test"), timeout=10)
    operation = harness.coordinator.operations.get(started.operation_id)
    assert operation is not None

    async def watchers() -> int:
        return len(operation.unread_counts())

    stream = stub.WatchOperation(
        pb.WatchOperationRequest(operation_id=started.operation_id), timeout=30
    )
    next(stream)
    assert harness.call(watchers()) == 1
    stream.cancel()
    deadline = time.monotonic() + 10  # a bound for a loaded machine, not a timing
    while harness.call(watchers()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert harness.call(watchers()) == 0, "the watcher of a cancelled RPC is still fed"
    harness.release_flush("n1")
    final = list(
        stub.WatchOperation(pb.WatchOperationRequest(operation_id=started.operation_id), timeout=30)
    )
    assert final[-1].state == types_pb2.OPERATION_STATE_SUCCEEDED
