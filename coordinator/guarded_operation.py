"""A long run of the daemon (a drill, a table restore) as an API operation that holds its cluster:
the cluster's lease taken (as every run takes it), the run prepared (a refusal is then the
caller's answer, and nothing is left held), then run as an operation whose phase is the run's step
and whose message is its latest progress line; at the end, whatever happened, what was opened is
closed and the cluster given back."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from ringsnap.coordinator.model import OperationKind
from ringsnap.coordinator.operations import Operation, Operations
from ringsnap.coordinator.runs.lease import ClusterLeases, Lease
from ringsnap.logs import get_logger

log = get_logger(__name__)
T = TypeVar("T")

#: (node, step, message); node "" for the whole run.
Progress = Callable[[str, str, str], None]
Run = Callable[[Progress], Awaitable[T]]


@dataclass(frozen=True)
class Prepared(Generic[T]):
    """What `prepare` made: the run, the operation's first line, and the backup it is of."""

    run: Run[T]
    intro: str
    backup_id: str


def progress_line(node: str, step: str, message: str) -> str:
    return f"{node}: {step} {message}".strip() if node else f"{step} {message}".strip()


class AtMostOnce:
    """`action`, run by its first call only (`done` once called): a release reached both from a
    failure and from the end of a run gives back once."""

    def __init__(self, action: Callable[[], Awaitable[None]]) -> None:
        self._action = action
        self.done = False

    async def __call__(self) -> None:
        if not self.done:
            self.done = True
            await self._action()


async def start_guarded(
    operations: Operations,
    leases: ClusterLeases,
    lease: Lease,
    kind: OperationKind,
    prepare: Callable[[contextlib.AsyncExitStack], Awaitable[Prepared[T]]],
    *,
    verdict: Callable[[T], str],
    finished: Callable[[], None] = lambda: None,
) -> Operation:
    """Take `lease`'s cluster, `prepare` (entering what it opens into the stack it is given), and
    start the run as an operation of `kind`. A failure of `prepare` (a refusal) gives everything
    back and is raised."""
    leases.take(lease)
    stack = contextlib.AsyncExitStack()
    try:
        prepared = await prepare(stack)
    except BaseException:
        await asyncio.shield(stack.aclose())
        leases.give_back(lease)
        raise

    @AtMostOnce
    async def release() -> None:
        try:
            await stack.aclose()
        finally:
            leases.give_back(lease)
            try:
                finished()
            except Exception as exc:  # metrics never fail a run
                log.error("metrics not refreshed", kind=kind.value, error=str(exc))

    async def work(operation: Operation) -> None:
        loop = asyncio.get_running_loop()
        updates: set[asyncio.Task[None]] = set()

        def progress(node: str, step: str, message: str) -> None:
            task = loop.create_task(
                operation.update(phase=step, message=progress_line(node, step, message))
            )
            updates.add(task)
            task.add_done_callback(updates.discard)

        try:
            await operation.update(phase="plan", message=prepared.intro)
            result = await prepared.run(progress)
            await asyncio.gather(*updates)  # every progress line lands before the verdict
            await operation.update(phase="record", message=verdict(result))
        finally:
            await asyncio.shield(release())

    operation = operations.start(kind.value, work, backup_id=prepared.backup_id)
    tasks: set[asyncio.Task[None]] = set()

    def ended(_: object) -> None:
        # A task cancelled before its first step never ran `work`'s release: run it now.
        if not release.done:
            task = asyncio.get_running_loop().create_task(release())
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    if operation.task is not None:
        operation.task.add_done_callback(ended)
    return operation
