"""The sandbox's steady write load (`ringsnap.sandbox.load.WriteLoad`) in a process of its own.

A client thread in the benchmark's own process shares its interpreter lock with the coordinator:
while the coordinator records a manifest, the client's writes (and its driver's I/O thread) wait
for the lock, and their latency would count the coordinator's CPU work as Cassandra stalls. Real
clients run elsewhere; so does this one.

    with WriteLoadProcess("bench-load", rate=200) as load:
        ...
    load.report          # a LoadReport, as WriteLoad gives it
    load.starts          # when each of its writes started, on the machine's monotonic clock
"""

from __future__ import annotations

import multiprocessing
import time
from multiprocessing.connection import Connection
from typing import Any

from ringsnap.sandbox.cluster import SandboxCluster
from ringsnap.sandbox.load import LoadReport, WriteLoad

_READY = "ready"
_STOP = "stop"


class _TimedSession:
    """The session, noting when each row write starts (`time.monotonic()`, one clock for every
    process of the machine), so that slow writes can be set beside the freeze windows."""

    def __init__(self, session: Any) -> None:
        self._session = session
        self.starts: list[float] = []

    def execute(self, statement: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(statement, str):  # the load's prepared insert, not its schema set-up
            self.starts.append(time.monotonic())
        return self._session.execute(statement, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)


def _write(instance: str, rate: float, conn: Connection) -> None:
    # A handle on the running instance, never closed here: closing would take the instance down.
    session = SandboxCluster.attach(instance).session()
    timed = _TimedSession(session)
    try:
        with WriteLoad(timed, rate=rate) as load:
            conn.send(_READY)
            conn.recv()  # _STOP
        conn.send((load.report, timed.starts))
    finally:
        session.cluster.shutdown()


class WriteLoadProcess:
    def __init__(self, instance: str, *, rate: float) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process: Any = context.Process(
            target=_write, args=(instance, rate, child), name="write-load", daemon=True
        )
        self.report = LoadReport()
        #: When each write of `report.latencies` started (`time.monotonic()`), in the same order.
        self.starts: list[float] = []

    def slowest_writes(self, count: int) -> list[tuple[float, float]]:
        """The `count` slowest writes as (start, latency), slowest first."""
        pairs = list(zip(self.starts, self.report.latencies, strict=False))
        return sorted(pairs, key=lambda pair: pair[1], reverse=True)[:count]

    def __enter__(self) -> WriteLoadProcess:
        self._process.start()
        if not self._conn.poll(120) or self._conn.recv() != _READY:
            self._process.kill()
            raise RuntimeError("the write load process did not start within 120 s")
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._conn.send(_STOP)
            if self._conn.poll(60):
                self.report, self.starts = self._conn.recv()
        finally:
            self._process.join(30)
            if self._process.is_alive():
                self._process.kill()
