"""`TableCqlPort` over cassandra-driver: the ring's health, a table's state, schema statements and
row counts; every call off the event loop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from ringsnap.coordinator.config import ClusterSection
from ringsnap.coordinator.ring import open_session
from ringsnap.coordinator.table_restore.ports import TableState
from ringsnap.errors import RingsnapError
from ringsnap.logs import get_logger
from ringsnap.names import keyspace_name, table_name
from ringsnap.token_ranges import count_rows, own_ranges

log = get_logger(__name__)
_SCHEMA_TIMEOUT = 120.0
_COUNT_TIMEOUT = 600.0


class SchemaError(RingsnapError):
    """A schema statement failed or the nodes did not agree on the schema after it."""


#: A node's connection pool that is being re-opened (the driver marked it down for a moment, e.g.
#: after a burst of load) is given this many tries, this far apart, before the node counts as down.
_TRIES = 4
_PAUSE_SECONDS = 2.0


def _with_retries(read: Callable[[], Any]) -> Any:
    for attempt in range(_TRIES):
        try:
            return read().one()
        except Exception:
            if attempt == _TRIES - 1:
                raise
            time.sleep(_PAUSE_SECONDS)
    raise AssertionError("unreachable")


class CqlTables:
    def __init__(self, config: ClusterSection) -> None:
        self._config = config
        self._session: Any = None

    def _open(self) -> Any:
        if self._session is None:
            self._session = open_session(self._config)
        return self._session

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await asyncio.to_thread(session.cluster.shutdown)

    async def health(self, host_ids: Sequence[str]) -> list[str]:
        return await asyncio.to_thread(self._health, list(host_ids))

    def _health(self, host_ids: list[str]) -> list[str]:
        from cassandra import ConsistencyLevel
        from cassandra.query import SimpleStatement

        session = self._open()
        cluster = session.cluster
        problems: list[str] = []
        local = SimpleStatement(
            "SELECT bootstrapped FROM system.local", consistency_level=ConsistencyLevel.ONE
        )
        hosts = {str(h.host_id): h for h in cluster.metadata.all_hosts()}
        for _ in range(_TRIES - 1):  # the driver re-opens a pool it dropped for a moment
            if all(host.is_up for host in hosts.values()):
                break
            time.sleep(_PAUSE_SECONDS)
        for host_id, host in sorted(hosts.items()):
            if not host.is_up:
                problems.append(f"node {host.address} ({host_id}) is down")
        for host_id in host_ids:
            host = hosts.get(host_id)
            if host is None:
                problems.append(f"node with host id {host_id} is not in the ring")
                continue
            if not host.is_up:
                continue
            try:
                row = _with_retries(partial(session.execute, local, host=host, timeout=10))
            except Exception as exc:  # a node that cannot answer is a reason to refuse
                problems.append(f"node {host.address} ({host_id}) did not answer a read: {exc}")
                continue
            if row is None or row.bootstrapped != "COMPLETED":
                problems.append(f"node {host.address} ({host_id}) is not Normal (bootstrapping)")
        if not cluster.control_connection.wait_for_schema_agreement(wait_time=15):
            problems.append("the nodes do not agree on the schema (nodetool describecluster)")
        return problems

    async def table_state(self, keyspace: str, table: str) -> TableState:
        def read() -> TableState:
            session = self._open()
            ks = session.execute(
                "SELECT keyspace_name FROM system_schema.keyspaces WHERE keyspace_name = %s",
                (keyspace_name(keyspace),),
            ).one()
            row = session.execute(
                "SELECT id FROM system_schema.tables WHERE keyspace_name = %s AND table_name = %s",
                (keyspace, table_name(table)),
            ).one()
            views = session.execute(
                "SELECT view_name, base_table_name FROM system_schema.views"
                " WHERE keyspace_name = %s",
                (keyspace,),
            )
            return TableState(
                keyspace_exists=ks is not None,
                exists=row is not None,
                table_id=str(row.id) if row is not None else "",
                views=tuple(sorted(v.view_name for v in views if v.base_table_name == table)),
            )

        return await asyncio.to_thread(read)

    async def execute_schema(self, statement: str) -> None:
        def run() -> None:
            session = self._open()
            try:
                session.execute(statement, timeout=_SCHEMA_TIMEOUT)
            except Exception as exc:
                raise SchemaError(f"{statement.splitlines()[0]} ...: {exc}") from None
            if not session.cluster.control_connection.wait_for_schema_agreement(wait_time=60):
                raise SchemaError(
                    f"the nodes did not agree on the schema within 60 s after: {statement[:200]}"
                )
            log.info("schema statement run", statement=statement[:300])

        await asyncio.to_thread(run)

    async def count_rows(self, keyspace: str, table: str, host_id: str) -> int:
        def count() -> int:
            from cassandra import ConsistencyLevel
            from cassandra.query import SimpleStatement

            session = self._open()
            host = next(
                (h for h in session.cluster.metadata.all_hosts() if str(h.host_id) == host_id),
                None,
            )
            statement = SimpleStatement(
                # Names validated as CQL identifiers.
                f"SELECT COUNT(*) FROM {keyspace_name(keyspace)}.{table_name(table)}",  # noqa: S608
                consistency_level=ConsistencyLevel.ALL,
                # Cassandra pages an aggregate internally by the fetch size: small pages, each
                # well within the server's range read timeout.
                fetch_size=1000,
            )
            row = session.execute(statement, host=host, timeout=_COUNT_TIMEOUT).one()
            return int(row[0])

        return await asyncio.to_thread(count)

    async def count_primary_rows(self, keyspace: str, table: str, host_id: str) -> int:
        def count() -> int:
            from cassandra import ConsistencyLevel

            session = self._open()
            metadata = session.cluster.metadata
            owners = metadata.token_map.token_to_host_owner if metadata.token_map else {}
            ring = [int(token.value) for token in owners]
            own = [int(t.value) for t, host in owners.items() if str(host.host_id) == host_id]
            if not own:
                raise RingsnapError(f"the node with host id {host_id} owns no token in the ring")
            found = metadata.keyspaces.get(keyspace_name(keyspace))
            columns = found.tables.get(table_name(table)) if found is not None else None
            if columns is None:
                raise RingsnapError(f"{keyspace}.{table} is not in the driver's schema metadata")
            return count_rows(
                session,
                keyspace,
                table,
                [column.name for column in columns.partition_key],
                own_ranges(own, ring),
                consistency=ConsistencyLevel.ALL,
                timeout=_COUNT_TIMEOUT,
            )

        return await asyncio.to_thread(count)
