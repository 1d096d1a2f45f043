"""The coordinator's business: backups recorded in the catalog, retention, cleanups, recovery.

Joins the pieces that each do one job: the workflow (the protocol), the catalog (the record), the
drivers (through the middleware), the scheduler (one backup per cluster at a time), the metrics.
Restores run here, always (`ringsnap restore` goes through the API): in the daemon, or, while no
daemon runs, in this same class hosted by the CLI for the one command (`cli.hosted`, not started:
no schedules), holding the cluster as a backup does. Nothing here speaks gRPC; `ringsnap.coordinator.api.servicer` translates for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from ringsnap.agent.s3.client import make_client
from ringsnap.coordinator import catalog_metrics
from ringsnap.coordinator.backup import (
    new_backup_id,
)
from ringsnap.coordinator.backup.daemon import DaemonBackups, recover_interrupted
from ringsnap.coordinator.catalog import BackupStateError, Catalog
from ringsnap.coordinator.cluster_clients import client_tls
from ringsnap.coordinator.cluster_runtime import ClusterRuntime, UnknownClusterError
from ringsnap.coordinator.config import CoordinatorConfig, RetentionSection
from ringsnap.coordinator.drill.cleanups import CloneHolder, DrillHosts, NodeAgentCache
from ringsnap.coordinator.drill.daemon import start_drill
from ringsnap.coordinator.drill.plan import DrillRequest
from ringsnap.coordinator.drill.ports import DrillHost
from ringsnap.coordinator.drill.schedule import DrillService, drill_scheduler, drill_schedules
from ringsnap.coordinator.drill.session import drill_hosts
from ringsnap.coordinator.export.scheduled import export_scheduled_backup, exports_policy
from ringsnap.coordinator.export.session import export_node_opener
from ringsnap.coordinator.metrics import CoordinatorMetrics
from ringsnap.coordinator.model import (
    Backup,
    BackupState,
)
from ringsnap.coordinator.operations import Operation, Operations
from ringsnap.coordinator.pitr.retention import purge_shipped_log
from ringsnap.coordinator.pitr.window import pitr_clusters
from ringsnap.coordinator.ports import AgentPort, ArrayPort
from ringsnap.coordinator.presentation import (
    HostLookup,
    InitiatorSource,
    cluster_hosts,
)
from ringsnap.coordinator.restore.daemon import DaemonRestores
from ringsnap.coordinator.retention import RetentionPlan, apply_policy
from ringsnap.coordinator.runs.lease import ClusterHeld, ClusterLeases, Lease, RunKind
from ringsnap.coordinator.runs.ledger import Ledger, LedgerRetry
from ringsnap.coordinator.runs.resources import ResourceType
from ringsnap.coordinator.runs.snapshot_undo import SnapshotUndo
from ringsnap.coordinator.scheduler import (
    BackupRequest,
    BackupScheduler,
    Schedule,
    Skip,
)
from ringsnap.coordinator.table_restore import daemon as table_restore_daemon
from ringsnap.coordinator.table_restore.model import TableRestoreRequest
from ringsnap.coordinator.table_restore.plan import TableRestorePlan
from ringsnap.errors import RingsnapError
from ringsnap.logs import get_logger

log = get_logger(__name__)


#: How often the daemon retries pending cleanups.
CLEANUP_INTERVAL_SECONDS = 300.0


class UnknownPolicyError(RingsnapError):
    exit_code = 2


class Coordinator:
    def __init__(
        self,
        config: CoordinatorConfig,
        catalog: Catalog,
        metrics: CoordinatorMetrics,
        arrays: dict[str, ArrayPort],
        clusters: dict[str, ClusterRuntime],
        *,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.config = config
        self.catalog = catalog
        self.metrics = metrics
        self.arrays = arrays
        self.clusters = clusters
        self.operations = Operations()
        self._now = now
        self._cleaner: asyncio.Task[None] | None = None
        # Every backup running in this process (scheduled ones have no operation): stop() cancels
        # them so that their nodes are thawed and the catalog says why they failed.
        self._backup_tasks: set[asyncio.Task[object]] = set()
        # Exports of scheduled backups, run after their backup gave its cluster back.
        self._export_tasks: set[asyncio.Task[None]] = set()
        # Drill hosts, for the pending cleanups of drill clones (opened on first use).
        self.drill_hosts = DrillHosts(lambda: drill_hosts(config, client_tls(config)))
        # Nodes' agents, for the pending cleanups of clones a node mounted (exports).
        self.clone_nodes = NodeAgentCache(export_node_opener(config))
        self.backups = DaemonBackups(
            config, catalog, metrics, arrays, self.operations, now, self._after_failed_backup
        )
        # Which run holds which cluster: every run of every kind takes its cluster's lease.
        self.leases = ClusterLeases()
        self.scheduler = BackupScheduler(
            [s.schedule() for s in config.schedules],
            self._scheduled_backup,
            leases=self.leases,
            on_skip=self._skipped,
            misfire_grace=timedelta(seconds=config.coordinator.misfire_grace_seconds),
            last_run=self._last_run,
        )
        # The resource ledger: backups' snapshots, native tags, clones (unmounted on their node
        # first) and mappings, each undone by its one path.
        self.ledger = LedgerRetry(
            Ledger(catalog),
            arrays,
            node_agent=self._clone_holder,
            tag_agent=self._node_agent,
            drill_host=lambda cluster: self._drill_hosts().get(cluster),
            held=self.leases.holder,
            now=now,
            node_host=self._node_host,
            snapshots=SnapshotUndo(arrays, self._volume_names, now),
        )
        self.restores = DaemonRestores(
            config,
            catalog,
            self.operations,
            self.leases,
            cluster=self.cluster,
            clusters=lambda: self.clusters,
            finished=self.refresh_restore_metrics,
            track=self._track,
            now=now,
        )
        # Scheduled drills hold their cluster's lease, as backups and restores do.
        self.drills = DrillService(
            config, catalog, finished=lambda _record: self.refresh_restore_metrics()
        )
        self.drill_scheduler = drill_scheduler(
            drill_schedules(config),
            self.drills.scheduled,
            leases=self.leases,
            misfire_grace=timedelta(seconds=config.coordinator.misfire_grace_seconds),
            last_run=self.drills.last_run,
        )

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Recover what a previous process left, then start the schedules."""
        catalog_metrics.configure(self.metrics, self.config, self._now())
        for cluster in self.clusters:
            self.metrics.add_cluster(cluster)
            latest = await asyncio.to_thread(
                self.catalog.latest_backup, cluster, states=[BackupState.COMPLETE]
            )
            if latest is not None and latest.finished_at is not None:
                self.metrics.set_last_success(cluster, latest.finished_at)
        await asyncio.to_thread(self.refresh_restore_metrics)
        await self.recover()
        await self.scheduler.start()
        await self.drill_scheduler.start()
        self._cleaner = asyncio.get_running_loop().create_task(self._clean_periodically())

    def refresh_restore_metrics(self) -> None:
        """Restores run in the operator's CLI as often as here: their figures come from the
        catalog (the newest restore and drill, the newest proven backup per cluster, the overdue
        S3 copies)."""
        catalog_metrics.refresh(self.metrics, self.catalog, self.config, self._now())

    async def _clean_periodically(self) -> None:
        while True:
            await asyncio.sleep(CLEANUP_INTERVAL_SECONDS)
            try:
                await self.run_pending_cleanups()
            except Exception as exc:  # the next round tries again; never kill the daemon
                log.error("pending cleanups failed", error=str(exc))
            try:  # S3 copies come due with time alone
                await asyncio.to_thread(self.refresh_restore_metrics)
            except Exception as exc:
                log.error("metrics not refreshed from the catalog", error=str(exc))

    async def stop(self) -> None:
        self.scheduler.shutdown()
        self.drill_scheduler.shutdown()
        if self._cleaner is not None:
            self._cleaner.cancel()
            await asyncio.gather(self._cleaner, return_exceptions=True)
        tasks: set[asyncio.Task[Any]] = {*self._backup_tasks, *self._export_tasks}
        tasks.update(op.task for op in self.operations.running() if op.task is not None)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.drill_scheduler.wait_idle()
        await self.drill_hosts.close()
        await self.clone_nodes.close()

    def _track(self, task: asyncio.Task[None]) -> None:
        """A task `stop` must wait for (a restore's clean-up started after its cancellation)."""
        self._backup_tasks.add(task)
        task.add_done_callback(self._backup_tasks.discard)

    # -- backups ---------------------------------------------------------------------------------

    def cluster(self, name: str) -> ClusterRuntime:
        try:
            return self.clusters[name]
        except KeyError:
            raise UnknownClusterError(
                f"unknown cluster {name!r}; configured: {', '.join(sorted(self.clusters))}"
            ) from None

    # The pending cleanups' lookups, made at each run (`drill_hosts` and `clone_nodes` may be
    # replaced after the start; tests do).

    def _drill_hosts(self) -> Mapping[str, DrillHost]:
        return self.drill_hosts.get()

    def _clone_holder(self, cluster: str, node: str) -> CloneHolder | None:
        return self.clone_nodes.get(cluster, node)

    def _node_host(self, cluster: str) -> HostLookup | None:
        runtime = self.clusters.get(cluster)
        drill = self._drill_hosts().get(cluster)
        source = cast(InitiatorSource, drill) if hasattr(drill, "volume_state") else None
        return cluster_hosts(runtime.config, runtime.agents, source) if runtime else None

    def _node_agent(self, cluster: str, node: str) -> AgentPort | None:
        runtime = self.clusters.get(cluster)
        return runtime.agents.get(node) if runtime is not None else None

    def _volume_names(self, array: str) -> set[str]:
        return {
            v.volume
            for runtime in self.clusters.values()
            for node in runtime.config.nodes
            for v in node.volumes
            if v.array == array
        }

    def start_backup(self, request: BackupRequest) -> Operation:
        """Start a backup as an operation; the cluster's lease refuses a second run at once."""
        self.cluster(request.cluster)
        if request.policy:
            self.policy(request.policy)
        request = replace(request, backup_id=request.backup_id or new_backup_id(self._now()))

        async def work(operation: Operation) -> None:
            await self.scheduler.run(request)

        return self.operations.start("backup", work, backup_id=request.backup_id)

    async def backup(self, request: BackupRequest) -> Backup:
        """Run one backup to its end (for the scheduler and tests); raises on failure."""
        result = await self.scheduler.run(request)
        assert isinstance(result, Backup)
        return result

    async def _scheduled_backup(self, request: BackupRequest) -> Backup:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a backup runs in a task")
        self._backup_tasks.add(task)
        try:
            return await self._run_backup(request)
        finally:
            self._backup_tasks.discard(task)

    async def _run_backup(self, request: BackupRequest) -> Backup:
        backup = await self.backups.run(request, self.cluster(request.cluster))
        self.metrics.record_backup(backup)
        if request.policy and exports_policy(self.config, request.policy):
            self._export_after(backup, request)
        if request.policy:
            await self.apply_retention(request.cluster, request.policy)
        return backup

    def _export_after(self, backup: Backup, request: BackupRequest) -> None:
        """Export a scheduled backup in a task of its own, under an export's lease (taken now,
        beside the backup's), so that the cluster's next backups do not wait for the upload."""
        lease = Lease(
            backup.cluster,
            RunKind.EXPORT,
            run_id=backup.id,
            backup_id=backup.id,
            asked_by=request.trigger,
            schedule=request.schedule,
        )
        try:
            self.leases.take(lease)
        except ClusterHeld as busy:
            log.error(
                "scheduled export not started: export it once the cluster is free"
                f" (`ringsnap export {backup.id}`)",
                backup=backup.id,
                reason=str(busy),
            )
            return

        async def export() -> None:
            try:
                await export_scheduled_backup(self.config, self.catalog, self.arrays, backup)
                await asyncio.to_thread(self.refresh_restore_metrics)
            finally:
                self.leases.give_back(lease)

        task = asyncio.get_running_loop().create_task(export())
        self._export_tasks.add(task)
        task.add_done_callback(self._export_tasks.discard)

    async def exports_idle(self) -> None:
        """Wait for the exports of scheduled backups running now to end."""
        while self._export_tasks:
            await asyncio.gather(*list(self._export_tasks), return_exceptions=True)

    def refuse_while_exported(self, backup_id: str) -> None:
        """A backup an export reads its snapshots from is not deleted under it."""
        for cluster in self.clusters:
            export = self.leases.exporting(cluster)
            if export is not None and export.backup_id == backup_id:
                raise BackupStateError(
                    f"backup {backup_id} is {export.doing}: its snapshots are in use; delete it"
                    " once the export has ended (`ringsnap status` shows it)"
                )

    async def start_drill(self, request: DrillRequest, *, drill_id: str = "") -> Operation:
        """Plan and run a drill as an operation, holding its cluster (docs/drills.md)."""
        self.cluster(request.cluster)
        return await start_drill(
            self.config,
            self.catalog,
            self.operations,
            self.leases,
            request,
            drill_id=drill_id,
            finished=self.refresh_restore_metrics,
        )

    async def plan_table_restore(
        self, request: TableRestoreRequest
    ) -> tuple[TableRestorePlan, dict[str, object]]:
        """A table restore's plan and its document (docs/table-restore.md); changes nothing."""
        return await table_restore_daemon.plan_table_restore(self.config, self.catalog, request)

    async def start_table_restore(self, start: table_restore_daemon.TableRestoreStart) -> Operation:
        """Run (resume, abort) a table restore as an operation, holding its cluster."""
        return await table_restore_daemon.start_table_restore(
            self.config,
            self.catalog,
            self.operations,
            self.leases,
            start,
            self.refresh_restore_metrics,
        )

    # -- deletion, cleanup, retention ------------------------------------------------------------

    async def delete_backup(self, backup_id: str, reason: str) -> None:
        await asyncio.to_thread(self.catalog.delete_backup, backup_id, reason=reason)
        await self._undo_backup(backup_id)

    async def _after_failed_backup(self, backup_id: str) -> None:
        await self._undo_backup(backup_id)
        await self.run_pending_cleanups()

    async def _undo_backup(self, backup_id: str) -> None:
        """A failed or deleted backup's snapshots and native tags, at once: no run uses them,
        whoever holds the cluster (its own failing run, or the backup whose retention deletes
        it)."""
        left = await asyncio.to_thread(self.catalog.resources, backup_id)
        backup_kinds = (ResourceType.SNAPSHOT, ResourceType.NATIVE_TAG)
        await self.ledger.run(
            [e for e in left if e.resource.type in backup_kinds], even_if_held=True
        )

    async def run_pending_cleanups(self) -> int:
        """Undo what the resource ledger holds; how many entries are left. Two figures: backups'
        array snapshots left to delete (`ringsnap_pending_cleanups`), and the other entries no
        run holds now (`ringsnap_ledger_entries`)."""
        await self.ledger.run()
        in_ledger = await asyncio.to_thread(self.catalog.resources)
        snapshots = [e for e in in_ledger if e.resource.type is ResourceType.SNAPSHOT]
        self.metrics.set_pending_cleanups(
            len(snapshots), min((e.created_at for e in snapshots), default=None)
        )
        # A cluster a run holds now is using its entries (the retry leaves them alone too): only
        # the others are left over, and only they may age into the alert.
        left_over = [
            e
            for e in in_ledger
            if e.resource.type is not ResourceType.SNAPSHOT
            and self.leases.holder(e.resource.cluster) is None
        ]
        self.metrics.set_ledger_entries(
            len(left_over), min((e.created_at for e in left_over), default=None)
        )
        return len(in_ledger)

    def policy(self, name: str) -> RetentionSection:
        try:
            return self.config.retention[name]
        except KeyError:
            raise UnknownPolicyError(
                f"unknown retention policy {name!r}; configured:"
                f" {', '.join(sorted(self.config.retention)) or 'none'}"
            ) from None

    async def plan_retention(self, cluster: str, policy: str) -> RetentionPlan:
        self.cluster(cluster)
        section = self.policy(policy)
        summaries = await asyncio.to_thread(self.catalog.backup_summaries, cluster, policy=policy)
        # A running backup is never retention's to judge.
        finished = [s for s in summaries if s.state is not BackupState.RUNNING]
        return apply_policy(finished, section.policy(), self._now())

    async def apply_retention(self, cluster: str, policy: str) -> RetentionPlan:
        plan = await self.plan_retention(cluster, policy)
        export = self.leases.exporting(cluster)
        for decision in plan.decisions:
            if decision.keep:
                continue
            if export is not None and export.backup_id == decision.backup.id:
                log.warning(
                    "retention keeps a backup being exported; the next run removes it",
                    cluster=cluster,
                    backup_id=decision.backup.id,
                    reason=decision.reason,
                )
                continue
            log.info(
                "retention removes backup",
                cluster=cluster,
                backup_id=decision.backup.id,
                reason=decision.reason,
            )
            await self.delete_backup(decision.backup.id, f"retention ({policy}): {decision.reason}")
            self.metrics.retention_deleted(cluster)
        await self._purge_shipped_log(cluster)
        return plan

    async def _purge_shipped_log(self, cluster: str) -> None:
        """The shipped commit log no retained backup needs goes with them (docs/pitr.md)."""
        nodes = pitr_clusters(self.config).get(cluster)
        if not nodes or self.config.s3 is None:
            return
        summaries = await asyncio.to_thread(self.catalog.backup_summaries, cluster)
        starts = [s.started_at for s in summaries if s.restorable]
        if starts:
            client = make_client(self.config.s3)
            await asyncio.to_thread(purge_shipped_log, client, self.config.s3, nodes, min(starts))

    # -- recovery --------------------------------------------------------------------------------

    async def recover(self) -> None:
        """Runs that died with a previous process: thaw their nodes, find what their arrays made,
        mark them failed. Then retry every pending cleanup."""
        await recover_interrupted(self.catalog, self.clusters)
        await self.run_pending_cleanups()

    async def _last_run(self, schedule: Schedule) -> datetime | None:
        latest = await asyncio.to_thread(
            self.catalog.latest_backup, schedule.cluster, trigger=schedule.trigger
        )
        return latest.started_at if latest is not None else None

    def _skipped(self, skip: Skip) -> None:
        self.metrics.backup_skipped(skip.request.cluster, skip.kind)


__all__ = [
    "CLEANUP_INTERVAL_SECONDS",
    "ClusterRuntime",
    "Coordinator",
    "UnknownClusterError",
    "UnknownPolicyError",
]
