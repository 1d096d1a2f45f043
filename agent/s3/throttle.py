"""A node-wide bandwidth limit shared by the download's threads (`max_bandwidth_bytes`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class Throttle:
    """Paces bytes to `rate` per second across threads: each caller books its bytes on one
    timeline and sleeps until its share is due. A burst of one second is allowed (a pause, such as
    a slow request, is not saved up for longer)."""

    def __init__(self, rate: int, clock: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0:
            raise ValueError(f"rate {rate} <= 0")
        self._rate = float(rate)
        self._clock = clock
        self._lock = threading.Lock()
        self._due = clock() - 1.0  # the burst is there from the start

    def take(self, amount: int, halt: threading.Event) -> None:
        """Book `amount` bytes; returns when they may go (at once when `halt` is set)."""
        now = self._clock()
        with self._lock:
            self._due = max(self._due, now - 1.0) + amount / self._rate
            wait = self._due - now
        if wait > 0:
            halt.wait(wait)
