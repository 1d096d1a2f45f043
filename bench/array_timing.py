"""The simulator's side of each snapshot request, on the machine's monotonic clock.

The benchmark serves the array simulator in its own process; wrapping its `handle` and its pool's
`snapshot_group` splits each request that took a group snapshot into: the handler's work before
the reflinks (validation, limits, E-Series' purge check), the reflinks themselves, and the work
after them (recording, rendering the answer). What the coordinator measured as the array call
minus the handler's time is the driver, HTTP and TLS.

    taps = SnapshotRequests(stack.array.app)
    taps.requests   # [SnapshotRequest(began, reflinks_began, reflinks_ended, ended), ...]
    taps.deferred   # seconds of each run of the E-Series simulator's purge policy, which it
                    # applies after an image's POST, before the next request (after the thaw)
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from ringsnap.plugins.simulators.server import Request, Response, SimulatorApp


@dataclass
class SnapshotRequest:
    began: float
    reflinks_began: float = 0.0
    reflinks_ended: float = 0.0
    ended: float = 0.0

    @property
    def handler(self) -> float:
        return self.ended - self.began

    @property
    def before(self) -> float:
        return self.reflinks_began - self.began

    @property
    def reflinks(self) -> float:
        return self.reflinks_ended - self.reflinks_began

    @property
    def after(self) -> float:
        return self.ended - self.reflinks_ended


class SnapshotRequests:
    """Times every request of `app` that reflinked a group of LUNs."""

    def __init__(self, app: SimulatorApp) -> None:
        self.requests: list[SnapshotRequest] = []
        self.deferred: list[float] = []
        self._current = threading.local()
        self._time_deferred(app)
        handle = app.handle
        pool: Any = getattr(app, "pool", None)

        def timed_handle(request: Request) -> Response:
            timing = SnapshotRequest(time.monotonic())
            self._current.timing = timing
            try:
                return handle(request)
            finally:
                self._current.timing = None
                if timing.reflinks_ended:
                    timing.ended = time.monotonic()
                    self.requests.append(timing)

        app.handle = timed_handle  # type: ignore[method-assign]
        if pool is None:
            return
        snapshot_group = pool.snapshot_group

        def timed_snapshot_group(members: Any) -> Any:
            timing = getattr(self._current, "timing", None)
            began = time.monotonic()
            try:
                return snapshot_group(members)
            finally:
                if timing is not None:
                    timing.reflinks_began, timing.reflinks_ended = began, time.monotonic()

        # The pool is a frozen dataclass: set the instance attribute past its __setattr__.
        object.__setattr__(pool, "snapshot_group", timed_snapshot_group)

    def _time_deferred(self, app: SimulatorApp) -> None:
        apply: Any = getattr(app, "_apply_purge_policy", None)
        if apply is None:
            return

        def timed_apply() -> None:
            if not getattr(app, "_purge_due", None):
                return
            began = time.monotonic()
            try:
                apply()
            finally:
                self.deferred.append(time.monotonic() - began)

        app._apply_purge_policy = timed_apply  # type: ignore[attr-defined]
