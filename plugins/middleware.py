"""The one wrapper around every driver: retries, timing, structured logs, and an async facade.

    managed = wrap(driver)                  # ManagedDriver (+ Revertible/Cloneable if the driver is)
    await managed.aio.create_group_snapshot(volumes, name)   # off the event loop

The four steps of a snapshot taken under a freeze (`prepare_group_snapshot`,
`commit_group_snapshot`, `finish_group_snapshot`, `abort_group_snapshot`, see
`ringsnap.plugins.api`) are wrapped like every other operation, each under its own `op` name. The
caller bounds the commit with `deadline()`: its retries stop when the next try could not start in
time, exactly as for `create_group_snapshot`; prepare and finish run outside it.

Retries: only errors with `retryable=True` are retried, with exponential backoff and jitter; a
`BusyError.retry_after` from the array is honoured instead of our own delay. When the attempts or
the time budget run out, the last typed error is raised with a note saying how often it was tried.
Every driver operation is idempotent (see `ringsnap.plugins.api`), which is what makes a retry after
a timeout safe.

Timing and logs: one `array operation` event per call (`array`, `driver`, `op`, `duration_ms`,
`attempts`, `outcome`), one `array operation failed, retrying` event per retry, and the Prometheus
histogram `ringsnap_array_operation_seconds{driver,op,outcome}`. Arguments are not logged.

Calls into one driver are serialised by a lock: drivers are synchronous and need not be
thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import tenacity
from prometheus_client import Histogram

from ringsnap.logs import get_logger
from ringsnap.plugins.api import ArrayDriver, Cloneable, PreparedSnapshot, Revertible
from ringsnap.plugins.errors import BusyError, DriverError, UnsupportedError
from ringsnap.plugins.types import Capabilities, SnapshotInfo, SnapshotRef, Volume

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger

Result = TypeVar("Result")

OPERATION_SECONDS = Histogram(
    "ringsnap_array_operation_seconds",
    "Time of one driver operation, retries included",
    ["driver", "op", "outcome"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
)


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a retryable failure is tried again."""

    #: Total tries, the first included.
    attempts: int = 5
    initial_delay: float = 0.5
    max_delay: float = 30.0
    multiplier: float = 2.0
    #: Random extra delay, as a fraction of the computed delay (spreads out simultaneous retries).
    jitter: float = 0.2
    #: Give up once this much time has passed since the first try (seconds).
    deadline: float = 300.0
    #: Longest `Retry-After` we accept from an array before capping it.
    max_retry_after: float = 120.0

    def delay(self, attempt: int, error: BaseException | None) -> float:
        """Seconds to wait after failed try number `attempt` (1-based)."""
        if isinstance(error, BusyError) and error.retry_after is not None:
            return min(max(error.retry_after, 0.0), self.max_retry_after)
        base = min(self.initial_delay * self.multiplier ** (attempt - 1), self.max_delay)
        return base + random.uniform(0, base * self.jitter)  # noqa: S311 - jitter, not crypto


#: For tests and simulators: retries without waiting long.
FAST_RETRY = RetryPolicy(attempts=4, initial_delay=0.01, max_delay=0.05, deadline=60.0)


@dataclass
class CallBudget:
    """A caller's deadline (time.monotonic()) for the driver calls it starts, retries included.

    The backup workflow sets one around the snapshot taken while nodes are frozen: a retry that
    could not start before the freeze budget runs out is not started, and every failed attempt is
    kept in `last_error`, so that a caller that stops waiting can still say what the array said.
    It travels in a context variable, which `asyncio.to_thread` carries into the worker thread.
    """

    until: float
    last_error: BaseException | None = None


call_budget: ContextVar[CallBudget | None] = ContextVar("ringsnap_call_budget", default=None)


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[CallBudget]:
    """Bound the driver calls started in this context (and in tasks created in it)."""
    budget = CallBudget(time.monotonic() + seconds)
    token = call_budget.set(budget)
    try:
        yield budget
    finally:
        call_budget.reset(token)


class _PastCallerDeadline(tenacity.stop.stop_base):
    """Stop when the next try could not start before the caller's deadline."""

    def __init__(self, policy: RetryPolicy) -> None:
        self._policy = policy

    def __call__(self, state: tenacity.RetryCallState) -> bool:
        budget = call_budget.get()
        if budget is None:
            return False
        error = state.outcome.exception() if state.outcome else None
        return time.monotonic() + self._policy.delay(state.attempt_number, error) >= budget.until


def _retryable(error: BaseException) -> bool:
    return isinstance(error, DriverError) and error.retryable


