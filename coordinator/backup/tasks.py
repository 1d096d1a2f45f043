"""Waiting on what a run started: bounded answers, work that must end despite a cancellation, and
what a task that was left running, or has ended, gave."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from ringsnap.coordinator.backup.model import BackupFailed

T = TypeVar("T")


@dataclass(frozen=True)
class Running:
    """Still running: its driver call goes on in its thread, whoever waits for it."""


@dataclass(frozen=True)
class Failed:
    """Ended by an exception."""

    error: BaseException


@dataclass(frozen=True)
class Cancelled(Failed):
    """Ended by a cancellation (match it before `Failed`)."""

    error: BaseException = field(default_factory=lambda: asyncio.CancelledError("cancelled"))


@dataclass(frozen=True)
class Done(Generic[T]):
    value: T


def triage(task: asyncio.Future[T]) -> Running | Failed | Done[T]:
    """What `task` gave so far, without waiting."""
    if not task.done():
        return Running()
    if task.cancelled():
        return Cancelled()
    if (error := task.exception()) is not None:
        return Failed(error)
    return Done(task.result())


async def settled(task: asyncio.Future[T], timeout: float) -> Running | Failed | Done[T]:
    """What `task` gave once it ends, or `Running` after `timeout` seconds; `task` is never
    cancelled (an array call goes on in its thread whatever happens to its coroutine)."""
    await asyncio.wait([task], timeout=timeout)
    return triage(task)


def raise_failures(subjects: Sequence[str], what: str, results: Sequence[object]) -> None:
    """One BackupFailed naming every subject whose parallel call raised, in order."""
    failures = [
        f"{subject}: {what} failed: {result}"
        for subject, result in zip(subjects, results, strict=True)
        if isinstance(result, BaseException)
    ]
    if failures:
        raise BackupFailed("; ".join(failures))


async def bounded(what: str, awaitable: Awaitable[T], timeout: float) -> T:
    """`awaitable`'s result, or BackupFailed after `timeout` s. `asyncio.timeout`, not
    `wait_for`: on 3.11 `wait_for` swallows a cancellation that arrives as the answer does."""
    try:
        async with asyncio.timeout(timeout):
            return await awaitable
    except TimeoutError:
        raise BackupFailed(f"{what}: no answer within {timeout:g} s") from None


async def to_completion(awaitable: Awaitable[T]) -> T:
    """Await to the end even if this task is cancelled meanwhile, however often, then let the
    cancellation go on. For what a failing run must finish before it is recorded (the thaw, and
    the clean-up whose leftovers the record lists); a bare `shield` gives up at the second
    cancellation and the record would miss what the clean-up finds afterwards."""
    task = asyncio.ensure_future(awaitable)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
            break
        except asyncio.CancelledError:
            if task.done():
                raise  # the work itself was cancelled
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return result
