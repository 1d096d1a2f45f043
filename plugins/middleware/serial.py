"""The serialising wrapper: drivers are synchronous and need not be thread-safe."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ringsnap.plugins.api import ArrayDriver
from ringsnap.plugins.middleware.base import Operation, Result, WrappedDriver


class Serialised(WrappedDriver):
    """One call at a time into the driver, `close` included. Outside the retries, a call keeps
    the driver until its last try ends."""

    def __init__(self, inner: ArrayDriver | WrappedDriver) -> None:
        super().__init__(inner)
        self._lock = threading.Lock()

    def call(self, op: Operation, function: Callable[..., Result], *args: Any) -> Result:
        with self._lock:
            return super().call(op, function, *args)

    def close(self) -> None:
        with self._lock:
            super().close()
