"""Long-running operations (backups, deletes, retention) with progress that callers can watch.

Operations live in memory: the catalog is the durable record of what they produced. A watcher gets
every change as it happens and the final state, even if it subscribed after the end.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from ringsnap.coordinator.model import OperationState


@dataclass(frozen=True)
class OperationSnapshot:
    """One immutable view of an operation; a new one is published at every change."""

    operation_id: str
    kind: str
    state: OperationState
    phase: str = ""
    message: str = ""
    backup_id: str = ""
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    finished_at: datetime | None = None
    timings: tuple[tuple[str, float], ...] = ()
    errors: tuple[str, ...] = ()


class Operation:
    def __init__(self, kind: str, backup_id: str = "") -> None:
        # The backup id is known from the start, so that callers can report it at once.
        self._current = OperationSnapshot(
            uuid.uuid4().hex, kind, OperationState.PENDING, backup_id=backup_id
        )
        #: Each watcher's queue of the snapshots it has not read yet.
        self._watchers: set[asyncio.Queue[OperationSnapshot]] = set()
        self.task: asyncio.Task[None] | None = None
        #: What made it fail (for callers that map error kinds, e.g. to status codes).
        self.error: Exception | None = None

    @property
    def current(self) -> OperationSnapshot:
        return self._current

    async def update(self, **changes: object) -> None:
        self._current = replace(self._current, **changes)  # type: ignore[arg-type]
        for queue in self._watchers:
            queue.put_nowait(self._current)

    def update_soon(self, **changes: object) -> None:
        """For synchronous progress callbacks inside the running operation."""
        asyncio.get_running_loop().create_task(self.update(**changes))

    async def watch(self) -> AsyncGenerator[OperationSnapshot, None]:
        """The current snapshot, then every later one in order (none is skipped, however slowly
        the watcher reads: a progress line is never lost), until the final state."""
        # Registered and read with no await in between: no change falls between the two.
        queue: asyncio.Queue[OperationSnapshot] = asyncio.Queue()
        self._watchers.add(queue)
        try:
            snapshot = self._current
            yield snapshot
            while not snapshot.state.finished:
                snapshot = await queue.get()
                yield snapshot
        finally:
            self._watchers.discard(queue)


class Operations:
    """The operations of one coordinator process, by id; finished ones are kept for a while."""

    def __init__(self, keep_finished: int = 1000) -> None:
        self._by_id: dict[str, Operation] = {}
        self._keep = keep_finished

    def get(self, operation_id: str) -> Operation | None:
        return self._by_id.get(operation_id)

    def running(self) -> list[Operation]:
        return [op for op in self._by_id.values() if not op.current.state.finished]

    def for_backup(self, backup_id: str) -> Operation | None:
        """The newest operation working on `backup_id`."""
        matches = [op for op in self._by_id.values() if op.current.backup_id == backup_id]
        return matches[-1] if matches else None

    def start(
        self, kind: str, work: Callable[[Operation], Awaitable[None]], *, backup_id: str = ""
    ) -> Operation:
        """Run `work` as a task; its exception becomes the FAILED state with the message."""
        operation = Operation(kind, backup_id)
        self._by_id[operation.current.operation_id] = operation
        self._forget_old()

        async def runner() -> None:
            await operation.update(state=OperationState.RUNNING, backup_id=backup_id)
            try:
                await work(operation)
            except asyncio.CancelledError:
                await operation.update(
                    state=OperationState.CANCELLED, finished_at=datetime.now(UTC)
                )
                raise
            except Exception as exc:
                operation.error = exc
                await operation.update(
                    state=OperationState.FAILED,
                    errors=(*operation.current.errors, str(exc)),
                    message=str(exc),
                    finished_at=datetime.now(UTC),
                )
            else:
                await operation.update(
                    state=OperationState.SUCCEEDED, finished_at=datetime.now(UTC)
                )

        operation.task = asyncio.get_running_loop().create_task(runner())
        return operation

    def _forget_old(self) -> None:
        finished = [op for op in self._by_id.values() if op.current.state.finished]
        for op in finished[: max(0, len(finished) - self._keep)]:
            del self._by_id[op.current.operation_id]
