"""A node-wide bandwidth limit shared by the download's threads (`max_bandwidth_bytes`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

#: The smallest read a throttled download makes (see `Throttle.step`).
MIN_STEP = 64 * 1024


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

    def step(self, largest: int) -> int:
        """Bytes to read at a time under this limit: a sixteenth of a second's worth (at least
        `MIN_STEP`, at most `largest`). Reading `largest` at a low limit would leave each
        connection unread for `threads x largest / rate` seconds (8 threads of 1 MiB at 1 MiB/s:
        8 s), which a store may take for a dead client and cut."""
        return max(MIN_STEP, min(largest, int(self._rate) // 16))

    def take(self, amount: int, halt: threading.Event) -> None:
        """Book `amount` bytes; returns when they may go (at once when `halt` is set)."""
        now = self._clock()
        with self._lock:
            self._due = max(self._due, now - 1.0) + amount / self._rate
            wait = self._due - now
        if wait > 0:
            halt.wait(wait)
