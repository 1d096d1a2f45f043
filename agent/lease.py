"""Freeze leases: how long a freeze may last without renewal, and the bounds a caller must respect.

Pure logic on a monotonic clock, so that the watchdog's arithmetic is tested without waiting.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from ringsnap.errors import ValidationError

Clock = Callable[[], float]
#: Shorter leases cannot even cover the round trip of the renewal that would extend them.
MIN_LEASE_SECONDS = 0.05


@dataclass(frozen=True, slots=True)
class LeasePolicy:
    default_seconds: float
    max_seconds: float
    min_seconds: float = MIN_LEASE_SECONDS

    def choose(self, requested: float | None) -> float:
        """The lease for a request: the default when none (or zero) was asked for; a request
        outside [min, max] is refused, never silently clamped."""
        if requested is None or requested == 0:
            return self.default_seconds
        if not math.isfinite(requested) or requested < 0:
            raise ValidationError(f"lease {requested!r} s is not a positive duration")
        if requested < self.min_seconds:
            raise ValidationError(
                f"lease {requested:g} s is shorter than the minimum {self.min_seconds:g} s"
            )
        if requested > self.max_seconds:
            raise ValidationError(
                f"lease {requested:g} s exceeds this agent's maximum of {self.max_seconds:g} s"
                " (freeze.max_lease_seconds); renew a short lease instead"
            )
        return requested


class Lease:
    """A deadline on a monotonic clock, moved by renewals."""

    def __init__(self, seconds: float, *, clock: Clock = time.monotonic) -> None:
        self._clock = clock
        self.seconds = seconds
        self.deadline = clock() + seconds
        self.renewals = 0

    def renew(self, seconds: float) -> None:
        """The lease now ends `seconds` from now (a renewal may also shorten it)."""
        self.seconds = seconds
        self.deadline = self._clock() + seconds
        self.renewals += 1

    def remaining(self) -> float:
        return self.deadline - self._clock()

    def expired(self) -> bool:
        return self.remaining() <= 0

    def expires_at_wall(self) -> float:
        """The deadline as a Unix time, for responses (the deadline itself never follows the wall clock)."""
        return time.time() + self.remaining()
