"""A restore as the coordinator runs it: the config and the catalog turned into the workflow's ports.

The coordinator (the daemon, or the same service the incident CLI hosts while the daemon is down)
holds the catalog's lock, and the restore its cluster's lease, for the whole restore: no scheduled
backup can freeze a ring that is being restored.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace

from ringsnap.coordinator.agents.connection import GrpcNodeAgent
from ringsnap.coordinator.agents.s3_restore import GrpcS3Restore
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.catalog.journal import CatalogJournalBase
from ringsnap.coordinator.cluster_clients import open_cluster
from ringsnap.coordinator.config import ClusterSection, CoordinatorConfig
from ringsnap.coordinator.model import (
    Backup,
    RestoreMode,
    RestoreRecord,
    RestoreState,
    SnapshotKind,
)
from ringsnap.coordinator.ports import AgentPort, ArrayPort
from ringsnap.coordinator.presentation import Presenter, RunOf, cluster_hosts
from ringsnap.coordinator.restore.plan import (
    RestorePlan,
    RestoreRequest,
    lost_by_revert,
    narrowed,
    plan_restore,
)
from ringsnap.coordinator.restore.record import new_restore_id
from ringsnap.coordinator.restore.s3_keys import NO_KEYS, RestoreKeys
from ringsnap.coordinator.restore.s3_plan import NodeExpectation, s3_plan_refusals
from ringsnap.coordinator.restore.s3_ports import S3RestorePort
from ringsnap.coordinator.restore.workflow import (
    Progress,
    RestoreRefused,
    RestoreSettings,
    RestoreWorkflow,
)
from ringsnap.coordinator.ring import CqlRing
from ringsnap.plugins.types import SnapshotRef


class CatalogRestoreJournal(CatalogJournalBase):
    """`RestoreJournal` over the catalog (every call off the event loop)."""

    async def save(self, record: RestoreRecord) -> None:
        await asyncio.to_thread(self.catalog.save_restore, record)

    async def mark_snapshots_lost(self, backup_ids: Sequence[str], reason: str) -> None:
        await asyncio.to_thread(self.catalog.mark_snapshots_lost, list(backup_ids), reason)


@dataclass
class RestoreSession:
    """Everything one restore needs, opened from the config; see `open_restore_session`."""

    config: CoordinatorConfig
    catalog: Catalog
    cluster: ClusterSection
    agents: dict[str, AgentPort]
    arrays: dict[str, ArrayPort]
    ring: CqlRing
    settings: RestoreSettings
    #: The agents' restore-from-S3 calls (`restore --from s3`).
    s3_agents: dict[str, S3RestorePort] = field(default_factory=dict)

    def workflow(
        self, progress: Progress | None = None, keys: RestoreKeys = NO_KEYS
    ) -> RestoreWorkflow:
        kwargs = {"progress": progress} if progress is not None else {}
        return RestoreWorkflow(
            self.agents,
            self.arrays,
            self.ring,
            CatalogRestoreJournal(self.catalog),
            seeds=self.cluster.seeds,
            settings=self.settings,
            s3_agents=self.s3_agents,
            keys=keys,
            presenter=lambda restore_id: Presenter(
                self.arrays,
                self.catalog,
                RunOf(self.cluster.name, restore_id, "restore"),
                cluster_hosts(self.cluster, self.agents),
            ),
            **kwargs,
        )

    async def plan(self, request: RestoreRequest) -> RestorePlan:
        backup = await asyncio.to_thread(self.catalog.get_backup, request.backup_id)
        others: list[Backup] = []
        if request.mode is RestoreMode.REVERT and self._revert_deletes_newer(
            {r.array for r in backup.snapshots}
        ):
            others = await asyncio.to_thread(self._newer_backups, backup)
        past = await asyncio.to_thread(self._past_seconds, backup.cluster)
        plan = await plan_restore(
            new_restore_id(),
            request,
            backup,
            self.agents,
            self.cluster.seeds,
            self.arrays,
            self.ring,
            newer_backups=others,
            past_seconds=past,
        )
        if request.mode is RestoreMode.S3 and plan.nodes:
            plan = await self._check_s3_copies(replace(plan, keys=request.keys))
        return plan

    async def _check_s3_copies(self, plan: RestorePlan) -> RestorePlan:
        """The bucket holds every node's copy and each data filesystem has room for it."""
        export = await asyncio.to_thread(self.catalog.find_export, plan.backup.id)
        segments = {n.name: n.commitlog_segments for n in export.nodes} if export else {}
        # What each node's export uploaded or found: its agent then reads no manifest object.
        sizes = {n.name: n.bytes_total for n in export.nodes if n.exported} if export else {}
        refused = await s3_plan_refusals(
            plan.restore_id,
            plan.backup.id,
            [
                NodeExpectation(n.name, segments.get(n.name, 0), sizes.get(n.name, 0))
                for n in plan.nodes
            ],
            self.s3_agents,
            keys=plan.keys,
        )
        return replace(plan, refusals=(*plan.refusals, *refused))

    async def run(
        self, plan: RestorePlan, requested_by: str, progress: Progress | None = None
    ) -> RestoreRecord:
        return await self.workflow(progress, plan.keys).run(plan, requested_by)

    async def resume(
        self, restore_id: str, progress: Progress | None = None, keys: RestoreKeys = NO_KEYS
    ) -> RestoreRecord:
        """`keys`: an encrypted copy's, given again (a run's keys are never recorded); needed
        only by nodes whose download did not complete."""
        record = await asyncio.to_thread(self.catalog.get_restore, restore_id)
        if record.state.finished:
            raise RestoreRefused(
                f"restore {restore_id} is finished ({record.state.value}); nothing to resume"
            )
        backup = await asyncio.to_thread(self.catalog.get_backup, record.backup_id)
        snapshots = snapshots_for(record, backup)
        # Arrays whose revert is not recorded may still delete newer snapshots (ONTAP).
        pending = {a: r for a, r in snapshots.items() if a not in dict(record.arrays_done)}
        lost: list[str] = []
        if record.mode is RestoreMode.REVERT and self._revert_deletes_newer(set(pending)):
            others = await asyncio.to_thread(self._newer_backups, backup)
            for array, ref in pending.items():
                if self._revert_deletes_newer({array}):
                    lost.extend(lost_by_revert(backup, ref, others))
        native = backup.snapshot_kind is SnapshotKind.NATIVE
        return await self.workflow(progress, keys).resume(
            record, snapshots, sorted(set(lost)), native=native
        )

    def _revert_deletes_newer(self, arrays: set[str]) -> bool:
        return any(
            self.arrays[a].capabilities().revert_deletes_newer for a in arrays if a in self.arrays
        )

    def _newer_backups(self, backup: Backup) -> list[Backup]:
        summaries = self.catalog.backup_summaries(backup.cluster)
        newer = [s for s in summaries if s.started_at > backup.started_at and s.restorable]
        return [self.catalog.get_backup(s.id) for s in newer]

    def _past_seconds(self, cluster: str) -> list[float]:
        return [
            (r.finished_at - r.started_at).total_seconds()
            for r in self.catalog.list_restores(cluster, limit=20)
            if r.state is RestoreState.PROVEN and r.finished_at is not None
        ]


