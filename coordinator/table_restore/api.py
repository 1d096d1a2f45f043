"""A table restore's record as the coordinator API's `TableRestore` message."""

from __future__ import annotations

from ringsnap.api.v1 import coordinator_pb2 as pb
from ringsnap.coordinator.table_restore.model import TableRestoreRecord
from ringsnap.wire import timestamp


def table_restore_message(record: TableRestoreRecord) -> pb.TableRestore:
    message = pb.TableRestore(
        table_restore_id=record.id,
        cluster=record.cluster,
        backup_id=record.backup_id,
        state=record.state.value,
        step=record.step.value,
        next_step=record.next_step.value,
        next_action=record.next_action,
        error=record.error,
        targets=[
            pb.TableRestoreTarget(
                source_keyspace=t.source_keyspace,
                source_table=t.source_table,
                keyspace=t.keyspace,
                table=t.table,
                source_table_id=t.source_id,
                action=t.action,
            )
            for t in record.targets
        ],
        nodes=[
            pb.TableRestoreNode(
                name=n.name,
                step=n.step.value,
                staging_directory=n.staging_directory,
                sstables=sum(t.sstables for t in n.tables),
                bytes=sum(t.bytes for t in n.tables),
                staged_sstables=sum(t.staged_sstables for t in n.tables),
                imported_sstables=sum(t.imported_sstables for t in n.tables),
            )
            for n in record.nodes
        ],
        verification=list(record.verification),
        warnings=list(record.warnings),
        clones_left=[f"{c.array}:{c.clone}" for c in record.clones if c.clone and not c.deleted],
        requested_by=record.requested_by,
        started_at=timestamp(record.started_at),
    )
    if record.finished_at is not None:
        message.finished_at.CopyFrom(timestamp(record.finished_at))
    return message
