"""The agents the ledger's retries unmount clones with, opened on first use by the daemon: the
drill host of each cluster (a drill's clones) and the agents of nodes that mount clones (exports,
table restores). The retry itself is `runs.ledger.LedgerRetry`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from ringsnap.coordinator.drill.ports import DrillHost


class CloneHolder(Protocol):
    """An agent that mounts clones: UnmountClones of a purpose (idempotent)."""

    async def unmount_clones(self, purpose_id: str) -> Sequence[str]: ...


class DrillHosts:
    """The drill hosts of every cluster of a config, opened on first use (for the cleanups)."""

    def __init__(self, open_hosts: Callable[[], Mapping[str, ClosableDrillHost]]) -> None:
        self._open = open_hosts
        self._hosts: Mapping[str, ClosableDrillHost] | None = None

    def get(self) -> Mapping[str, DrillHost]:
        if self._hosts is None:
            self._hosts = self._open()
        return self._hosts

    async def close(self) -> None:
        hosts, self._hosts = self._hosts, None
        for host in (hosts or {}).values():
            await host.close()


class ClosableDrillHost(DrillHost, Protocol):
    async def close(self) -> None: ...


class ClosableCloneHolder(CloneHolder, Protocol):
    async def close(self) -> None: ...


class NodeAgentCache:
    """The agents of the nodes that mounted clones, opened on first use (for the cleanups)."""

    def __init__(self, open_agent: Callable[[str, str], ClosableCloneHolder | None]) -> None:
        self._open = open_agent
        self._agents: dict[tuple[str, str], ClosableCloneHolder | None] = {}

    def get(self, cluster: str, node: str) -> CloneHolder | None:
        key = (cluster, node)
        if key not in self._agents:
            self._agents[key] = self._open(cluster, node)
        return self._agents[key]

    async def close(self) -> None:
        agents, self._agents = self._agents, {}
        for agent in agents.values():
            if agent is not None:
                await agent.close()
