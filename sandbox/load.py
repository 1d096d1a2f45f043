"""A steady client write load, to show that backups do not hurt writers.

Writes 1 KiB rows at a fixed rate from a background thread and keeps every latency and error, so
that tests can assert "no errors" and benchmarks can report p99/max side by side with a baseline.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from cassandra import ConsistencyLevel


@dataclass
class LoadReport:
    writes: int = 0
    errors: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)

    def percentile(self, fraction: float) -> float:
        if not self.latencies:
            return 0.0
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]

    @property
    def max_latency(self) -> float:
        return max(self.latencies, default=0.0)

    def summary(self) -> str:
        return (
            f"writes={self.writes} errors={len(self.errors)}"
            f" p99_ms={self.percentile(0.99) * 1000:.1f} max_ms={self.max_latency * 1000:.1f}"
        )


class WriteLoad:
    """`with WriteLoad(session, rate=200) as load: ...` then `load.report`."""

    def __init__(self, session: Any, *, rate: float = 200.0, keyspace: str = "ringsnap_load"):
        self._session = session
        self._rate = rate
        self._keyspace = keyspace
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="write-load", daemon=True)
        self.report = LoadReport()

    def prepare(self) -> None:
        self._session.execute(
            f"CREATE KEYSPACE IF NOT EXISTS {self._keyspace} WITH replication ="
            " {'class': 'SimpleStrategy', 'replication_factor': 3}"
        )
        self._session.execute(
            f"CREATE TABLE IF NOT EXISTS {self._keyspace}.rows (id uuid PRIMARY KEY, body blob)"
        )

    def _run(self) -> None:
        insert = self._session.prepare(
            f"INSERT INTO {self._keyspace}.rows (id, body) VALUES (?, ?)"  # noqa: S608
        )
        insert.consistency_level = ConsistencyLevel.QUORUM
        body = os.urandom(1024)
        interval = 1.0 / self._rate
        next_at = time.monotonic()
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self._session.execute(insert, (uuid.uuid4(), body))
            except Exception as exc:  # every failure counts; the type says which
                self.report.errors.append(f"{type(exc).__name__}: {exc}")
            self.report.latencies.append(time.monotonic() - started)
            self.report.writes += 1
            next_at += interval
            delay = next_at - time.monotonic()
            if delay > 0:
                self._stop.wait(delay)
            else:
                next_at = time.monotonic()

    def __enter__(self) -> WriteLoad:
        self.prepare()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
