"""The wrappers around every driver, each with one job, composed once by `wrap()`:

    wrapped = wrap(driver)        # Observed(Serialised(Retrying(driver))): blocking, same operations
    port = AsyncDriver(wrapped)   # the coordinator's ArrayPort: each call in a worker thread

- `Retrying` (retry.py): retryable `DriverError`s only, `BusyError.retry_after` honoured, the
  caller's `deadline()` respected;
- `Serialised` (serial.py): one call at a time, since drivers need not be thread-safe; outside the
  retries, so a call keeps the driver until its last try;
- `Observed` (observe.py): the `array operation` log events and the
  `ringsnap_array_operation_seconds{driver,op,outcome}` histogram, timing the whole call from the
  caller's request;
- `AsyncDriver` (aio.py): the coroutine facade.

Every wrapper has the operations of `ringsnap.plugins.api` (base.py); revert, clone and present
raise `UnsupportedError` when the driver is not `Revertible`, `Cloneable` or `Presentable`. The
four steps of a snapshot taken under a freeze are wrapped like every other operation, each under
its own `op` name; the caller bounds the commit with `deadline()`, and prepare and finish run
outside it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ringsnap.plugins.api import ArrayDriver
from ringsnap.plugins.middleware.aio import AsyncDriver
from ringsnap.plugins.middleware.base import Operation, WrappedDriver
from ringsnap.plugins.middleware.observe import OPERATION_SECONDS, Observed
from ringsnap.plugins.middleware.retry import (
    FAST_RETRY,
    CallBudget,
    Retrying,
    RetryPolicy,
    call_budget,
    deadline,
)
from ringsnap.plugins.middleware.serial import Serialised

__all__ = [
    "FAST_RETRY",
    "OPERATION_SECONDS",
    "AsyncDriver",
    "CallBudget",
    "Observed",
    "Operation",
    "RetryPolicy",
    "Retrying",
    "Serialised",
    "WrappedDriver",
    "call_budget",
    "deadline",
    "wrap",
]


def wrap(
    driver: ArrayDriver,
    *,
    retry: RetryPolicy | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> WrappedDriver:
    """`driver` inside every blocking wrapper, outermost first; `AsyncDriver` goes around it."""
    return Observed(Serialised(Retrying(driver, retry or RetryPolicy(), sleep=sleep)))
