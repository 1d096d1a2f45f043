"""An export as one process runs it: the config and the catalog turned into the workflow's ports,
and the catalog mirror written with the coordinator's own `[s3]` settings."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from ringsnap.agent.s3.client import make_client
from ringsnap.agent.s3.crypto.configured import configured_recipients
from ringsnap.agent.s3.layout import Layout
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.coordinator.agents.connection import ClientTls
from ringsnap.coordinator.agents.export import GrpcExportNode
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.catalog.journal import CatalogResources
from ringsnap.coordinator.cluster_clients import client_tls, open_cluster
from ringsnap.coordinator.config import ClusterSection, CoordinatorConfig
from ringsnap.coordinator.export.mirror import write_mirror
from ringsnap.coordinator.export.model import ExportRecord, ExportRefused
from ringsnap.coordinator.export.plan import plan_export
from ringsnap.coordinator.export.ports import ExportNodePort
from ringsnap.coordinator.export.workflow import DEFAULT_PARALLEL_NODES, ExportWorkflow, Progress
from ringsnap.coordinator.ports import ArrayPort
from ringsnap.coordinator.presentation import Presenter, RunOf, cluster_hosts


class CatalogExportJournal(CatalogResources):
    """`ExportJournal` over the catalog (every call off the event loop)."""

    async def save(self, record: ExportRecord) -> None:
        await asyncio.to_thread(self.catalog.save_export, record)


def destination(settings: S3Settings | None) -> str:
    return f"s3://{settings.bucket}/{settings.prefix}" if settings is not None else ""


@dataclass
class ExportSession:
    config: CoordinatorConfig
    catalog: Catalog
    cluster: ClusterSection
    nodes: dict[str, ExportNodePort]
    arrays: dict[str, ArrayPort]

    async def mirror(self, record: ExportRecord) -> None:
        settings = self.config.s3
        if settings is None:
            raise ExportRefused(
                "the coordinator's configuration has no [s3] section: the catalog record is not"
                " mirrored (a new coordinator could not rebuild it from the bucket)"
            )

        def write() -> None:
            write_mirror(
                make_client(settings),
                settings.bucket,
                Layout(settings.prefix),
                self.catalog,
                record,
                # The nodes' public recipients: the coordinator can seal a mirror, not open one.
                recipients=configured_recipients(settings.encryption)
                if settings.encryption
                else (),
            )

        await asyncio.to_thread(write)

    async def export(
        self,
        backup_id: str,
        nodes: Sequence[str] = (),
        *,
        progress: Progress | None = None,
        parallel_nodes: int = DEFAULT_PARALLEL_NODES,
    ) -> ExportRecord:
        backup = await asyncio.to_thread(self.catalog.get_backup, backup_id)
        if backup.cluster != self.cluster.name:
            raise ExportRefused(f"backup {backup.id} is of cluster {backup.cluster}")
        previous = await asyncio.to_thread(self.catalog.find_export, backup_id)
        record = plan_export(
            backup,
            nodes,
            previous,
            destination=destination(self.config.s3),
            configured=[n.name for n in self.cluster.nodes],
        )
        workflow = ExportWorkflow(
            backup,
            self.nodes,
            self.arrays,
            CatalogExportJournal(self.catalog),
            parallel_nodes=parallel_nodes,
            progress=progress,
            mirror=self.mirror,
            presenter=Presenter(
                self.arrays,
                self.catalog,
                RunOf(backup.cluster, backup.id, "export"),
                cluster_hosts(self.cluster, self.nodes),
            ),
        )
        return await workflow.run(record, nodes)


def export_node_opener(config: CoordinatorConfig) -> Callable[[str, str], GrpcExportNode | None]:
    """The agent of a configured node (by cluster and node name), for the pending cleanups of the
    clones it mounted; None for a node the configuration does not have."""
    tls: list[ClientTls] = []

    def open_node(cluster_name: str, node_name: str) -> GrpcExportNode | None:
        cluster = next((c for c in config.clusters if c.name == cluster_name), None)
        nodes = cluster.nodes if cluster is not None else []
        node = next((n for n in nodes if n.name == node_name), None)
        if node is None:
            return None
        if not tls:
            tls.append(client_tls(config))
        return GrpcExportNode(node.name, node.agent, tls[0])

    return open_node


@contextlib.asynccontextmanager
async def open_export_session(
    config: CoordinatorConfig, cluster_name: str, *, catalog: Catalog
) -> AsyncIterator[ExportSession]:
    async with open_cluster(config, cluster_name) as clients:
        nodes = clients.per_node(GrpcExportNode)
        yield ExportSession(config, catalog, clients.cluster, dict(nodes), clients.arrays)
