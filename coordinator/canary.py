"""Canary rows: the proof that a restore brought each node's data back, to the right moment.

One row per (backup, node) is written at CL=ALL before the quiesce, in a partition that the node
itself owns: the keyspace has one replica per datacenter and each canary's partition key is chosen
from the node's own token ranges. After a restore, a node's canaries for the restored backup must be
present, and the "pre-restore" canaries written just before the restore must be absent.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from cassandra import ConsistencyLevel
from cassandra.concurrent import execute_concurrent_with_args
from cassandra.metadata import Murmur3Token
from cassandra.query import SimpleStatement

from ringsnap import names
from ringsnap.errors import RingsnapError

#: A node owns about 1/N of the ring, so a key is found in ~N tries; this bound is never reached
#: on a healthy ring and turns a broken token map into an error instead of a hang.
_MAX_KEY_TRIES = 100_000
#: Schema changes wait for every node to agree; on a busy cluster that takes more than a query.
_SCHEMA_TIMEOUT = 60.0


class CanaryKind(enum.StrEnum):
    BACKUP = "backup"
    PRE_RESTORE = "pre-restore"


@dataclass(frozen=True)
class Canary:
    key: str
    backup_id: str
    host_id: UUID
    kind: CanaryKind
    written_at: datetime


class CanaryError(RingsnapError):
    """Canaries could not be written or read; the message names the node."""


class CanaryStore:
    """Writes and checks canary rows through a connected cassandra-driver session."""

    def __init__(self, session: Any, keyspace: str = "ringsnap") -> None:
        self._session = session
        self.keyspace = names.keyspace_name(keyspace)

    def ensure_schema(self, datacenters: Iterable[str]) -> None:
        """Create the keyspace (one replica per datacenter) and the table, if missing."""
        replication = ", ".join(
            f"'{names.keyspace_name(dc)}': 1" for dc in sorted(set(datacenters))
        )
        self._session.execute(
            f"CREATE KEYSPACE IF NOT EXISTS {self.keyspace} WITH replication = "
            f"{{'class': 'NetworkTopologyStrategy', {replication}}}",
            timeout=_SCHEMA_TIMEOUT,
        )
        self._session.execute(
            f"CREATE TABLE IF NOT EXISTS {self.keyspace}.canary ("
            " canary_key text PRIMARY KEY, backup_id text, host_id uuid, kind text,"
            " written_at timestamp)",
            timeout=_SCHEMA_TIMEOUT,
        )
        cluster = self._session.cluster
        cluster.control_connection.wait_for_schema_agreement()
        cluster.refresh_keyspace_metadata(self.keyspace)

    def _host(self, host_id: UUID) -> Any:
        for host in self._session.cluster.metadata.all_hosts():
            if host.host_id == host_id:
                return host
        raise CanaryError(f"node with host id {host_id} is not in the driver's view of the ring")

    def key_owned_by(self, host_id: UUID, backup_id: str, kind: CanaryKind) -> str:
        """A partition key whose only replica in the node's datacenter is the node itself."""
        host = self._host(host_id)
        token_map = self._session.cluster.metadata.token_map
        for attempt in range(_MAX_KEY_TRIES):
            key = f"{kind.value}:{backup_id}:{host_id}:{attempt}"
            replicas = token_map.get_replicas(self.keyspace, Murmur3Token.from_key(key.encode()))
            if host in replicas:
                return key
        raise CanaryError(
            f"no partition owned by node {host_id} found; is keyspace {self.keyspace} replicated"
            " to its datacenter?"
        )

    def write(self, backup_id: str, host_ids: Sequence[UUID], kind: CanaryKind) -> list[Canary]:
        """Write one canary per node at CL=ALL; all or nothing (raises naming the failed node)."""
        now = datetime.now(UTC).replace(microsecond=0)
        canaries = [
            Canary(self.key_owned_by(h, backup_id, kind), backup_id, h, kind, now) for h in host_ids
        ]
        insert = self._session.prepare(
            # The keyspace is validated as a CQL identifier in __init__; values are bound.
            f"INSERT INTO {self.keyspace}.canary (canary_key, backup_id, host_id, kind, written_at)"  # noqa: S608
            " VALUES (?, ?, ?, ?, ?)"
        )
        insert.consistency_level = ConsistencyLevel.ALL
        results = execute_concurrent_with_args(
            self._session,
            insert,
            [(c.key, c.backup_id, c.host_id, c.kind.value, c.written_at) for c in canaries],
            raise_on_first_error=False,
        )
        for canary, (ok, outcome) in zip(canaries, results, strict=True):
            if not ok:
                raise CanaryError(
                    f"canary for node {canary.host_id} not written at CL=ALL: {outcome}"
                )
        return canaries

    def is_present(self, canary: Canary) -> bool:
        """Read the canary from the node that owns it (LOCAL_ONE, sent to that node)."""
        statement = SimpleStatement(
            f"SELECT backup_id FROM {self.keyspace}.canary WHERE canary_key = %s",  # noqa: S608
            consistency_level=ConsistencyLevel.LOCAL_ONE,
        )
        rows = self._session.execute(statement, (canary.key,), host=self._host(canary.host_id))
        return rows.one() is not None


class CqlCanaries:
    """`CanaryWriter` for the backup workflow: schema once, then one canary per node per backup."""

    def __init__(self, store: CanaryStore, datacenters: Iterable[str]) -> None:
        self._store = store
        self._datacenters = tuple(datacenters)
        self._schema_ready = False

    async def write_canaries(self, backup_id: str, host_ids: Sequence[str]) -> dict[str, str]:
        def write() -> dict[str, str]:
            if not self._schema_ready:
                self._store.ensure_schema(self._datacenters)
                self._schema_ready = True
            canaries = self._store.write(backup_id, [UUID(h) for h in host_ids], CanaryKind.BACKUP)
            return {str(c.host_id): c.key for c in canaries}

        return await asyncio.to_thread(write)
