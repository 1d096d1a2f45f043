"""Time canaries: the proof of a restore to a time. Every `interval` a row per node, in a partition
the node alone owns (as the backup canaries), stamped with the time it was written (`USING
TIMESTAMP`, so replay's `restore_point_in_time` judges it exactly as a client's write). After a
restore to T, a node is at T when its newest canary is at or before T and within two intervals
of it, and no canary after T is there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from cassandra import ConsistencyLevel
from cassandra.metadata import Murmur3Token
from cassandra.query import SimpleStatement

from ringsnap import names
from ringsnap.coordinator.canary import CanaryError
from ringsnap.logs import get_logger

log = get_logger(__name__)

_MAX_KEY_TRIES = 100_000


@dataclass(frozen=True)
class TimeProof:
    proven: bool
    line: str


class TimeCanaries:
    def __init__(self, session: Any, keyspace: str = "ringsnap") -> None:
        self._session = session
        self.keyspace = names.keyspace_name(keyspace)
        self._keys: dict[UUID, str] = {}

    def ensure_schema(self) -> None:
        """The table, in the canary keyspace (made by the backup canaries' schema)."""
        self._session.execute(
            f"CREATE TABLE IF NOT EXISTS {self.keyspace}.time_canary ("
            " canary_key text, at_ms bigint, PRIMARY KEY (canary_key, at_ms))",
            timeout=60,
        )
        self._session.cluster.control_connection.wait_for_schema_agreement()
        self._session.cluster.refresh_keyspace_metadata(self.keyspace)

    def key_for(self, host_id: UUID) -> str:
        if host_id in self._keys:
            return self._keys[host_id]
        metadata = self._session.cluster.metadata
        host = next((h for h in metadata.all_hosts() if h.host_id == host_id), None)
        if host is None:
            raise CanaryError(f"node with host id {host_id} is not in the driver's view")
        for attempt in range(_MAX_KEY_TRIES):
            key = f"time:{host_id}:{attempt}"
            token = Murmur3Token.from_key(key.encode())
            if metadata.token_map.get_replicas(self.keyspace, token) == [host]:
                self._keys[host_id] = key
                return key
        raise CanaryError(f"no partition owned by node {host_id} alone in {self.keyspace}")

    def tick(self, host_ids: Sequence[UUID], now_ms: int) -> int:
        """One canary per node at `now_ms`; returns how many were acknowledged."""
        acked = 0
        for host_id in host_ids:
            statement = SimpleStatement(
                f"INSERT INTO {self.keyspace}.time_canary (canary_key, at_ms) VALUES (%s, %s)"  # noqa: S608
                f" USING TIMESTAMP {int(now_ms) * 1000}",
                consistency_level=ConsistencyLevel.ONE,
            )
            try:
                self._session.execute(statement, (self.key_for(host_id), now_ms), timeout=2)
                acked += 1
            except Exception as exc:
                log.warning("time canary not written", host_id=str(host_id), error=str(exc))
        return acked

    def prove(self, host_id: UUID, target_ms: int, interval_ms: int) -> TimeProof:
        statement = SimpleStatement(
            f"SELECT at_ms FROM {self.keyspace}.time_canary WHERE canary_key = %s",  # noqa: S608
            consistency_level=ConsistencyLevel.ONE,
        )
        rows = [r.at_ms for r in self._session.execute(statement, (self.key_for(host_id),))]
        after = [t for t in rows if t > target_ms]
        before = [t for t in rows if t <= target_ms]
        if after:
            return TimeProof(
                False, f"time canary at {min(after)} ms is after the point {target_ms} ms"
            )
        if not before or max(before) < target_ms - 2 * interval_ms:
            newest = max(before) if before else "none"
            return TimeProof(
                False,
                f"newest time canary at or before {target_ms} ms is {newest}: more than two"
                f" intervals ({2 * interval_ms} ms) before the point",
            )
        return TimeProof(
            True,
            f"time canary at {max(before)} ms present, none after the point {target_ms} ms",
        )
