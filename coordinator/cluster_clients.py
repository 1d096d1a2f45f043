"""What every session of one cluster (a restore, a table restore, a drill, an export) opens from
the config, and closes at its end: the client certificate for the agents and the cluster's arrays."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from ringsnap.coordinator.agents import ClientTls
from ringsnap.coordinator.config import ClusterSection, CoordinatorConfig
from ringsnap.coordinator.ports import ArrayPort
from ringsnap.plugins.middleware import AsyncDriver
from ringsnap.plugins.registry import open_driver


class Closable(Protocol):
    async def close(self) -> None: ...


def client_tls(config: CoordinatorConfig) -> ClientTls:
    """The coordinator's client certificate and key, and the CA of the agents' certificates."""
    return ClientTls(
        cert=Path(config.tls.cert_file).read_bytes(),
        key=config.tls.key_file.get_secret_value().encode(),
        ca=Path(config.tls.ca_file).read_bytes(),
        server_name=config.tls.agent_server_name or "",
    )


def cluster_arrays(config: CoordinatorConfig, cluster: ClusterSection) -> dict[str, ArrayPort]:
    """A driver for each configured array the cluster's volumes are on (contacts none yet)."""
    used = {v.array for node in cluster.nodes for v in node.volumes}
    return {
        name: AsyncDriver(open_driver(name, config.arrays[name].table(), "<config>"))
        for name in sorted(used)
        if name in config.arrays
    }


async def close_all(*groups: Iterable[Closable]) -> None:
    """Close every client of `groups`, in order."""
    for group in groups:
        for client in group:
            await client.close()
