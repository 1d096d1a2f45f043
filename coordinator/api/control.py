"""What the coordinator's API asks beyond `Coordinator`'s own methods: its status, deletions as
watchable operations, operation lookups.

Domain code (no gRPC): `ringsnap.coordinator.api.servicer` translates these values into messages.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime

from ringsnap.coordinator.catalog import BackupStateError, OperationNotFoundError
from ringsnap.coordinator.model import Backup, BackupState, OperationKind
from ringsnap.coordinator.operations import Operation
from ringsnap.coordinator.runs.lease import Lease, RunKind
from ringsnap.coordinator.runs.resources import LedgerEntry, ResourceType
from ringsnap.coordinator.scheduler import Skip
from ringsnap.coordinator.service import Coordinator
from ringsnap.logs import get_logger

log = get_logger(__name__)


class UnknownOperationError(OperationNotFoundError):
    def __init__(self, operation_id: str) -> None:
        super().__init__(operation_id)
        self.args = (
            f"no operation {operation_id!r}: this coordinator keeps its recent operations in"
            " memory only, a restarted one has forgotten them; `ringsnap list` shows the backups"
            " they made",
        )


@dataclass(frozen=True)
class ScheduledRun:
    schedule: str
    cron: str
    timezone: str
    policy: str
    #: None when the schedule will not fire again (or the scheduler is stopped).
    next_run_at: datetime | None


@dataclass(frozen=True)
class RunningBackup:
    """The run holding a cluster (a backup, or a run of another kind)."""

    #: "" in the instant between taking the cluster and recording the backup.
    backup_id: str
    #: Who asked for it (a backup's trigger; a schedule's name when no one else is known).
    trigger: str
    since: datetime | None
    #: "" for a scheduled backup (operations are made for backups started through the API).
    operation_id: str
    kind: RunKind = RunKind.BACKUP
    #: The run's id ("" for a backup, whose id is `backup_id`).
    run_id: str = ""


@dataclass(frozen=True)
class ClusterStatus:
    cluster: str
    last_backup: Backup | None
    last_success_at: datetime | None
    running: RunningBackup | None
    next_runs: tuple[ScheduledRun, ...]


@dataclass(frozen=True)
class LeftResource:
    """A ledger entry other than a backup's snapshot, and the run holding its cluster now (""
    when none: the next retry round takes it)."""

    entry: LedgerEntry
    held_by: str = ""


@dataclass(frozen=True)
class CoordinatorStatus:
    clusters: tuple[ClusterStatus, ...]
    pending_cleanups: int
    #: Newest first.
    recent_skips: tuple[Skip, ...]
    #: Every other ledger entry (clones, mappings, snapshot tags, staging), oldest first.
    left_resources: tuple[LeftResource, ...] = ()


def running_run(
    lease: Lease, backup_id: str, since: datetime | None, operation_id: str
) -> RunningBackup:
    """The run `lease` stands for, as the status shows it: typed kind and id, and who asked."""
    return RunningBackup(
        backup_id=backup_id,
        trigger=lease.asked_by or lease.schedule,
        since=since,
        operation_id=operation_id,
        kind=lease.kind,
        run_id="" if lease.kind is RunKind.BACKUP else lease.run_id,
    )


def find_operation(coordinator: Coordinator, operation_id: str) -> Operation:
    operation = coordinator.operations.get(operation_id)
    if operation is None:
        raise UnknownOperationError(operation_id)
    return operation


async def coordinator_status(coordinator: Coordinator) -> CoordinatorStatus:
    catalog = coordinator.catalog
    next_times = coordinator.scheduler.next_run_times()
    clusters = []
    for name in sorted(coordinator.clusters):
        latest = await asyncio.to_thread(catalog.latest_backup, name)
        last_backup = await asyncio.to_thread(catalog.get_backup, latest.id) if latest else None
        success = await asyncio.to_thread(
            catalog.latest_backup, name, states=[BackupState.COMPLETE]
        )
        running = None
        lease = coordinator.leases.holder(name)
        if lease is not None:
            # A scheduled backup learns its id only when the run starts: the catalog knows it.
            row = await asyncio.to_thread(catalog.latest_backup, name, states=[BackupState.RUNNING])
            backup_id = lease.backup_id or (row.id if row is not None else "")
            operation = coordinator.operations.for_backup(backup_id) if backup_id else None
            if row is not None and row.id == backup_id:
                since: datetime | None = row.started_at
            else:
                since = None if lease.kind is RunKind.BACKUP else lease.since
            running = running_run(
                lease,
                backup_id,
                since,
                operation.current.operation_id if operation is not None else "",
            )
        schedules = sorted(
            (s for s in coordinator.scheduler.schedules.values() if s.cluster == name),
            key=lambda s: s.name,
        )
        clusters.append(
            ClusterStatus(
                cluster=name,
                last_backup=last_backup,
                last_success_at=success.finished_at if success is not None else None,
                running=running,
                next_runs=tuple(
                    ScheduledRun(
                        schedule=s.name,
                        cron=s.cron,
                        timezone=s.timezone,
                        policy=s.policy,
                        next_run_at=next_times.get(s.name),
                    )
                    for s in schedules
                ),
            )
        )
    # Backups' array snapshots left to delete (the ledger's snapshot entries).
    pending = await asyncio.to_thread(catalog.pending_cleanups)
    return CoordinatorStatus(
        clusters=tuple(clusters),
        pending_cleanups=len(pending),
        recent_skips=tuple(reversed(coordinator.scheduler.recent_skips)),
        left_resources=await left_resources(coordinator),
    )


async def left_resources(coordinator: Coordinator) -> tuple[LeftResource, ...]:
    """The ledger's entries other than backups' snapshots, each with the run holding its cluster
    now (the retry leaves those alone until it ends)."""
    left = []
    for entry in await asyncio.to_thread(coordinator.catalog.resources):
        if entry.resource.type is ResourceType.SNAPSHOT:
            continue
        lease = coordinator.leases.holder(entry.resource.cluster)
        left.append(LeftResource(entry, lease.describe() if lease is not None else ""))
    return tuple(left)


async def start_delete(coordinator: Coordinator, backup_id: str, reason: str) -> Operation:
    """Delete a finished backup as an operation: the catalog entry at once, then its array
    snapshots. Refuses before starting when the backup does not exist or is still running.

    A snapshot the array would not delete stays a pending cleanup (retried by the coordinator);
    the operation then succeeds with the problem in its `errors`.
    """
    backup = await asyncio.to_thread(coordinator.catalog.get_backup, backup_id)
    if backup.state is BackupState.RUNNING:
        raise BackupStateError(
            f"backup {backup_id} is still running; it can be deleted once it has ended"
            " (`ringsnap status` shows it)"
        )
    log.info("backup deletion requested", backup_id=backup_id, reason=reason)

    async def work(operation: Operation) -> None:
        await operation.update(
            phase="delete",
            message=f"deleting backup {backup_id} and its {len(backup.snapshots)} array snapshots",
        )
        await coordinator.delete_backup(backup_id, reason)
        left = [
            cleanup
            for cleanup in await asyncio.to_thread(coordinator.catalog.pending_cleanups)
            if cleanup.backup_id == backup_id
        ]
        deleted = len(backup.snapshots) - len(left)
        message = f"backup {backup_id} deleted from the catalog; {deleted} array snapshots deleted"
        problems = tuple(
            f"snapshot {c.name} on array {c.array} is not deleted yet ({c.last_error or 'unknown'});"
            " the coordinator retries it"
            for c in left
        )
        await operation.update(message=message, errors=problems)

    return coordinator.operations.start(OperationKind.DELETE.value, work, backup_id=backup_id)
