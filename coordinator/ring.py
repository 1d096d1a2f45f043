"""The restore's view of the ring through CQL: canaries, Up/Normal, schema agreement, gc_grace.

A ring restarted by a restore drops every driver connection, and the driver's reconnection backs
off for minutes; so `reconnect()` drops the session and the next call opens a new one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from ringsnap.coordinator.canary import Canary, CanaryKind, CanaryStore
from ringsnap.coordinator.config import ClusterSection
from ringsnap.errors import RingsnapError
from ringsnap.logs import get_logger

log = get_logger(__name__)

#: Cassandra's own keyspaces: their schema comes with Cassandra, and their gc_grace does not guard
#: user deletes.
SYSTEM_KEYSPACES = frozenset(
    {
        "system",
        "system_schema",
        "system_auth",
        "system_distributed",
        "system_traces",
        "system_views",
        "system_virtual_schema",
    }
)
_POLL = 2.0


class RingError(RingsnapError):
    """The ring did not answer as a restore needs; the message names the node."""


def open_session(config: ClusterSection) -> Any:
    """A cassandra-driver session on the cluster's contact points (token aware, DC aware)."""
    from cassandra.auth import PlainTextAuthProvider
    from cassandra.cluster import Cluster
    from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy

    auth = None
    if config.cql_username and config.cql_password_file:
        auth = PlainTextAuthProvider(
            config.cql_username, config.cql_password_file.get_secret_value()
        )
    cluster = Cluster(
        contact_points=list(config.contact_points),
        port=config.cql_port,
        auth_provider=auth,
        load_balancing_policy=TokenAwarePolicy(
            DCAwareRoundRobinPolicy(local_dc=config.local_datacenter)
        ),
        protocol_version=5,
        connect_timeout=30,
        control_connection_timeout=30,
        idle_heartbeat_timeout=60,
    )
    session = cluster.connect()
    session.default_timeout = 30.0
    return session


class CqlRing:
    """`RingPort` over cassandra-driver; every call runs off the event loop."""

    def __init__(self, config: ClusterSection) -> None:
        self._config = config
        self._session: Any = None

    def _store(self) -> CanaryStore:
        if self._session is None:
            self._session = open_session(self._config)
        return CanaryStore(self._session, self._config.canary_keyspace)

    async def write_pre_restore_canaries(
        self, restore_id: str, host_ids: Sequence[str]
    ) -> dict[str, str]:
        def write() -> dict[str, str]:
            canaries = self._store().write(
                restore_id, [UUID(h) for h in host_ids], CanaryKind.PRE_RESTORE
            )
            return {str(c.host_id): c.key for c in canaries}

        return await asyncio.to_thread(write)

    async def canary_present(self, key: str, host_id: str) -> bool:
        canary = Canary(key, "", UUID(host_id), CanaryKind.BACKUP, datetime.now(UTC))
        return await asyncio.to_thread(lambda: self._store().is_present(canary))

    async def min_gc_grace(self) -> tuple[int, str]:
        """The smallest gc_grace_seconds of the user tables, with the table that has it."""

        def read() -> tuple[int, str]:
            self._store()
            rows = self._session.execute(
                "SELECT keyspace_name, table_name, gc_grace_seconds FROM system_schema.tables"
            )
            user = [
                (int(r.gc_grace_seconds), f"{r.keyspace_name}.{r.table_name}")
                for r in rows
                if r.keyspace_name not in SYSTEM_KEYSPACES
                and r.keyspace_name != self._config.canary_keyspace
            ]
            return min(user) if user else (0, "")

        return await asyncio.to_thread(read)

    async def wait_for_ring(self, host_ids: Sequence[str], timeout: float) -> None:
        """Until every node answers CQL itself, the driver sees it up, and schemas agree."""
        await asyncio.to_thread(self._wait_for_ring, set(host_ids), timeout)

    def _wait_for_ring(self, wanted: set[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        while True:
            try:
                self._store()
                missing = self._not_serving(wanted)
                if not missing:
                    cluster = self._session.cluster
                    if cluster.control_connection.wait_for_schema_agreement(wait_time=30):
                        return
                    last = "the nodes do not agree on the schema yet"
                else:
                    last = f"not serving yet: {', '.join(sorted(missing))}"
            except Exception as exc:
                last = f"{type(exc).__name__}: {str(exc)[:300]}"
                self.reconnect()
            if time.monotonic() >= deadline:
                raise RingError(f"the ring is not Up/Normal after {timeout:.0f} s: {last}")
            time.sleep(_POLL)

    def _not_serving(self, wanted: set[str]) -> set[str]:
        from cassandra import ConsistencyLevel
        from cassandra.query import SimpleStatement

        hosts = {str(h.host_id): h for h in self._session.cluster.metadata.all_hosts()}
        missing = set()
        for host_id in wanted:
            host = hosts.get(host_id)
            if host is None or not host.is_up:
                missing.add(host_id)
                continue
            statement = SimpleStatement(
                "SELECT host_id, bootstrapped FROM system.local",
                consistency_level=ConsistencyLevel.ONE,
            )
            row = self._session.execute(statement, host=host, timeout=10).one()
            if row is None or str(row.host_id) != host_id or row.bootstrapped != "COMPLETED":
                missing.add(host_id)
        return missing

    def reconnect(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            try:
                session.cluster.shutdown()
            except Exception as exc:
                log.info("closing the old CQL session failed", error=str(exc))

    async def close(self) -> None:
        await asyncio.to_thread(self.reconnect)
