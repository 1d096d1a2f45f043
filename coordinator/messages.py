"""Domain values of the coordinator as v1 API messages (one direction: the server answers with
these; the CLI reads the messages as they are)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from google.protobuf import duration_pb2, timestamp_pb2

from ringsnap import __version__
from ringsnap.api.v1 import coordinator_pb2 as pb
from ringsnap.api.v1 import types_pb2
from ringsnap.coordinator.control import ClusterStatus, CoordinatorStatus, RunningBackup
from ringsnap.coordinator.model import (
    Backup,
    BackupNode,
    BackupState,
    FreezeWindow,
    NodeVolume,
    OperationKind,
    OperationState,
    PhaseTiming,
    QuiesceMode,
    Verification,
    VolumeRole,
)
from ringsnap.coordinator.operations import OperationSnapshot
from ringsnap.coordinator.retention import RetentionPlan
from ringsnap.coordinator.scheduler import Skip
from ringsnap.plugins.types import SnapshotRef, Volume, VolumeSnapshot

BACKUP_STATES: dict[BackupState, pb.BackupState.ValueType] = {
    BackupState.RUNNING: pb.BACKUP_STATE_RUNNING,
    BackupState.COMPLETE: pb.BACKUP_STATE_COMPLETE,
    BackupState.FAILED: pb.BACKUP_STATE_FAILED,
    BackupState.PARTIAL: pb.BACKUP_STATE_PARTIAL,
}
QUIESCE_MODES: dict[QuiesceMode, pb.QuiesceMode.ValueType] = {
    QuiesceMode.FREEZE: pb.QUIESCE_MODE_FREEZE,
    QuiesceMode.FLUSH_ONLY: pb.QUIESCE_MODE_FLUSH_ONLY,
    QuiesceMode.NONE: pb.QUIESCE_MODE_NONE,
}
VERIFICATIONS: dict[Verification, pb.VerificationState.ValueType] = {
    Verification.UNVERIFIED: pb.VERIFICATION_STATE_UNVERIFIED,
    Verification.PROVEN: pb.VERIFICATION_STATE_PROVEN,
    Verification.FAILED: pb.VERIFICATION_STATE_FAILED,
}
ROLES: dict[VolumeRole, types_pb2.FilesystemRole.ValueType] = {
    VolumeRole.DATA: types_pb2.FILESYSTEM_ROLE_DATA,
    VolumeRole.COMMITLOG: types_pb2.FILESYSTEM_ROLE_COMMITLOG,
    VolumeRole.DATA_AND_COMMITLOG: types_pb2.FILESYSTEM_ROLE_DATA_AND_COMMITLOG,
}
OPERATION_STATES: dict[OperationState, types_pb2.OperationState.ValueType] = {
    OperationState.PENDING: types_pb2.OPERATION_STATE_PENDING,
    OperationState.RUNNING: types_pb2.OPERATION_STATE_RUNNING,
    OperationState.SUCCEEDED: types_pb2.OPERATION_STATE_SUCCEEDED,
    OperationState.FAILED: types_pb2.OPERATION_STATE_FAILED,
    OperationState.CANCELLED: types_pb2.OPERATION_STATE_CANCELLED,
}
OPERATION_KINDS: dict[str, types_pb2.OperationKind.ValueType] = {
    OperationKind.BACKUP.value: types_pb2.OPERATION_KIND_BACKUP,
    OperationKind.RESTORE.value: types_pb2.OPERATION_KIND_RESTORE,
    OperationKind.DELETE.value: types_pb2.OPERATION_KIND_DELETE,
    OperationKind.DRILL.value: types_pb2.OPERATION_KIND_DRILL,
    OperationKind.RETENTION.value: types_pb2.OPERATION_KIND_RETENTION,
}


def timestamp(moment: datetime) -> timestamp_pb2.Timestamp:
    message = timestamp_pb2.Timestamp()
    message.FromDatetime(moment.astimezone(UTC))
    return message


def duration(seconds: float) -> duration_pb2.Duration:
    message = duration_pb2.Duration()
    message.FromNanoseconds(round(seconds * 1e9))
    return message


def volume(value: Volume, role: VolumeRole | None = None) -> types_pb2.Volume:
    return types_pb2.Volume(
        name=value.name,
        id=value.id,
        size_bytes=value.size_bytes,
        wwn=value.wwn,
        role=ROLES[role] if role is not None else types_pb2.FILESYSTEM_ROLE_UNSPECIFIED,
    )


def node_volume(value: NodeVolume) -> types_pb2.Volume:
    return types_pb2.Volume(
        array=value.array,
        name=value.volume,
        id=value.volume_id,
        size_bytes=value.size_bytes,
        wwn=value.wwn,
        role=ROLES[value.role],
    )


def snapshot_ref(ref: SnapshotRef) -> types_pb2.SnapshotRef:
    def member(m: VolumeSnapshot) -> types_pb2.VolumeSnapshot:
        message = volume(m.volume)
        message.array = ref.array
        return types_pb2.VolumeSnapshot(
            volume=message, snapshot_id=m.snapshot_id, snapshot_name=m.snapshot_name
        )

    return types_pb2.SnapshotRef(
        array=ref.array,
        driver=ref.driver,
        group=ref.group,
        snapshot_id=ref.snapshot_id,
        snapshot_name=ref.snapshot_name,
        created_at=timestamp(ref.created_at),
        members=[member(m) for m in ref.members],
        attributes=dict(ref.attributes),
    )


def backup_node(node: BackupNode) -> pb.BackupNode:
    return pb.BackupNode(
        name=node.name,
        host_id=node.host_id,
        volumes=[node_volume(v) for v in node.volumes],
        sstable_count=node.sstable_count,
        bytes=node.bytes,
        canary_id=node.canary_id,
        excluded_reason=node.excluded_reason,
    )


def timings(values: Iterable[PhaseTiming]) -> list[types_pb2.PhaseTiming]:
    return [types_pb2.PhaseTiming(phase=t.phase, duration=duration(t.seconds)) for t in values]


def freeze_window(window: FreezeWindow) -> pb.FreezeWindow:
    return pb.FreezeWindow(
        total=duration(window.total),
        slowest_freeze=duration(window.slowest_freeze),
        array_call=duration(window.array_call),
        slowest_thaw=duration(window.slowest_thaw),
        overhead=duration(window.overhead),
    )


def backup(value: Backup, *, full: bool = True) -> pb.Backup:
    """The backup; `full=False` (BASIC view) leaves out nodes, snapshots and timings."""
    message = pb.Backup(
        backup_id=value.id,
        cluster=value.cluster,
        state=BACKUP_STATES[value.state],
        quiesce_mode=QUIESCE_MODES[value.quiesce_mode],
        trigger=value.trigger,
        policy=value.policy,
        started_at=timestamp(value.started_at),
        error=value.error,
        verification=VERIFICATIONS[value.verification],
        verification_detail=value.verification_detail,
        verified_by=value.verified_by,
        lost_reason=value.lost_reason,
        node_count=len(value.nodes),
        excluded_node_count=sum(1 for n in value.nodes if not n.included),
        snapshot_count=len(value.snapshots),
        warnings=value.warnings,
    )
    if value.finished_at is not None:
        message.finished_at.CopyFrom(timestamp(value.finished_at))
    if value.verified_at is not None:
        message.verified_at.CopyFrom(timestamp(value.verified_at))
    if value.lost_at is not None:
        message.lost_at.CopyFrom(timestamp(value.lost_at))
    if value.freeze_window is not None:
        message.freeze_window.CopyFrom(duration(value.freeze_window.total))
        message.freeze.CopyFrom(freeze_window(value.freeze_window))
    if full:
        message.nodes.extend(backup_node(n) for n in value.nodes)
        message.snapshots.extend(snapshot_ref(r) for r in value.snapshots)
        message.timings.extend(timings(value.timings))
    return message


def operation(snapshot: OperationSnapshot, error_reason: str = "") -> types_pb2.Operation:
    message = types_pb2.Operation(
        operation_id=snapshot.operation_id,
        kind=OPERATION_KINDS.get(snapshot.kind, types_pb2.OPERATION_KIND_UNSPECIFIED),
        state=OPERATION_STATES[snapshot.state],
        phase=snapshot.phase,
        message=snapshot.message,
        started_at=timestamp(snapshot.started_at),
        backup_id=snapshot.backup_id,
        timings=[
            types_pb2.PhaseTiming(phase=phase, duration=duration(seconds))
            for phase, seconds in snapshot.timings
        ],
        errors=list(snapshot.errors),
        error_reason=error_reason if snapshot.state is OperationState.FAILED else "",
    )
    if snapshot.finished_at is not None:
        message.finished_at.CopyFrom(timestamp(snapshot.finished_at))
    return message


def retention_plan(plan: RetentionPlan, *, applied: bool) -> pb.PlanRetentionResponse:
    return pb.PlanRetentionResponse(
        decisions=[
            pb.RetentionDecision(
                backup_id=d.backup.id,
                started_at=timestamp(d.backup.started_at),
                state=BACKUP_STATES[d.backup.state],
                keep=d.keep,
                reason=d.reason,
            )
            for d in plan.decisions
        ],
        applied=applied,
    )


def _running(message: pb.ClusterStatus, running: RunningBackup) -> None:
    message.running_backup_id = running.backup_id
    message.running_trigger = running.trigger
    message.running_operation_id = running.operation_id
    if running.since is not None:
        message.running_since.CopyFrom(timestamp(running.since))


def cluster_status(value: ClusterStatus) -> pb.ClusterStatus:
    message = pb.ClusterStatus(cluster=value.cluster)
    if value.last_backup is not None:
        message.last_backup.CopyFrom(backup(value.last_backup, full=False))
    if value.last_success_at is not None:
        message.last_successful_backup_at.CopyFrom(timestamp(value.last_success_at))
    if value.running is not None:
        _running(message, value.running)
    for run in value.next_runs:
        scheduled = pb.ScheduledRun(
            schedule=run.schedule, cron=run.cron, timezone=run.timezone, policy=run.policy
        )
        if run.next_run_at is not None:
            scheduled.next_run_at.CopyFrom(timestamp(run.next_run_at))
        message.next_runs.append(scheduled)
    return message


def skip(value: Skip) -> pb.SkippedBackup:
    return pb.SkippedBackup(
        cluster=value.request.cluster,
        trigger=value.request.trigger,
        kind=value.kind,
        reason=value.reason,
        at=timestamp(value.at),
    )


def status(value: CoordinatorStatus) -> pb.Status:
    return pb.Status(
        clusters=[cluster_status(c) for c in value.clusters],
        pending_cleanups=value.pending_cleanups,
        recent_skips=[skip(s) for s in value.recent_skips],
        version=__version__,
    )
