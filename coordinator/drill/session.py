"""A drill as one process runs it: the config and the catalog turned into the workflow's ports.

`ringsnap drill` runs drills in its own process (so they work while the coordinator daemon is down),
as restores do; the daemon runs the same session for the API and for scheduled drills.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime

from ringsnap.coordinator.agents.connection import ClientTls
from ringsnap.coordinator.agents.drill import GrpcDrillHost, GrpcNodeFacts
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.catalog.journal import CatalogJournalBase, CatalogResources
from ringsnap.coordinator.cluster_clients import open_cluster
from ringsnap.coordinator.config import ClusterSection, CoordinatorConfig
from ringsnap.coordinator.drill.model import (
    DrillRecord,
    DrillState,
    DrillVerdict,
    new_drill_id,
    purpose_id,
)
from ringsnap.coordinator.drill.plan import DrillPlan, DrillRequest, DrillSettings, plan_drill
from ringsnap.coordinator.drill.workflow import DrillRefused, DrillWorkflow, Progress, quiet
from ringsnap.coordinator.model import Backup, BackupState
from ringsnap.coordinator.ports import ArrayPort
from ringsnap.coordinator.presentation import Presenter, RunOf, cluster_hosts


class CatalogDrillJournal(CatalogJournalBase, CatalogResources):
    """`DrillJournal` over the catalog (every call off the event loop)."""

    async def save(self, record: DrillRecord) -> None:
        await asyncio.to_thread(self.catalog.save_drill, record)

    async def proven_nodes(self, backup_id: str) -> dict[str, str]:
        return await asyncio.to_thread(proven_nodes, self.catalog, backup_id)

    async def backup_nodes(self, backup_id: str) -> list[str]:
        backup = await asyncio.to_thread(self.catalog.get_backup, backup_id)
        return [n.name for n in backup.nodes if n.included]


def proven_nodes(catalog: Catalog, backup_id: str) -> dict[str, str]:
    """Nodes of the backup proven by a drill: node -> the newest drill that proved it."""
    proven: dict[str, str] = {}
    for drill in reversed(catalog.list_drills(backup_id=backup_id, limit=500)):
        for node in drill.nodes:
            if node.verdict is DrillVerdict.PROVEN:
                proven[node.name] = drill.id
    return proven


def last_drilled(catalog: Catalog, cluster: str) -> dict[str, datetime]:
    """When each node of the cluster was last drilled (whatever the backup or the verdict)."""
    seen: dict[str, datetime] = {}
    for drill in catalog.list_drills(cluster, limit=500):
        for node in drill.nodes:
            seen.setdefault(node.name, drill.started_at)
    return seen


def past_node_seconds(catalog: Catalog, cluster: str) -> list[float]:
    """Seconds each proven node took in the cluster's recent drills."""
    return [
        sum(seconds for _, seconds in node.step_seconds)
        for drill in catalog.list_drills(cluster, limit=20)
        if drill.state is DrillState.PROVEN
        for node in drill.nodes
    ]


def newest_restorable(catalog: Catalog, cluster: str) -> Backup:
    for summary in catalog.backup_summaries(cluster):
        if summary.restorable and summary.state is BackupState.COMPLETE:
            return catalog.get_backup(summary.id)
    raise DrillRefused(f"cluster {cluster} has no complete backup to drill")


def settings_of(cluster: ClusterSection) -> DrillSettings:
    if cluster.drill is None:
        return DrillSettings()
    return DrillSettings(
        max_parallel=cluster.drill.max_parallel, deadline_seconds=cluster.drill.deadline_seconds
    )


@dataclass
class DrillSession:
    config: CoordinatorConfig
    catalog: Catalog
    cluster: ClusterSection
    host: GrpcDrillHost | None
    facts: dict[str, GrpcNodeFacts]
    arrays: dict[str, ArrayPort]
    settings: DrillSettings

    async def plan(self, request: DrillRequest, drill_id: str = "") -> DrillPlan:
        if request.backup_id:
            backup = await asyncio.to_thread(self.catalog.get_backup, request.backup_id)
        else:
            backup = await asyncio.to_thread(newest_restorable, self.catalog, request.cluster)
        last = await asyncio.to_thread(last_drilled, self.catalog, request.cluster)
        past = await asyncio.to_thread(past_node_seconds, self.catalog, request.cluster)
        return await plan_drill(
            drill_id or new_drill_id(),
            request,
            backup,
            self.facts,
            self.arrays,
            self.host.address if self.host is not None else "",
            self.cluster.canary_keyspace,
            self.settings,
            last_drilled=last,
            past_node_seconds=past,
        )

    async def run(
        self, plan: DrillPlan, request: DrillRequest, progress: Progress | None = None
    ) -> DrillRecord:
        if self.host is None:
            raise DrillRefused(f"cluster {self.cluster.name} has no drill host configured")
        workflow = DrillWorkflow(
            self.host,
            self.arrays,
            CatalogDrillJournal(self.catalog),
            settings=self.settings,
            progress=progress or quiet,
            presenter=Presenter(
                self.arrays,
                self.catalog,
                RunOf(self.cluster.name, plan.drill_id, "drill"),
                cluster_hosts(self.cluster, {}, drill_host=self.host),
            ),
        )
        return await workflow.run(plan, request.trigger, request.requested_by)


def drill_hosts(config: CoordinatorConfig, tls: ClientTls) -> dict[str, GrpcDrillHost]:
    """The drill host of every cluster that has one, by cluster name (for the pending cleanups)."""
    return {
        c.name: GrpcDrillHost(c.drill.agent, tls) for c in config.clusters if c.drill is not None
    }


@contextlib.asynccontextmanager
async def open_drill_session(
    config: CoordinatorConfig, cluster_name: str, *, catalog: Catalog
) -> AsyncIterator[DrillSession]:
    """The drill host, the production agents and the arrays of one cluster."""
    async with open_cluster(config, cluster_name) as clients:
        cluster = clients.cluster
        drill = cluster.drill
        host = clients.kept(GrpcDrillHost(drill.agent, clients.tls)) if drill is not None else None
        facts = clients.per_node(GrpcNodeFacts)
        yield DrillSession(
            config, catalog, cluster, host, facts, clients.arrays, settings_of(cluster)
        )


__all__ = ["CatalogDrillJournal", "DrillSession", "open_drill_session", "purpose_id"]
