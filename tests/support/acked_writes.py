"""Writes acknowledged at QUORUM while something else runs on the sandbox ring: the ground truth of
what a backup holds (acknowledged before it) and must not hold (begun after it)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from cassandra import ConsistencyLevel
from cassandra.cluster import NoHostAvailable
from cassandra.query import SimpleStatement

from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.model import Backup
from ringsnap.sandbox.cluster import SandboxCluster
from tests.support.ring_runs import complete_backup, create_keyspace

#: The table `backup_under_writes` writes and `ids_at_all` reads.
KEYSPACE = "restore_test"


class AckedWriter:
    """Runs `insert` (id, payload) at QUORUM from a thread, ids counting up, and keeps for each id
    when its write began and when it was acknowledged."""

    def __init__(self, session: Any, insert: str, payload: str, *, pause: float) -> None:
        self.session = session
        self.started: dict[int, float] = {}
        self.acked_at: dict[int, float] = {}
        self._payload = payload
        self._pause = pause
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._insert = session.prepare(insert)
        self._insert.consistency_level = ConsistencyLevel.QUORUM

    @property
    def acked(self) -> set[int]:
        return set(self.acked_at)

    def _run(self) -> None:
        next_id = 0
        while not self._stop.is_set():
            self.started[next_id] = time.monotonic()
            try:
                self.session.execute(self._insert, (next_id, self._payload), timeout=10)
                self.acked_at[next_id] = time.monotonic()
            except Exception:
                pass
            next_id += 1
            time.sleep(self._pause)

    def __enter__(self) -> AckedWriter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


def backup_under_writes(
    cluster: SandboxCluster,
    config: CoordinatorConfig,
    take: Callable[[CoordinatorConfig], Backup] = complete_backup,
) -> tuple[Backup, set[int], set[int]]:
    """Backup under load, then more writes: (backup, acked before it, begun after it). `take`
    takes the backup (default: `complete_backup` in this process)."""
    cluster.session()
    cluster.wait_for_session()  # an earlier test may have restarted nodes under this session
    session = cluster.session()  # after the wait: it may have replaced a stale session
    create_keyspace(session, KEYSPACE)
    session.execute(f"DROP TABLE IF EXISTS {KEYSPACE}.rows")
    session.execute(f"CREATE TABLE {KEYSPACE}.rows (id int PRIMARY KEY, payload text)")
    insert = f"INSERT INTO {KEYSPACE}.rows (id, payload) VALUES (?, ?)"
    with AckedWriter(session, insert, "x" * 200, pause=0.01) as writer:
        time.sleep(2)
        before = time.monotonic()
        backup = take(config)
        after = time.monotonic()
        time.sleep(2)
    acked_before = {i for i, t in writer.acked_at.items() if t < before}
    begun_after = {i for i, t in writer.started.items() if t > after and i in writer.acked_at}
    assert acked_before and begun_after
    return backup, acked_before, begun_after


def ids_at_all(cluster: SandboxCluster) -> set[int]:
    """The ids `backup_under_writes` wrote that the ring holds, read at CL=ALL."""
    statement = SimpleStatement(
        f"SELECT id FROM {KEYSPACE}.rows", consistency_level=ConsistencyLevel.ALL, fetch_size=5000
    )
    for attempt in (1, 2):
        cluster.session()
        cluster.wait_for_session()  # a restore restarted the ring: the session reconnects first
        session = cluster.session()  # after the wait: it may have replaced a stale session
        try:
            return {row.id for row in session.execute(statement, timeout=60)}
        except NoHostAvailable:
            # The driver's own state, not the ring's: the next wait mends or replaces the session.
            if attempt == 2:
                raise
    raise AssertionError("unreachable")