class ManagedDriver:
    """A driver wrapped with retries, timing and logs. Same operations as `ArrayDriver`.

    Built by `wrap()`, which returns a subclass that is also `Revertible`/`Cloneable` exactly
    when the wrapped driver is.
    """

    def __init__(
        self,
        driver: ArrayDriver,
        *,
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.driver = driver
        self.retry = retry or RetryPolicy()
        self._sleep = sleep
        self._lock = threading.Lock()
        self._log: FilteringBoundLogger = get_logger(__name__).bind(
            array=driver.array, driver=driver.name
        )

    @property
    def array(self) -> str:
        return self.driver.array

    @property
    def name(self) -> str:
        return self.driver.name

    @property
    def aio(self) -> AsyncDriver:
        """The same driver for coroutines: every call runs in a worker thread."""
        return AsyncDriver(self)

    def call(self, op: str, function: Callable[..., Result], *args: Any) -> Result:
        """Run `function(*args)` with retries, timing and logs, as operation `op`."""
        started = time.monotonic()
        attempts = 0

        def before_sleep(state: tenacity.RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome else None
            if (budget := call_budget.get()) is not None:
                budget.last_error = error
            self._log.warning(
                "array operation failed, retrying",
                op=op,
                attempt=state.attempt_number,
                delay_s=round(state.upcoming_sleep, 3),
                error_type=type(error).__name__,
                error=str(error),
            )

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(_retryable),
            stop=tenacity.stop_any(
                tenacity.stop_after_attempt(self.retry.attempts),
                tenacity.stop_after_delay(self.retry.deadline),
                _PastCallerDeadline(self.retry),
            ),
            wait=lambda state: self.retry.delay(
                state.attempt_number, state.outcome.exception() if state.outcome else None
            ),
            sleep=self._sleep,
            before_sleep=before_sleep,
            reraise=True,
        )
        outcome = "error"
        try:
            with self._lock:
                for attempt in retrying:
                    with attempt:
                        attempts = attempt.retry_state.attempt_number
                        result = function(*args)
            outcome = "ok"
            return result
        except DriverError as error:
            if error.retryable and attempts > 1:
                error.add_note(
                    f"gave up after {attempts} attempts in {time.monotonic() - started:.1f}s"
                )
            self._log.error(
                "array operation",
                op=op,
                duration_ms=round((time.monotonic() - started) * 1000, 1),
                attempts=attempts,
                outcome=outcome,
                error_type=type(error).__name__,
                error=str(error),
                retryable=error.retryable,
                leftovers=list(error.leftovers),
            )
            raise
        except Exception as error:
            # A driver let a foreign exception escape: a bug in the driver, never retried.
            self._log.error(
                "array operation",
                op=op,
                duration_ms=round((time.monotonic() - started) * 1000, 1),
                attempts=attempts,
                outcome="bug",
                error_type=type(error).__name__,
                error=str(error),
            )
            outcome = "bug"
            raise
        finally:
            duration = time.monotonic() - started
            OPERATION_SECONDS.labels(self.driver.name, op, outcome).observe(duration)
            if outcome == "ok":
                self._log.info(
                    "array operation",
                    op=op,
                    duration_ms=round(duration * 1000, 1),
                    attempts=attempts,
                    outcome=outcome,
                )

    # The ArrayDriver operations.

    def capabilities(self) -> Capabilities:
        return self.driver.capabilities()

    def check(self) -> None:
        self.call("check", self.driver.check)

    def list_volumes(self) -> Sequence[Volume]:
        return self.call("list_volumes", self.driver.list_volumes)

    def create_group_snapshot(self, volumes: Sequence[Volume], name: str) -> SnapshotRef:
        return self.call(
            "create_group_snapshot", self.driver.create_group_snapshot, tuple(volumes), name
        )

    def prepare_group_snapshot(self, volumes: Sequence[Volume], name: str) -> PreparedSnapshot:
        return self.call(
            "prepare_group_snapshot", self.driver.prepare_group_snapshot, tuple(volumes), name
        )

    def commit_group_snapshot(self, prepared: PreparedSnapshot) -> SnapshotRef:
        return self.call("commit_group_snapshot", self.driver.commit_group_snapshot, prepared)

    def finish_group_snapshot(self, prepared: PreparedSnapshot) -> None:
        self.call("finish_group_snapshot", self.driver.finish_group_snapshot, prepared)

    def abort_group_snapshot(self, prepared: PreparedSnapshot) -> None:
        self.call("abort_group_snapshot", self.driver.abort_group_snapshot, prepared)

    def list_snapshots(self, volumes: Sequence[Volume]) -> Sequence[SnapshotInfo]:
        return self.call("list_snapshots", self.driver.list_snapshots, tuple(volumes))

    def get_snapshot(self, ref: SnapshotRef) -> SnapshotInfo:
        return self.call("get_snapshot", self.driver.get_snapshot, ref)

    def delete_snapshot(self, ref: SnapshotRef) -> None:
        self.call("delete_snapshot", self.driver.delete_snapshot, ref)

    def close(self) -> None:
        with self._lock:
            self.driver.close()


class _RevertOperations(Revertible):
    driver: Any
    call: Callable[..., Any]

    def revert_plan(self, ref: SnapshotRef) -> Sequence[str]:
        plan: Sequence[str] = self.call("revert_plan", self.driver.revert_plan, ref)
        return plan

    def revert(self, ref: SnapshotRef) -> None:
        self.call("revert", self.driver.revert, ref)


class _CloneOperations(Cloneable):
    driver: Any
    call: Callable[..., Any]

    def clone(self, ref: SnapshotRef, suffix: str) -> Sequence[Volume]:
        clones: Sequence[Volume] = self.call("clone", self.driver.clone, ref, suffix)
        return clones

    def delete_clone(self, volume: Volume) -> None:
        self.call("delete_clone", self.driver.delete_clone, volume)


class ManagedRevertibleDriver(ManagedDriver, _RevertOperations):
    """A managed driver that can revert in place."""


class ManagedCloneableDriver(ManagedDriver, _CloneOperations):
    """A managed driver that can clone."""


class ManagedFullDriver(ManagedDriver, _RevertOperations, _CloneOperations):
    """A managed driver that can revert and clone."""


def wrap(
    driver: ArrayDriver,
    *,
    retry: RetryPolicy | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> ManagedDriver:
    """Wrap `driver`; the result is Revertible/Cloneable exactly when `driver` is."""
    revertible = isinstance(driver, Revertible)
    cloneable = isinstance(driver, Cloneable)
    kind: type[ManagedDriver]
    if revertible and cloneable:
        kind = ManagedFullDriver
    elif revertible:
        kind = ManagedRevertibleDriver
    elif cloneable:
        kind = ManagedCloneableDriver
    else:
        kind = ManagedDriver
    return kind(driver, retry=retry, sleep=sleep)


class AsyncDriver:
    """Coroutine facade for the coordinator: each call runs in a worker thread.

    A cancelled coroutine does not stop the array call already running in its thread; the
    driver's own timeouts bound it.
    """

    def __init__(self, managed: ManagedDriver) -> None:
        self.managed = managed

    @property
    def array(self) -> str:
        return self.managed.array

    @property
    def name(self) -> str:
        return self.managed.name

    @property
    def revertible(self) -> bool:
        return isinstance(self.managed, Revertible)

    @property
    def cloneable(self) -> bool:
        return isinstance(self.managed, Cloneable)

    def capabilities(self) -> Capabilities:
        return self.managed.capabilities()

    async def check(self) -> None:
        await asyncio.to_thread(self.managed.check)

    async def list_volumes(self) -> Sequence[Volume]:
        return await asyncio.to_thread(self.managed.list_volumes)

    async def create_group_snapshot(self, volumes: Sequence[Volume], name: str) -> SnapshotRef:
        return await asyncio.to_thread(self.managed.create_group_snapshot, volumes, name)

    async def prepare_group_snapshot(
        self, volumes: Sequence[Volume], name: str
    ) -> PreparedSnapshot:
        return await asyncio.to_thread(self.managed.prepare_group_snapshot, volumes, name)

    async def commit_group_snapshot(self, prepared: PreparedSnapshot) -> SnapshotRef:
        return await asyncio.to_thread(self.managed.commit_group_snapshot, prepared)

    async def finish_group_snapshot(self, prepared: PreparedSnapshot) -> None:
        await asyncio.to_thread(self.managed.finish_group_snapshot, prepared)

    async def abort_group_snapshot(self, prepared: PreparedSnapshot) -> None:
        await asyncio.to_thread(self.managed.abort_group_snapshot, prepared)

    async def list_snapshots(self, volumes: Sequence[Volume]) -> Sequence[SnapshotInfo]:
        return await asyncio.to_thread(self.managed.list_snapshots, volumes)

    async def get_snapshot(self, ref: SnapshotRef) -> SnapshotInfo:
        return await asyncio.to_thread(self.managed.get_snapshot, ref)

    async def delete_snapshot(self, ref: SnapshotRef) -> None:
        await asyncio.to_thread(self.managed.delete_snapshot, ref)

    async def revert_plan(self, ref: SnapshotRef) -> Sequence[str]:
        return await asyncio.to_thread(self._revertible().revert_plan, ref)

    async def revert(self, ref: SnapshotRef) -> None:
        await asyncio.to_thread(self._revertible().revert, ref)

    async def clone(self, ref: SnapshotRef, suffix: str) -> Sequence[Volume]:
        return await asyncio.to_thread(self._cloneable().clone, ref, suffix)

    async def delete_clone(self, volume: Volume) -> None:
        await asyncio.to_thread(self._cloneable().delete_clone, volume)

    async def close(self) -> None:
        await asyncio.to_thread(self.managed.close)

    def _revertible(self) -> Revertible:
        if not isinstance(self.managed, Revertible):
            raise UnsupportedError(f"driver {self.name!r} cannot revert in place", array=self.array)
        return self.managed

    def _cloneable(self) -> Cloneable:
        if not isinstance(self.managed, Cloneable):
            raise UnsupportedError(f"driver {self.name!r} cannot clone", array=self.array)
        return self.managed
