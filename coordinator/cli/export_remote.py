"""`ringsnap export BACKUP` through the coordinator daemon, when the daemon holds the catalog:
StartExport, the operation followed with one progress line per change, then GetExport. Ctrl-C
stops following; the export goes on in the daemon."""

from __future__ import annotations

from collections.abc import Sequence

from ringsnap.api.v1 import coordinator_pb2 as pb
from ringsnap.coordinator.cli.client import LONG_CALL_TIMEOUT, Coordinator, Target
from ringsnap.coordinator.cli.console import ProgressPrinter
from ringsnap.coordinator.cli.operation import follow, raise_refusal_or_error, say_the_daemon_runs
from ringsnap.coordinator.export.model import (
    ExportClone,
    ExportFailed,
    ExportRecord,
    ExportRefused,
    ExportState,
    NodeExport,
    NodeStep,
)
from ringsnap.wire import moment


def record_of(message: pb.Export) -> ExportRecord:
    """The API's export record back as the CLI's (clones left by their names only)."""
    return ExportRecord(
        backup_id=message.backup_id,
        cluster=message.cluster,
        started_at=moment(message.started_at),
        finished_at=moment(message.finished_at) if message.HasField("finished_at") else None,
        state=ExportState(message.state),
        destination=message.destination,
        error=message.error,
        warnings=tuple(message.warnings),
        mirrored=message.mirrored,
        nodes=tuple(
            NodeExport(
                name=n.name,
                step=NodeStep(n.step),
                exported=n.exported,
                components=n.components,
                bytes_total=n.bytes_total,
                files_uploaded=n.files_uploaded,
                bytes_uploaded=n.bytes_uploaded,
                commitlog_segments=n.commitlog_segments,
                commitlog_bytes=n.commitlog_bytes,
                commitlog_note=n.commitlog_note,
                error=n.error,
                clones=tuple(
                    ExportClone(array=a, volume="", role="", clone=c)
                    for a, _, c in (left.partition(":") for left in n.clones_left)
                ),
            )
            for n in message.nodes
        ),
    )


def export(
    target: Target, backup_id: str, nodes: Sequence[str], parallel: int, *, as_json: bool
) -> ExportRecord:
    say_the_daemon_runs(target, "the export", as_json=as_json)
    with Coordinator(target) as client:
        operation = client.call(
            client.stub.StartExport,
            pb.StartExportRequest(backup_id=backup_id, nodes=list(nodes), parallel_nodes=parallel),
            LONG_CALL_TIMEOUT,
        )
        final = follow(
            client,
            operation,
            ProgressPrinter(as_json),
            what=f"the export of {backup_id}",
            hint=f"its record: ringsnap export {backup_id} once it ended, or GetExport",
            own_phases=frozenset({"", "done"}),
        )
        raise_refusal_or_error(
            final,
            refused_reason="EXPORT_REFUSED",
            refused=ExportRefused,
            failed_reason="EXPORT_FAILED",
        )
        record = record_of(
            client.call(client.stub.GetExport, pb.GetExportRequest(backup_id=backup_id))
        )
    if record.state is not ExportState.SUCCEEDED:
        raise ExportFailed(f"export of backup {backup_id}: {record.error}", record)
    return record
