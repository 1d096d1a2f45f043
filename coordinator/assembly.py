"""Builds a running `Coordinator` from its configuration: catalog, drivers, agents, canaries.

The one place that turns settings into live handles, so that the daemon and the tests assemble the
coordinator the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from ringsnap.config import load
from ringsnap.coordinator.agents.connection import ClientTls, GrpcNodeAgent
from ringsnap.coordinator.backup.schema import SchemaRow
from ringsnap.coordinator.backup.schema_capture import describe_keyspaces
from ringsnap.coordinator.canary import CanaryStore, CqlCanaries
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.cluster_clients import open_array
from ringsnap.coordinator.config import ClusterSection, CoordinatorConfig
from ringsnap.coordinator.metrics import CoordinatorMetrics
from ringsnap.coordinator.pitr.window import PitrCollector, pitr_clusters
from ringsnap.coordinator.ports import AgentPort, ArrayPort
from ringsnap.coordinator.service import ClusterRuntime, Coordinator
from ringsnap.logs import get_logger

log = get_logger(__name__)


class LazyCqlCanaries:
    """Connects to the cluster on first use (off the event loop), so a coordinator starts even
    while a cluster is down; a backup of that cluster then fails at its canary step, saying why."""

    def __init__(self, cluster: ClusterSection) -> None:
        self._config = cluster
        self._canaries: CqlCanaries | None = None
        self._session: Any = None

    def _connect(self) -> CqlCanaries:
        from cassandra.auth import PlainTextAuthProvider
        from cassandra.cluster import Cluster
        from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy

        auth = None
        if self._config.cql_username and self._config.cql_password_file:
            auth = PlainTextAuthProvider(
                self._config.cql_username, self._config.cql_password_file.get_secret_value()
            )
        policy = TokenAwarePolicy(DCAwareRoundRobinPolicy(local_dc=self._config.local_datacenter))
        cluster = Cluster(
            contact_points=list(self._config.contact_points),
            port=self._config.cql_port,
            auth_provider=auth,
            load_balancing_policy=policy,
            protocol_version=5,
            connect_timeout=30,
            control_connection_timeout=30,
            idle_heartbeat_timeout=60,
        )
        self._session = cluster.connect()
        self._session.default_timeout = 30.0
        datacenters = {h.datacenter for h in cluster.metadata.all_hosts() if h.datacenter}
        store = CanaryStore(self._session, self._config.canary_keyspace)
        return CqlCanaries(store, datacenters)

    async def write_canaries(self, backup_id: str, host_ids: Sequence[str]) -> dict[str, str]:
        if self._canaries is None:
            self._canaries = await asyncio.to_thread(self._connect)
        return await self._canaries.write_canaries(backup_id, host_ids)

    async def describe_keyspaces(self) -> dict[str, list[SchemaRow]]:
        """Every user keyspace's schema for the backup's catalog record (a `KeyspaceSchemaReader`),
        through the canaries' session, opened by then."""
        if self._canaries is None:
            self._canaries = await asyncio.to_thread(self._connect)
        return await asyncio.to_thread(describe_keyspaces, self._session)

    def close(self) -> None:
        if self._session is not None:
            self._session.cluster.shutdown()


@contextlib.asynccontextmanager
async def open_coordinator(
    config: CoordinatorConfig, *, source: str, start: bool = True, catalog: Catalog | None = None
) -> AsyncIterator[Coordinator]:
    """A started coordinator for `config`; everything it opened is closed on exit. `catalog`: one
    the caller opened (exclusively) and hands over; it is closed on exit too. `start=False`: no
    recovery, schedules or cleanup rounds (a coordinator the CLI hosts for one command)."""
    tls = ClientTls(
        cert=Path(config.tls.cert_file).read_bytes(),
        key=config.tls.key_file.get_secret_value().encode(),
        ca=Path(config.tls.ca_file).read_bytes(),
        server_name=config.tls.agent_server_name or "",
    )
    arrays: dict[str, ArrayPort] = {
        name: open_array(config, name, source, tls) for name in config.arrays
    }
    agents: list[GrpcNodeAgent] = []
    canaries: list[LazyCqlCanaries] = []
    clusters: dict[str, ClusterRuntime] = {}
    for cluster in config.clusters:
        cluster_agents: dict[str, AgentPort] = {}
        for node in cluster.nodes:
            agent = GrpcNodeAgent(node.name, node.agent, tls)
            agents.append(agent)
            cluster_agents[node.name] = agent
        writer = LazyCqlCanaries(cluster)
        canaries.append(writer)
        clusters[cluster.name] = ClusterRuntime(cluster, cluster_agents, writer)
    if catalog is None:
        catalog = await asyncio.to_thread(Catalog, config.coordinator.catalog)
    metrics = CoordinatorMetrics(clusters)
    if config.s3 is not None:
        # Each node's recovery-point lag, read from the bucket when scraped (docs/pitr.md).
        metrics.registry.register(PitrCollector(config.s3, pitr_clusters(config)))
    coordinator = Coordinator(config, catalog, metrics, arrays, clusters)
    try:
        if start:
            await coordinator.start()
        yield coordinator
    finally:
        await coordinator.stop()
        for agent in agents:
            await agent.close()
        for writer in canaries:
            await asyncio.to_thread(writer.close)
        for array in arrays.values():
            await array.close()
        await asyncio.to_thread(catalog.close)


def load_config(path: str | Path) -> CoordinatorConfig:
    return load(path, CoordinatorConfig)
