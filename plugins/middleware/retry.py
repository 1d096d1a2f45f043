"""The retrying wrapper, and the caller's deadline it respects.

Only errors with `retryable=True` are retried, with exponential backoff and jitter; a
`BusyError.retry_after` from the array is honoured instead of our own delay. When the attempts or
the time budget run out, the last typed error is raised with a note saying how often it was tried.
Every driver operation is idempotent (see `ringsnap.plugins.api`), which is what makes a retry after
a timeout safe.

A caller bounds the calls it starts with `deadline()`: their retries stop when the next try could
not start in time (the backup workflow does so around the snapshot taken under the freeze).
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import tenacity

from ringsnap.logs import get_logger
from ringsnap.plugins.api import ArrayDriver
from ringsnap.plugins.errors import BusyError, DriverError
from ringsnap.plugins.middleware.base import Operation, Result, WrappedDriver

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger


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


class Retrying(WrappedDriver):
    """Tries a call again while it fails retryably, within the policy and the caller's deadline.

    Logs `array operation failed, retrying` before each wait; counts the tries in the operation.
    """

    def __init__(
        self,
        inner: ArrayDriver | WrappedDriver,
        policy: RetryPolicy,
        *,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(inner)
        self.policy = policy
        self._sleep = sleep
        self._log: FilteringBoundLogger = get_logger(__name__).bind(
            array=self.array, driver=self.name
        )

    def call(self, op: Operation, function: Callable[..., Result], *args: Any) -> Result:
        def before_sleep(state: tenacity.RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome else None
            if (budget := call_budget.get()) is not None:
                budget.last_error = error
            self._log.warning(
                "array operation failed, retrying",
                op=op.name,
                attempt=state.attempt_number,
                delay_s=round(state.upcoming_sleep, 3),
                error_type=type(error).__name__,
                error=str(error),
            )

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(_retryable),
            stop=tenacity.stop_any(
                tenacity.stop_after_attempt(self.policy.attempts),
                tenacity.stop_after_delay(self.policy.deadline),
                _PastCallerDeadline(self.policy),
            ),
            wait=lambda state: self.policy.delay(
                state.attempt_number, state.outcome.exception() if state.outcome else None
            ),
            sleep=self._sleep,
            before_sleep=before_sleep,
            reraise=True,
        )
        try:
            for attempt in retrying:
                with attempt:
                    op.attempts = attempt.retry_state.attempt_number
                    result = super().call(op, function, *args)
        except DriverError as error:
            if error.retryable and op.attempts > 1:
                error.add_note(
                    f"gave up after {op.attempts} attempts in {time.monotonic() - op.started:.1f}s"
                )
            raise
        return result
