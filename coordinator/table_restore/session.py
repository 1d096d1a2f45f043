"""A table restore as one process runs it: the config and the catalog turned into the workflow's
ports (the catalog's lock keeps the daemon's backups and any other restore out meanwhile)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

from ringsnap.coordinator.agents.connection import GrpcNodeAgent
from ringsnap.coordinator.agents.s3_restore import GrpcS3Restore
from ringsnap.coordinator.agents.table_restore import GrpcTableNode
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.catalog.journal import (
    CatalogJournalBase,
    CatalogResources,
)
from ringsnap.coordinator.catalog.listing import MAX_PAGE_SIZE
from ringsnap.coordinator.cluster_clients import open_cluster
from ringsnap.coordinator.config import ClusterSection, CoordinatorConfig
from ringsnap.coordinator.ports import AgentPort, ArrayPort, SSTable
from ringsnap.coordinator.presentation import Presenter, RunOf, cluster_hosts
from ringsnap.coordinator.restore.s3_keys import NO_KEYS, RestoreKeys
from ringsnap.coordinator.restore.s3_plan import NodeExpectation, s3_plan_refusals
from ringsnap.coordinator.restore.s3_ports import S3RestorePort
from ringsnap.coordinator.runs.resources import Resource, ResourceType
from ringsnap.coordinator.table_restore.counts import DrilledCounts, newest_drilled_counts
from ringsnap.coordinator.table_restore.cql import CqlTables
from ringsnap.coordinator.table_restore.model import (
    CloneRecord,
    TableRestoreRecord,
    TableRestoreRefused,
    TableRestoreRequest,
    new_table_restore_id,
)
from ringsnap.coordinator.table_restore.plan import TableRestorePlan, plan_table_restore
from ringsnap.coordinator.table_restore.ports import TableNodePort
from ringsnap.coordinator.table_restore.workflow import Progress, TableRestoreWorkflow


class CatalogTableJournal(CatalogJournalBase, CatalogResources):
    """`TableRestoreJournal` (`table_restore.ports`) over the catalog (every call off the event loop)."""

    async def save(self, record: TableRestoreRecord) -> None:
        await asyncio.to_thread(self.catalog.save_table_restore, record)

    async def drilled_counts(self, backup_id: str) -> Mapping[str, DrilledCounts]:
        drills = await asyncio.to_thread(
            self.catalog.list_drills, backup_id=backup_id, limit=MAX_PAGE_SIZE
        )
        return newest_drilled_counts(drills)

    async def clones_planned(
        self, record: TableRestoreRecord, clones: Sequence[CloneRecord], suffix: str
    ) -> list[int]:
        return await self.record_resources(
            [
                Resource(
                    type=ResourceType.CLONE,
                    cluster=record.cluster,
                    run_id=record.id,
                    run_kind="table-restore",
                    reason=f"clone of {clone.volume} made by table restore {record.id} of backup"
                    f" {record.backup_id} for node {clone.node}",
                    array=clone.array,
                    name_hint=suffix,
                    # The node's agent mounts it under the restore's id: a retry unmounts it there.
                    node=clone.node,
                    mount_purpose=record.id,
                )
                for clone in clones
            ]
        )

    async def clone_made(self, entry_id: int, clone: CloneRecord) -> None:
        await self.resource_made(entry_id, clone.clone, clone.clone_id)

    # The clone session's cleanups are the ledger's entries.

    async def cleanup_pending(self, cleanup_id: int) -> bool:
        return await self.resource_pending(cleanup_id)

    async def cleanup_done(self, cleanup_id: int) -> None:
        await self.resource_gone(cleanup_id)

    async def cleanup_failed(self, cleanup_id: int, error: str) -> None:
        await self.resource_failed(cleanup_id, error)


@dataclass
class TableRestoreSession:
    config: CoordinatorConfig
    catalog: Catalog
    cluster: ClusterSection
    agents: dict[str, AgentPort]
    nodes: dict[str, TableNodePort]
    arrays: dict[str, ArrayPort]
    cql: CqlTables
    #: The agents' restore-from-S3 calls (`--from s3`).
    s3_agents: dict[str, S3RestorePort] = field(default_factory=dict)

    async def plan(self, request: TableRestoreRequest, restore_id: str = "") -> TableRestorePlan:
        """The plan of `request`; `restore_id` is the id a confirmed plan was shown with."""
        backup = await asyncio.to_thread(self.catalog.get_backup, request.backup_id)
        if backup.cluster != self.cluster.name:
            raise TableRestoreRefused(f"backup {backup.id} is of cluster {backup.cluster}")
        schema = await asyncio.to_thread(self.catalog.keyspace_schema, backup.id, request.keyspace)
        manifests: dict[str, list[SSTable]] = {}
        for node in backup.nodes:
            if node.included:
                manifests[node.name] = await asyncio.to_thread(
                    lambda n=node.name: [  # type: ignore[misc]
                        s
                        for s in self.catalog.iter_manifest(backup.id, n)
                        if s.keyspace == request.keyspace
                    ]
                )
        plan = await plan_table_restore(
            restore_id or new_table_restore_id(),
            request,
            backup,
            schema,
            manifests,
            self.agents,
            self.nodes,
            self.arrays,
            self.cql,
        )
        if request.from_s3 and plan.record.nodes:
            # Each node's copy must be in the bucket before anything is staged.
            refused = await s3_plan_refusals(
                plan.record.id,
                backup.id,
                [NodeExpectation(n.name) for n in plan.record.nodes],
                self.s3_agents,
                whole_copy=False,
                keys=request.keys,
            )
            plan = replace(plan, refusals=(*plan.refusals, *refused), keys=request.keys)
        return plan

    async def workflow(
        self, record: TableRestoreRecord, progress: Progress | None, keys: RestoreKeys = NO_KEYS
    ) -> TableRestoreWorkflow:
        backup = await asyncio.to_thread(self.catalog.get_backup, record.backup_id)
        keyspaces = {t.source_keyspace for t in record.targets}
        schema = None
        if len(keyspaces) == 1:
            schema = await asyncio.to_thread(
                self.catalog.keyspace_schema, backup.id, next(iter(keyspaces))
            )
        return TableRestoreWorkflow(
            backup,
            schema,
            self.nodes,
            self.arrays,
            self.cql,
            CatalogTableJournal(self.catalog),
            progress=progress,
            s3_agents=self.s3_agents,
            keys=keys,
            presenter=Presenter(
                self.arrays,
                self.catalog,
                RunOf(backup.cluster, record.id, "table-restore"),
                cluster_hosts(self.cluster, self.nodes),
            ),
        )

    async def run(self, plan: TableRestorePlan, progress: Progress | None) -> TableRestoreRecord:
        if plan.refused:
            raise TableRestoreRefused("the plan refused: " + "; ".join(plan.refusals))
        workflow = await self.workflow(plan.record, progress, plan.keys)
        return await workflow.run(plan.record)

    async def resume(
        self, restore_id: str, progress: Progress | None, keys: RestoreKeys = NO_KEYS
    ) -> TableRestoreRecord:
        """`keys`: an encrypted copy's, given again (a run's keys are never recorded)."""
        record = await asyncio.to_thread(self.catalog.get_table_restore, restore_id)
        if record.state.finished:
            raise TableRestoreRefused(
                f"table restore {restore_id} is {record.state.value}; nothing to resume"
            )
        workflow = await self.workflow(record, progress, keys)
        return await workflow.run(record)

    async def abort(self, restore_id: str, progress: Progress | None) -> TableRestoreRecord:
        record = await asyncio.to_thread(self.catalog.get_table_restore, restore_id)
        workflow = await self.workflow(record, progress)
        return await workflow.abort(record)


@contextlib.asynccontextmanager
async def open_table_restore_session(
    config: CoordinatorConfig, cluster_name: str, *, catalog: Catalog
) -> AsyncIterator[TableRestoreSession]:
    async with open_cluster(config, cluster_name) as clients:
        yield TableRestoreSession(
            config,
            catalog,
            clients.cluster,
            dict(clients.per_node(GrpcNodeAgent)),
            dict(clients.per_node(GrpcTableNode)),
            clients.arrays,
            clients.kept(CqlTables(clients.cluster)),
            dict(clients.per_node(GrpcS3Restore)),
        )
