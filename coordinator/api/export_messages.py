"""Export records as the coordinator API's messages."""

from __future__ import annotations

from ringsnap.api.v1 import coordinator_pb2 as pb
from ringsnap.coordinator.export.model import ExportRecord
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
