"""The daemon's backups: one run of the workflow from its request to its record in the catalog (the
catalog row begun when the run starts, completed or failed at its end, the metrics of a failure),
and the backups a previous process left running (their nodes thawed, their snapshots to clean up).
What follows a complete backup (its export, retention) is the coordinator's
(`ringsnap.coordinator.service`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime

from ringsnap.coordinator.backup.followed import followed_volumes, with_followed
from ringsnap.coordinator.backup.model import BackupRun, BackupSettings, new_backup_id
from ringsnap.coordinator.backup.nodes import arrays_of, planned_nodes
from ringsnap.coordinator.backup.record import record_completed, record_failed
from ringsnap.coordinator.backup.schema_capture import KeyspaceSchemaReader
from ringsnap.coordinator.backup.workflow import BackupWorkflow
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.cluster_runtime import ClusterRuntime
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.metrics import CoordinatorMetrics
from ringsnap.coordinator.model import (
    Backup,
    BackupState,
    CleanupRequest,
    QuiesceMode,
    SnapshotKind,
    native_tags,
)
from ringsnap.coordinator.operations import Operations
from ringsnap.coordinator.ports import ArrayPort
from ringsnap.coordinator.runs.ledger import Ledger
from ringsnap.coordinator.scheduler import BackupRequest
from ringsnap.logs import get_logger

log = get_logger(__name__)


class DaemonBackups:
    """Runs backups and records them; `after_failure(backup_id)` runs once a failed run is
    recorded (the coordinator clears its native tags and retries the cleanups it left)."""

    def __init__(  # noqa: PLR0917 - the daemon's parts a backup uses
        self,
        config: CoordinatorConfig,
        catalog: Catalog,
        metrics: CoordinatorMetrics,
        arrays: Mapping[str, ArrayPort],
        operations: Operations,
        now: Callable[[], datetime],
        after_failure: Callable[[str], Awaitable[object]],
    ) -> None:
        self.config = config
        self.catalog = catalog
        self.metrics = metrics
        self.arrays = arrays
        self.operations = operations
        self.now = now
        self.after_failure = after_failure
        self._runs: dict[str, BackupRun] = {}

    def settings(self, runtime: ClusterRuntime) -> BackupSettings:
        cluster = runtime.config
        return BackupSettings(
            snapshots=cluster.snapshots,
            quiesce=cluster.quiesce,
            freeze_budget=cluster.freeze_budget_seconds
            or self.config.coordinator.freeze_budget_seconds,
            lease=self.config.coordinator.lease_seconds,
            allow_partial=cluster.allow_partial,
        )

    async def run(self, request: BackupRequest, runtime: ClusterRuntime) -> Backup:
        """One backup to its record; raises once a failure is recorded."""
        backup_id = request.backup_id or new_backup_id(self.now())
        operation = self.operations.for_backup(backup_id)
        cluster = runtime.config

        def progress(phase: str, message: str) -> None:
            if operation is not None:
                operation.update_soon(phase=phase, message=message)

        # The catalog's restores tell which volumes are the nodes' disks now (after a clone-mode
        # restore: the clones, whatever the config still names).
        restores = await asyncio.to_thread(self.catalog.array_restores, cluster.name)
        workflow = BackupWorkflow(
            cluster.name,
            with_followed(runtime.targets(), followed_volumes(cluster.name, restores)),
            {name: self.arrays[name] for name in arrays_of(cluster)},
            runtime.canaries,
            progress=progress,
            schemas=runtime.canaries
            if isinstance(runtime.canaries, KeyspaceSchemaReader)
            else None,
            ledger=Ledger(self.catalog),
        )
        started = time.monotonic()

        async def begin(run: BackupRun) -> None:
            self._runs[backup_id] = run
            await asyncio.to_thread(
                self.catalog.begin_backup,
                backup_id=backup_id,
                cluster=cluster.name,
                # A native backup flushes and freezes nothing: flush-only, whatever `quiesce` says.
                quiesce_mode=QuiesceMode.FLUSH_ONLY
                if cluster.snapshots is SnapshotKind.NATIVE
                else cluster.quiesce,
                trigger=request.trigger,
                policy=request.policy,
                started_at=run.started_at,
                nodes=planned_nodes(cluster),
                snapshot_kind=cluster.snapshots,
            )

        try:
            run = await workflow.run(
                self.settings(runtime),
                trigger=request.trigger,
                policy=request.policy,
                backup_id=backup_id,
                on_start=begin,
            )
            return await asyncio.to_thread(record_completed, self.catalog, cluster, run)
        except BaseException as exc:
            failed = self._runs.get(backup_id)
            if failed is not None:
                await asyncio.shield(asyncio.to_thread(record_failed, self.catalog, failed, exc))
                self.metrics.backup_finished(
                    cluster.name,
                    BackupState.FAILED,
                    time.monotonic() - started,
                    freeze_window=failed.window,
                    phases=failed.clock.phases,
                )
                if not isinstance(exc, asyncio.CancelledError):
                    await self.after_failure(backup_id)
            raise
        finally:
            self._runs.pop(backup_id, None)


async def recover_interrupted(catalog: Catalog, clusters: Mapping[str, ClusterRuntime]) -> None:
    """Backups that died with a previous process: thaw their nodes, and mark them failed with what
    their arrays may hold as pending cleanups (and their nodes' native snapshots as ledger
    entries)."""
    for backup in await asyncio.to_thread(catalog.interrupted_backups):
        log.warning("found an interrupted backup", backup_id=backup.id, cluster=backup.cluster)
        runtime = clusters.get(backup.cluster)
        if runtime is not None:
            results = await asyncio.gather(
                *(agent.thaw(backup.id) for agent in runtime.agents.values()),
                return_exceptions=True,
            )
            for name, result in zip(runtime.agents, results, strict=True):
                if isinstance(result, BaseException):
                    log.warning("thaw on recovery failed; the lease has thawed it", node=name)
        why = f"backup {backup.id} interrupted by a coordinator stop"
        cleanups = [
            CleanupRequest(array=array, reason=why, snapshot_name=backup.id)
            for array in backup.arrays
        ]
        tags = native_tags(backup, why) if backup.snapshot_kind is SnapshotKind.NATIVE else []
        await asyncio.to_thread(
            catalog.fail_backup,
            backup.id,
            "the coordinator stopped during the run; nodes were thawed by their leases",
            cleanups=cleanups,
            native_tags=tags,
        )
