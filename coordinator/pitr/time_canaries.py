"""The coordinator daemon's time canaries: for every cluster with `pitr = true`, a thread writes a
time canary per node every second (ringsnap.coordinator.pitr.time_canary), connecting again after any
failure, so that a restore to any moment of the window can be proven to within a second."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any
from uuid import UUID

from ringsnap.coordinator.canary import CanaryStore
from ringsnap.coordinator.config import ClusterSection, CoordinatorConfig
from ringsnap.coordinator.pitr.time_canary import TimeCanaries
from ringsnap.coordinator.ring import open_session
from ringsnap.logs import get_logger

log = get_logger(__name__)

#: After a failure (the ring down, a restore running), the next connection attempt.
RETRY_SECONDS = 5.0


class ClusterTimeCanaries:
    def __init__(self, cluster: ClusterSection, interval: float = 1.0) -> None:
        self.cluster = cluster
        self.interval = interval
        self.ticks = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"time-canaries-{cluster.name}", daemon=True
        )

    def start(self) -> ClusterTimeCanaries:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.is_set():
            session: Any = None
            try:
                session = open_session(self.cluster)
                self._write(session)
            except Exception as exc:
                log.warning(
                    "time canaries not written; retrying",
                    cluster=self.cluster.name,
                    error=str(exc)[:300],
                )
            finally:
                if session is not None:
                    session.cluster.shutdown()
            self._stop.wait(RETRY_SECONDS)

    def _write(self, session: Any) -> None:
        hosts = list(session.cluster.metadata.all_hosts())
        CanaryStore(session, self.cluster.canary_keyspace).ensure_schema(
            {h.datacenter for h in hosts if h.datacenter}
        )
        canaries = TimeCanaries(session, self.cluster.canary_keyspace)
        canaries.ensure_schema()
        host_ids = [UUID(str(h.host_id)) for h in hosts]
        failures = 0
        while not self._stop.is_set():
            started = time.time()
            acked = canaries.tick(host_ids, int(started * 1000))
            self.ticks += 1 if acked else 0
            failures = 0 if acked == len(host_ids) else failures + 1
            if failures >= 10:
                raise RuntimeError("no time canary acknowledged by every node for 10 ticks")
            self._stop.wait(max(0.0, self.interval - (time.time() - started)))


@contextlib.contextmanager
def running_time_canaries(config: CoordinatorConfig) -> Iterator[list[ClusterTimeCanaries]]:
    writers = [ClusterTimeCanaries(c).start() for c in config.clusters if c.pitr]
    try:
        yield writers
    finally:
        for writer in writers:
            writer.stop()
