"""What every session of one cluster (a restore, a table restore, a drill, an export) opens from
the config, and closes at its end: the client certificate for the agents and the cluster's arrays."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Protocol, TypeVar

from ringsnap.coordinator.agents.connection import ClientTls
from ringsnap.coordinator.agents.node_snapshots import DRIVER as NODE_LOCAL_DRIVER
from ringsnap.coordinator.agents.node_snapshots import NodeSnapshotPort
from ringsnap.coordinator.config import ClusterSection, CoordinatorConfig
from ringsnap.coordinator.ports import ArrayPort
from ringsnap.errors import ConfigError
from ringsnap.plugins.middleware import AsyncDriver
from ringsnap.plugins.registry import open_driver


class Closable(Protocol):
    async def close(self) -> None: ...


C = TypeVar("C", bound=Closable)


def client_tls(config: CoordinatorConfig) -> ClientTls:
    """The coordinator's client certificate and key, and the CA of the agents' certificates."""
    return ClientTls(
        cert=Path(config.tls.cert_file).read_bytes(),
        key=config.tls.key_file.get_secret_value().encode(),
        ca=Path(config.tls.ca_file).read_bytes(),
        server_name=config.tls.agent_server_name or "",
    )


def node_local_agent(config: CoordinatorConfig, name: str, source: str) -> tuple[str, str]:
    """(node, agent address) of `[arrays.<name>] driver = "agent-lvm"`: the node's own agent
    takes its snapshots. A missing or unknown `node` is a ConfigError naming the key."""
    table = config.arrays[name].table()
    key = f"arrays.{name}"
    strangers = sorted(set(table) - {"driver", "node"})
    if strangers:
        raise ConfigError(
            source,
            f"{key}.{strangers[0]}",
            f"not a setting of driver {NODE_LOCAL_DRIVER!r} (only node)",
        )
    node = table.get("node")
    if not isinstance(node, str) or not node:
        raise ConfigError(
            source, f"{key}.node", "name the node whose agent snapshots its own volumes"
        )
    for cluster in config.clusters:
        for member in cluster.nodes:
            if member.name == node:
                return node, member.agent
    raise ConfigError(source, f"{key}.node", f"{node!r} is no node of any [[clusters]]")


def open_array(config: CoordinatorConfig, name: str, source: str, tls: ClientTls) -> ArrayPort:
    """The port of `[arrays.<name>]`: its driver behind the middleware, or for node-local
    snapshots (`agent-lvm`) the node's agent (contacts nothing yet)."""
    section = config.arrays[name]
    if section.driver == NODE_LOCAL_DRIVER:
        node, address = node_local_agent(config, name, source)
        return NodeSnapshotPort(name, node, address, tls)
    return AsyncDriver(open_driver(name, section.table(), source))


def cluster_arrays(config: CoordinatorConfig, cluster: ClusterSection) -> dict[str, ArrayPort]:
    """A port for each configured array the cluster's volumes are on (contacts none yet)."""
    used = {v.array for node in cluster.nodes for v in node.volumes}
    tls = client_tls(config)
    return {
        name: open_array(config, name, "<config>", tls)
        for name in sorted(used)
        if name in config.arrays
    }


async def close_all(*groups: Iterable[Closable]) -> None:
    """Close every client of `groups`, in order."""
    for group in groups:
        for client in group:
            await client.close()


class ClusterClients:
    """The clients a session of one cluster opened (`open_cluster`), closed together at its end."""

    def __init__(self, config: CoordinatorConfig, cluster: ClusterSection) -> None:
        self.cluster = cluster
        self.tls = client_tls(config)
        self.arrays = cluster_arrays(config, cluster)
        self._opened: list[Iterable[Closable]] = [self.arrays.values()]

    def per_node(self, client: Callable[[str, str, ClientTls], C]) -> dict[str, C]:
        """A client of each node's agent: `client(node, address, tls)`."""
        made = {n.name: client(n.name, n.agent, self.tls) for n in self.cluster.nodes}
        self._opened.append(made.values())
        return made

    def kept(self, client: C) -> C:
        """`client`, closed with the others."""
        self._opened.append([client])
        return client

    async def close(self) -> None:
        """Close every client, the last opened first."""
        await close_all(*reversed(self._opened))


@contextlib.asynccontextmanager
async def open_cluster(
    config: CoordinatorConfig, cluster_name: str
) -> AsyncIterator[ClusterClients]:
    """The clients of a session of `cluster_name`, closed when it ends."""
    clients = ClusterClients(config, config.cluster(cluster_name))
    try:
        yield clients
    finally:
        await clients.close()
