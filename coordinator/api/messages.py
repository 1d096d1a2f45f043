"""Domain values of the coordinator as v1 API messages.

Mostly one direction: the server answers with these, and the CLI reads backups and operations as
they are. Restores go both ways (`restore` and `restore_record`), so that `ringsnap restore` renders
the `RestoreRecord` the coordinator kept (the daemon's, or the one the CLI hosts); a restore plan
goes to the API only (`restore_plan`): its agents and array handles do not cross the wire.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TypeVar

from ringsnap import package_version
from ringsnap.api.v1 import coordinator_pb2 as pb
from ringsnap.api.v1 import types_pb2
from ringsnap.coordinator.api.control import (
    ClusterStatus,
    CoordinatorStatus,
    LeftResource,
    RunningBackup,
)
from ringsnap.coordinator.model import (
    Backup,
    BackupNode,
    BackupState,
    FreezeWindow,
    NodeVerdict,
    NodeVolume,
    OperationKind,
    OperationState,
    PhaseTiming,
    QuiesceMode,
    RestoreMode,
    RestoreNode,
    RestoreRecord,
    RestoreState,
    RestoreStep,
    RestoreVolume,
    Verification,
    VolumeRole,
)
from ringsnap.coordinator.operations import OperationSnapshot
from ringsnap.coordinator.restore.plan import RestorePlan
from ringsnap.coordinator.retention import RetentionPlan
from ringsnap.coordinator.scheduler import Skip
from ringsnap.plugins.types import SnapshotRef, Volume, VolumeSnapshot
from ringsnap.wire import duration, moment, seconds, timestamp

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
RESTORE_MODES: dict[RestoreMode, pb.RestoreMode.ValueType] = {
    RestoreMode.REVERT: pb.RESTORE_MODE_REVERT,
    RestoreMode.CLONE: pb.RESTORE_MODE_CLONE,
    RestoreMode.S3: pb.RESTORE_MODE_S3,
}
RESTORE_STATES: dict[RestoreState, pb.RestoreState.ValueType] = {
    RestoreState.RUNNING: pb.RESTORE_STATE_RUNNING,
    RestoreState.PROVEN: pb.RESTORE_STATE_PROVEN,
    RestoreState.NOT_PROVEN: pb.RESTORE_STATE_NOT_PROVEN,
    RestoreState.FAILED: pb.RESTORE_STATE_FAILED,
    RestoreState.INTERRUPTED: pb.RESTORE_STATE_INTERRUPTED,
    RestoreState.ABORTED: pb.RESTORE_STATE_ABORTED,
}
RESTORE_STEPS: dict[RestoreStep, pb.RestoreStep.ValueType] = {
    RestoreStep.PLANNED: pb.RESTORE_STEP_PLANNED,
    RestoreStep.DOWNLOADED: pb.RESTORE_STEP_DOWNLOADED,
    RestoreStep.CANARY: pb.RESTORE_STEP_PRE_RESTORE_CANARY,
    RestoreStep.STOPPED: pb.RESTORE_STEP_STOPPED,
    RestoreStep.RELEASED: pb.RESTORE_STEP_RELEASED,
    RestoreStep.RESTORED: pb.RESTORE_STEP_RESTORED,
    RestoreStep.ATTACHED: pb.RESTORE_STEP_ATTACHED,
    RestoreStep.CLEARED: pb.RESTORE_STEP_CLEARED,
    RestoreStep.CHECKED: pb.RESTORE_STEP_CHECKED,
    RestoreStep.STARTED: pb.RESTORE_STEP_STARTED,
    RestoreStep.VERIFIED: pb.RESTORE_STEP_VERIFIED,
}
NODE_VERDICTS: dict[NodeVerdict, pb.NodeVerdict.ValueType] = {
    NodeVerdict.PENDING: pb.NODE_VERDICT_PENDING,
    NodeVerdict.PROVEN: pb.NODE_VERDICT_PROVEN,
    NodeVerdict.NOT_PROVEN: pb.NODE_VERDICT_NOT_PROVEN,
}
OPERATION_KINDS: dict[str, types_pb2.OperationKind.ValueType] = {
    OperationKind.BACKUP.value: types_pb2.OPERATION_KIND_BACKUP,
    OperationKind.RESTORE.value: types_pb2.OPERATION_KIND_RESTORE,
    OperationKind.DELETE.value: types_pb2.OPERATION_KIND_DELETE,
    OperationKind.DRILL.value: types_pb2.OPERATION_KIND_DRILL,
    OperationKind.RETENTION.value: types_pb2.OPERATION_KIND_RETENTION,
    OperationKind.EXPORT.value: types_pb2.OPERATION_KIND_EXPORT,
}


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
        node_local_nodes=sorted(
            {r.attribute("node_local") for r in value.snapshots if r.attribute("node_local")}
        ),
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
    message.running_kind = running.kind.value
    message.running_run_id = running.run_id
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


def left_resource(value: LeftResource) -> pb.LeftResource:
    entry, resource = value.entry, value.entry.resource
    return pb.LeftResource(
        type=resource.type.value,
        cluster=resource.cluster,
        run_kind=resource.run_kind,
        run_id=resource.run_id,
        description=resource.describe(),
        retry=resource.retry_plan(),
        since=timestamp(entry.created_at),
        attempts=entry.attempts,
        last_error=entry.last_error,
        held_by=value.held_by,
    )


def status(value: CoordinatorStatus) -> pb.Status:
    return pb.Status(
        clusters=[cluster_status(c) for c in value.clusters],
        pending_cleanups=value.pending_cleanups,
        recent_skips=[skip(s) for s in value.recent_skips],
        version=package_version(),
        left_resources=[left_resource(r) for r in value.left_resources],
    )


# -- restores --------------------------------------------------------------------------------------

_Domain = TypeVar("_Domain")
_Wire = TypeVar("_Wire", bound=int)


def domain_value(mapping: Mapping[_Domain, _Wire], value: int, field: str) -> _Domain:
    """The domain value of an enum number (`mapping` read backwards); ValueError names `field`."""
    for domain, wire in mapping.items():
        if wire == value:
            return domain
    raise ValueError(f"{field}: unknown or unspecified value {value}")


def restore_volume(value: RestoreVolume) -> pb.RestoreVolume:
    return pb.RestoreVolume(
        array=value.array,
        volume=value.volume,
        role=ROLES[value.role],
        mount_point=value.mount_point,
        attached_volume=value.attached_volume,
    )


def restore_volume_of(message: pb.RestoreVolume) -> RestoreVolume:
    return RestoreVolume(
        array=message.array,
        volume=message.volume,
        role=domain_value(ROLES, message.role, "volume role"),
        mount_point=message.mount_point,
        attached_volume=message.attached_volume,
    )


def restore_plan(plan: RestorePlan) -> pb.RestorePlan:
    """What the plan will do and destroy; the CLI prints it (`restore_client.plan_document`)."""
    message = pb.RestorePlan(
        restore_id=plan.restore_id,
        backup_id=plan.backup.id,
        cluster=plan.backup.cluster,
        backup_started_at=timestamp(plan.backup.started_at),
        mode=RESTORE_MODES[plan.mode],
        whole_ring=plan.whole_ring,
        nodes=[
            pb.RestorePlanNode(
                name=node.name,
                host_id=node.host_id,
                seed=node.seed,
                cassandra_running=node.running,
                volumes=[restore_volume(v) for v in node.volumes],
            )
            for node in plan.nodes
        ],
        arrays=[
            pb.RestorePlanArray(
                array=a.array, snapshot=snapshot_ref(a.ref), destroys=list(a.destroys)
            )
            for a in plan.arrays
        ],
        destroyed=list(plan.destroyed),
        lost_backups=list(plan.lost_backups),
        warnings=list(plan.warnings),
        refusals=list(plan.refusals),
    )
    if plan.expected_seconds is not None:
        message.expected_duration.CopyFrom(duration(plan.expected_seconds))
    return message


def _timings_of(values: Iterable[types_pb2.PhaseTiming]) -> tuple[tuple[str, float], ...]:
    return tuple((t.phase, seconds(t.duration)) for t in values)


def restore_node(node: RestoreNode) -> pb.RestoreNode:
    message = pb.RestoreNode(
        name=node.name,
        host_id=node.host_id,
        volumes=[restore_volume(v) for v in node.volumes],
        was_running=node.was_running,
        backup_canary=node.backup_canary,
        pre_restore_canary=node.pre_restore_canary,
        step=RESTORE_STEPS[node.step],
        step_timings=[
            types_pb2.PhaseTiming(phase=step, duration=duration(took))
            for step, took in node.step_seconds
        ],
        verdict=NODE_VERDICTS[node.verdict],
        proof=list(node.proof),
        unproven=list(node.unproven),
        next_step=node.next_step,
    )
    if node.manifest_ok is not None:
        message.manifest_ok = node.manifest_ok
    return message


def restore_node_of(message: pb.RestoreNode) -> RestoreNode:
    return RestoreNode(
        name=message.name,
        host_id=message.host_id,
        volumes=tuple(restore_volume_of(v) for v in message.volumes),
        was_running=message.was_running,
        backup_canary=message.backup_canary,
        pre_restore_canary=message.pre_restore_canary,
        manifest_ok=message.manifest_ok if message.HasField("manifest_ok") else None,
        step=domain_value(RESTORE_STEPS, message.step, f"node {message.name}: step"),
        step_seconds=_timings_of(message.step_timings),
        verdict=domain_value(NODE_VERDICTS, message.verdict, f"node {message.name}: verdict"),
        proof=tuple(message.proof),
        unproven=tuple(message.unproven),
        next_step=message.next_step,
    )


def restore(record: RestoreRecord) -> pb.Restore:
    message = pb.Restore(
        restore_id=record.id,
        cluster=record.cluster,
        backup_id=record.backup_id,
        mode=RESTORE_MODES[record.mode],
        nodes=[restore_node(n) for n in record.nodes],
        whole_ring=record.whole_ring,
        requested_by=record.requested_by,
        started_at=timestamp(record.started_at),
        state=RESTORE_STATES[record.state],
        error=record.error,
        warnings=list(record.warnings),
        arrays_done=[pb.RestoreArrayStep(array=a, done=done) for a, done in record.arrays_done],
        clones=[
            pb.RestoreClone(array=a, original_volume=original, clone_volume=clone)
            for a, original, clone in record.clones
        ],
        timings=timings(record.timings),
    )
    if record.finished_at is not None:
        message.finished_at.CopyFrom(timestamp(record.finished_at))
    return message


def restore_record(message: pb.Restore) -> RestoreRecord:
    """The record back from the API (what `ringsnap restore` prints through the daemon)."""
    return RestoreRecord(
        id=message.restore_id,
        cluster=message.cluster,
        backup_id=message.backup_id,
        mode=domain_value(RESTORE_MODES, message.mode, "restore mode"),
        nodes=tuple(restore_node_of(n) for n in message.nodes),
        whole_ring=message.whole_ring,
        requested_by=message.requested_by,
        started_at=moment(message.started_at),
        state=domain_value(RESTORE_STATES, message.state, "restore state"),
        finished_at=moment(message.finished_at) if message.HasField("finished_at") else None,
        error=message.error,
        warnings=tuple(message.warnings),
        arrays_done=tuple((a.array, a.done) for a in message.arrays_done),
        clones=tuple((c.array, c.original_volume, c.clone_volume) for c in message.clones),
        timings=tuple(
            PhaseTiming(phase=phase, seconds=took) for phase, took in _timings_of(message.timings)
        ),
    )
