"""Progress of one node's transfer: bytes, files, rate and ETA, reported at most every interval."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Progress:
    files_total: int
    bytes_total: int
    #: Done = transferred or found already in place (skipped).
    files_done: int
    bytes_done: int
    files_transferred: int
    bytes_transferred: int
    elapsed_seconds: float
    final: bool

    @property
    def rate_bytes_per_second(self) -> float:
        return self.bytes_transferred / self.elapsed_seconds if self.elapsed_seconds > 0 else 0.0

    @property
    def eta_seconds(self) -> float | None:
        """Seconds left at the current rate (None before anything moved)."""
        rate = self.rate_bytes_per_second
        return (self.bytes_total - self.bytes_done) / rate if rate > 0 else None

    def message_fields(self) -> dict[str, Any]:
        """The fields a download's and an export's progress messages share (an ETA not known
        yet is -1 on the wire)."""
        eta = self.eta_seconds
        return {
            "files_total": self.files_total,
            "bytes_total": self.bytes_total,
            "files_done": self.files_done,
            "bytes_done": self.bytes_done,
            "elapsed_seconds": self.elapsed_seconds,
            "rate_bytes_per_second": self.rate_bytes_per_second,
            "eta_seconds": -1.0 if eta is None else eta,
        }


Reporter = Callable[[Progress], None]


class Tracker:
    """Thread-safe counters fed by the transfer threads; calls `reporter` at most every `interval`."""

    def __init__(
        self, files_total: int, bytes_total: int, reporter: Reporter | None, interval: float = 0.5
    ) -> None:
        self._lock = threading.Lock()
        self._reporter = reporter
        self._interval = interval
        self._started = time.monotonic()
        self._last = 0.0
        self.files_total, self.bytes_total = files_total, bytes_total
        self.files_done = self.bytes_done = 0
        self.files_transferred = self.bytes_transferred = 0

    def transferred(self, amount: int) -> None:
        """Bytes moved (s3transfer's progress callback; may be negative on a retried part)."""
        with self._lock:
            self.bytes_transferred += amount
            self.bytes_done += amount
        self._maybe_report()

    def file_transferred(self) -> None:
        with self._lock:
            self.files_transferred += 1
            self.files_done += 1
        self._maybe_report()

    def skipped(self, size: int) -> None:
        with self._lock:
            self.files_done += 1
            self.bytes_done += size
        self._maybe_report()

    def snapshot(self, *, final: bool = False) -> Progress:
        with self._lock:
            return Progress(
                files_total=self.files_total,
                bytes_total=self.bytes_total,
                files_done=self.files_done,
                bytes_done=self.bytes_done,
                files_transferred=self.files_transferred,
                bytes_transferred=self.bytes_transferred,
                elapsed_seconds=time.monotonic() - self._started,
                final=final,
            )

    def finish(self) -> Progress:
        progress = self.snapshot(final=True)
        if self._reporter is not None:
            self._reporter(progress)
        return progress

    def _maybe_report(self) -> None:
        if self._reporter is None:
            return
        now = time.monotonic()
        with self._lock:
            if now - self._last < self._interval:
                return
            self._last = now
        self._reporter(self.snapshot())
