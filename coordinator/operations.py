"""Long-running operations (backups, deletes, retention) with progress that callers can watch.

Operations live in memory: the catalog is the durable record of what they produced. A watcher gets
every change since the operation began, then each one as it happens, and the final state, even if it
subscribed after the end: a command starts a run and then watches it, and a run that moved on in
between (a loaded machine) must not lose the lines it printed meanwhile. An operation keeps every
state change and its newest `HISTORY` progress snapshots for the watchers to come; a watcher
that stops reading (a stuck client) holds at most as many: past that its oldest progress is
dropped, never a state change nor the final state.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from ringsnap.coordinator.model import OperationState
from ringsnap.logs import get_logger

log = get_logger(__name__)

#: Progress snapshots (the state unchanged) one watcher may have unread. A long run's progress
#: lines for a client that reads late fit; a client that stopped reading costs no more than this.
WATCH_BACKLOG = 1000

#: Progress snapshots an operation keeps for watchers to come (every state change is kept too): a
#: restore's or a backup's lines, with room; bounded because finished operations are kept too.
HISTORY = 256


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


class _Backlog:
    """One watcher's unread snapshots: every state change, and the newest `limit` progress ones."""

    def __init__(self, operation_id: str, limit: int, *, quiet: bool = False) -> None:
        self._operation_id = operation_id
        self._limit = limit
        #: The operation's own history drops its oldest progress without a warning: nobody is late.
        self._quiet = quiet
        self._items: deque[tuple[OperationSnapshot, bool]] = deque()  # (snapshot, progress only)
        self._progress = 0
        self._dropped = 0
        self._ready = asyncio.Event()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, snapshot: OperationSnapshot, *, progress: bool) -> None:
        if progress:
            if self._progress >= self._limit:
                self._drop_oldest_progress()
            self._progress += 1
        self._items.append((snapshot, progress))
        self._ready.set()

    def _drop_oldest_progress(self) -> None:
        # The oldest progress is at the head, behind at most the few state changes before it.
        for index, (_, progress) in enumerate(self._items):
            if progress:
                del self._items[index]
                self._progress -= 1
                break
        if self._dropped == 0 and not self._quiet:
            log.warning(
                "a watcher is not reading; its oldest progress lines are dropped",
                operation_id=self._operation_id,
                backlog=self._limit,
            )
        self._dropped += 1

    def copy(self, limit: int) -> _Backlog:
        """A watcher's backlog of `limit` progress snapshots holding what this one holds."""
        other = _Backlog(self._operation_id, limit)
        other._items = deque(self._items)
        other._progress = self._progress
        if other._items:
            other._ready.set()
        return other

    async def get(self) -> OperationSnapshot:
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        snapshot, progress = self._items.popleft()
        if progress:
            self._progress -= 1
        return snapshot


class Operation:
    def __init__(self, kind: str, backup_id: str = "", *, backlog: int = WATCH_BACKLOG) -> None:
        if backlog < 1:
            raise ValueError(
                f"an operation's watch backlog must hold 1 snapshot or more: {backlog}"
            )
        # The backup id is known from the start, so that callers can report it at once.
        self._current = OperationSnapshot(
            uuid.uuid4().hex, kind, OperationState.PENDING, backup_id=backup_id
        )
        self._backlog = backlog
        #: What a watcher that comes now reads first: every snapshot so far, within the bound.
        self._history = _Backlog(self._current.operation_id, min(backlog, HISTORY), quiet=True)
        self._history.put(self._current, progress=False)
        #: Each watcher's snapshots it has not read yet.
        self._watchers: set[_Backlog] = set()
        self.task: asyncio.Task[None] | None = None
        #: What made it fail (for callers that map error kinds, e.g. to status codes).
        self.error: Exception | None = None

    @property
    def current(self) -> OperationSnapshot:
        return self._current

    def unread_counts(self) -> list[int]:
        """How many snapshots each watcher has not read yet."""
        return [len(backlog) for backlog in self._watchers]

    async def update(self, **changes: object) -> None:
        previous = self._current
        self._current = replace(previous, **changes)  # type: ignore[arg-type]
        progress = self._current.state is previous.state
        for backlog in (self._history, *self._watchers):
            backlog.put(self._current, progress=progress)

    def update_soon(self, **changes: object) -> None:
        """For synchronous progress callbacks inside the running operation."""
        asyncio.get_running_loop().create_task(self.update(**changes))

    async def watch(self) -> AsyncGenerator[OperationSnapshot, None]:
        """Every snapshot since the operation began (its state changes, and its newest progress
        within the backlog), then every later one in order, until the final state. None is
        skipped while the watcher keeps within the backlog of progress snapshots; past it, its
        oldest unread progress is dropped (a state change and the final state never are)."""
        # Filled from the history and registered with no await in between: no change falls
        # between the two.
        backlog = self._history.copy(self._backlog)
        self._watchers.add(backlog)
        try:
            snapshot = await backlog.get()
            yield snapshot
            while not snapshot.state.finished:
                snapshot = await backlog.get()
                yield snapshot
        finally:
            self._watchers.discard(backlog)


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
