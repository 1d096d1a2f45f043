"""The observing wrapper: one log event and one histogram sample per driver call.

The event is `array operation` (`array`, `driver`, `op`, `duration_ms`, `attempts`, `outcome`; on a
failure also `error_type`, `error` and, for a typed error, `retryable` and `leftovers`), the
histogram `ringsnap_array_operation_seconds{driver,op,outcome}`. The time is the whole call, retries
and waiting for the driver included. Arguments are not logged.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from prometheus_client import Histogram

from ringsnap.logs import get_logger
from ringsnap.plugins.api import ArrayDriver
from ringsnap.plugins.errors import DriverError
from ringsnap.plugins.middleware.base import Operation, Result, WrappedDriver

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger

OPERATION_SECONDS = Histogram(
    "ringsnap_array_operation_seconds",
    "Time of one driver operation, retries included",
    ["driver", "op", "outcome"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
)


class Observed(WrappedDriver):
    """Times, logs and counts each call. A foreign exception is a driver bug: outcome `bug`."""

    def __init__(self, inner: ArrayDriver | WrappedDriver) -> None:
        super().__init__(inner)
        self._log: FilteringBoundLogger = get_logger(__name__).bind(
            array=self.array, driver=self.name
        )

    def call(self, op: Operation, function: Callable[..., Result], *args: Any) -> Result:
        outcome = "error"
        failure: dict[str, object] = {}
        try:
            result = super().call(op, function, *args)
            outcome = "ok"
            return result
        except Exception as error:
            failure = {"error_type": type(error).__name__, "error": str(error)}
            if isinstance(error, DriverError):
                failure |= {"retryable": error.retryable, "leftovers": list(error.left_on_array)}
            else:
                outcome = "bug"  # a driver let a foreign exception escape: never retried
            raise
        finally:
            duration = time.monotonic() - op.started
            OPERATION_SECONDS.labels(self.name, op.name, outcome).observe(duration)
            if outcome == "ok" or failure:  # not for a cancellation or an interrupt
                log = self._log.info if outcome == "ok" else self._log.error
                log(
                    "array operation",
                    op=op.name,
                    duration_ms=round(duration * 1000, 1),
                    attempts=op.attempts,
                    outcome=outcome,
                    **failure,
                )