def snapshots_for(record: RestoreRecord, backup: Backup) -> dict[str, SnapshotRef]:
    """The backup's snapshots narrowed to the volumes of the record's nodes, per array."""
    wanted: dict[str, set[str]] = {}
    for node in record.nodes:
        for volume in node.volumes:
            wanted.setdefault(volume.array, set()).add(volume.volume)
    return {
        ref.array: narrowed(ref, wanted[ref.array])
        for ref in backup.snapshots
        if ref.array in wanted
    }


@contextlib.asynccontextmanager
async def open_restore_session(
    config: CoordinatorConfig,
    cluster_name: str,
    *,
    catalog: Catalog | None = None,
    settings: RestoreSettings | None = None,
) -> AsyncIterator[RestoreSession]:
    """Agents, arrays and the ring of one cluster, and the catalog (opened here, exclusively,
    unless given)."""
    own_catalog = catalog is None
    if catalog is None:
        catalog = await asyncio.to_thread(Catalog, config.coordinator.catalog)
    try:
        async with open_cluster(config, cluster_name) as clients:
            yield RestoreSession(
                config,
                catalog,
                clients.cluster,
                dict(clients.per_node(GrpcNodeAgent)),
                clients.arrays,
                clients.kept(CqlRing(clients.cluster)),
                settings or RestoreSettings(),
                dict(clients.per_node(GrpcS3Restore)),
            )
    finally:
        if own_catalog:
            await asyncio.to_thread(catalog.close)
