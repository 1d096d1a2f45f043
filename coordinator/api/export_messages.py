"""Export records and purges as the coordinator API's messages."""

from __future__ import annotations

from ringsnap.api.v1 import coordinator_pb2 as pb
from ringsnap.coordinator.export.model import ExportRecord
from ringsnap.coordinator.export.retention import ClusterPurge
from ringsnap.wire import timestamp


def export_message(record: ExportRecord) -> pb.Export:
    message = pb.Export(
        backup_id=record.backup_id,
        cluster=record.cluster,
        state=record.state.value,
        destination=record.destination,
        error=record.error,
        warnings=list(record.warnings),
        mirrored=record.mirrored,
        nodes=[
            pb.ExportNode(
                name=n.name,
                step=n.step.value,
                exported=n.exported,
                components=n.components,
                bytes_total=n.bytes_total,
                files_uploaded=n.files_uploaded,
                bytes_uploaded=n.bytes_uploaded,
                files_skipped=n.files_skipped,
                bytes_skipped=n.bytes_skipped,
                commitlog_segments=n.commitlog_segments,
                commitlog_bytes=n.commitlog_bytes,
                commitlog_note=n.commitlog_note,
                error=n.error,
                clones_left=[f"{c.array}:{c.clone}" for c in n.clones_left],
            )
            for n in record.nodes
        ],
    )
    message.started_at.CopyFrom(timestamp(record.started_at))
    if record.finished_at is not None:
        message.finished_at.CopyFrom(timestamp(record.finished_at))
    return message


def purge_min_age(request: pb.PurgeExportsRequest) -> float | None:
    """The minimum age the request asks for; None when it leaves it to the default."""
    return request.min_age_seconds if request.HasField("min_age_seconds") else None


def purge_response(result: ClusterPurge, operation_id: str = "") -> pb.PurgeExportsResponse:
    c = result.components
    return pb.PurgeExportsResponse(
        dry_run=c.dry_run,
        copies_removed=result.copies_removed,
        copy_objects_deleted=result.copy_objects_deleted,
        copies_kept=result.copies_kept,
        listed=c.listed,
        referenced=c.referenced,
        deleted=c.deleted,
        bytes_deleted=c.bytes_deleted,
        delete_requests=c.delete_requests,
        too_young=c.too_young,
        foreign_keys=c.foreign_keys,
        seconds=c.seconds,
        operation_id=operation_id,
        key_objects_deleted=result.key_objects_deleted,
    )
