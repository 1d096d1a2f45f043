"""How the agent talks to its Cassandra node: nodetool, or Jolokia when one is configured."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ringsnap.agent.config import CassandraSection
from ringsnap.agent.jolokia import Jolokia
from ringsnap.agent.nodetool import ClusterFacts, NodeIdentity, Nodetool


class CassandraControl(Protocol):
    async def info(self, *, timeout: float | None = None) -> NodeIdentity: ...

    async def facts(self) -> ClusterFacts: ...

    async def flush(self, keyspace: str = "", tables: Sequence[str] = ()) -> float: ...

    async def snapshot(self, tag: str, keyspaces: Sequence[str] = ()) -> float: ...

    async def clear_snapshot(self, tag: str) -> float: ...

    async def drain(self) -> float: ...

    async def aclose(self) -> None: ...


def open_control(cassandra: CassandraSection) -> CassandraControl:
    if cassandra.jolokia_url is not None:
        return Jolokia(
            cassandra.jolokia_url,
            timeout=cassandra.nodetool_timeout_seconds,
            user=cassandra.jolokia_user,
            password=cassandra.jolokia_password_file,
        )
    return Nodetool(cassandra.nodetool_argv(), timeout=cassandra.nodetool_timeout_seconds)
