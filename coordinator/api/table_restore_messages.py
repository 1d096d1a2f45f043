"""A table restore's record, plan and request as the coordinator API's messages, and back (the
daemon's API and `ringsnap restore --keyspace` through it)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ringsnap.api.v1 import coordinator_pb2 as pb
from ringsnap.coordinator.restore.s3_keys import restore_keys_of
from ringsnap.coordinator.table_restore.daemon import TableRestoreStart
from ringsnap.coordinator.table_restore.model import (
    TABLE_RESTORE_ID,
    CloneRecord,
    NodeProgress,
    NodeTables,
    Step,
    TableRestoreRecord,
    TableRestoreRequest,
    TableRestoreState,
    TableTarget,
)
from ringsnap.errors import ValidationError
from ringsnap.names import keyspace_name, snapshot_tag, table_name
from ringsnap.wire import moment, timestamp


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
        source=pb.TABLE_RESTORE_SOURCE_S3 if record.from_s3 else pb.TABLE_RESTORE_SOURCE_ARRAY,
    )
    if record.finished_at is not None:
        message.finished_at.CopyFrom(timestamp(record.finished_at))
    return message


def table_restore_id_of(value: str, field: str = "table_restore_id") -> str:
    if not TABLE_RESTORE_ID.fullmatch(value):
        raise ValidationError(f"{field} {value!r} is not tr-YYYYMMDD-HHMMSS-xxxx")
    return value


def request_of(
    message: pb.PlanTableRestoreRequest | pb.StartTableRestoreRequest, requested_by: str
) -> TableRestoreRequest:
    """A new run's request, every name validated (they become CQL and paths on the nodes)."""
    if not message.backup_id or not message.keyspace:
        raise ValidationError("backup_id and keyspace are required")
    if bool(message.as_keyspace) != bool(message.as_table):
        raise ValidationError("as_keyspace and as_table go together (`--as K.T2`)")
    if message.source not in (pb.TABLE_RESTORE_SOURCE_ARRAY, pb.TABLE_RESTORE_SOURCE_S3):
        raise ValidationError(
            f"source {message.source} is not TABLE_RESTORE_SOURCE_ARRAY or TABLE_RESTORE_SOURCE_S3"
        )
    return TableRestoreRequest(
        backup_id=snapshot_tag(message.backup_id, what="backup_id"),
        keyspace=keyspace_name(message.keyspace),
        tables=tuple(table_name(t) for t in message.tables),
        target=(
            (keyspace_name(message.as_keyspace), table_name(message.as_table))
            if message.as_keyspace
            else None
        ),
        requested_by=requested_by,
        from_s3=message.source == pb.TABLE_RESTORE_SOURCE_S3,
        keys=restore_keys_of(message.age_keys),
    )


def request_fields(request: TableRestoreRequest) -> dict[str, Any]:
    """The request's fields of PlanTableRestoreRequest and StartTableRestoreRequest."""
    keyspace, table = request.target or ("", "")
    return {
        "backup_id": request.backup_id,
        "keyspace": request.keyspace,
        "tables": list(request.tables),
        "as_keyspace": keyspace,
        "as_table": table,
        "source": pb.TABLE_RESTORE_SOURCE_S3 if request.from_s3 else pb.TABLE_RESTORE_SOURCE_ARRAY,
        "age_keys": list(request.keys.lines),
    }


def plan_message(
    record: TableRestoreRecord, refusals: Sequence[str], document: Mapping[str, Any]
) -> pb.TableRestorePlan:
    return pb.TableRestorePlan(
        table_restore=table_restore_message(record),
        refusals=list(refusals),
        document_json=json.dumps(document),
    )


def plan_document_of(message: pb.TableRestorePlan) -> dict[str, Any]:
    """The plan's document as the CLI renders it (`table_restore.cli.print_plan`)."""
    try:
        document = json.loads(message.document_json)
    except ValueError as exc:
        raise ValidationError(f"the coordinator's plan document is not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise ValidationError("the coordinator's plan document is not a JSON object")
    document["refusals"] = list(message.refusals)
    return document


def record_of(message: pb.TableRestore) -> TableRestoreRecord:
    """The record as the API gives it: each node's SSTables summed over the restored tables (one
    `NodeTables` entry naming them all), clones as those left."""
    tables = ", ".join(t.table for t in message.targets)
    clones = []
    for left in message.clones_left:
        array, _, clone = left.partition(":")
        clones.append(CloneRecord(node="", array=array, volume="", clone=clone))
    return TableRestoreRecord(
        id=message.table_restore_id,
        cluster=message.cluster,
        backup_id=message.backup_id,
        requested_by=message.requested_by,
        started_at=moment(message.started_at),
        finished_at=moment(message.finished_at) if message.HasField("finished_at") else None,
        state=TableRestoreState(message.state),
        step=Step(message.step),
        error=message.error,
        targets=tuple(
            TableTarget(
                source_keyspace=t.source_keyspace,
                source_table=t.source_table,
                keyspace=t.keyspace,
                table=t.table,
                source_id=t.source_table_id,
                action=t.action,
            )
            for t in message.targets
        ),
        nodes=tuple(
            NodeProgress(
                name=n.name,
                step=Step(n.step),
                staging_directory=n.staging_directory,
                tables=(
                    NodeTables(
                        table=tables,
                        sstables=n.sstables,
                        bytes=n.bytes,
                        staged_sstables=n.staged_sstables,
                        imported_sstables=n.imported_sstables,
                    ),
                ),
            )
            for n in message.nodes
        ),
        clones=tuple(clones),
        verification=tuple(message.verification),
        warnings=tuple(message.warnings),
        from_s3=message.source == pb.TABLE_RESTORE_SOURCE_S3,
    )


def start_of(message: pb.StartTableRestoreRequest, requested_by: str) -> TableRestoreStart:
    """A StartTableRestore as the daemon's runner takes it: exactly one of a new run, resume_id,
    abort_id; every id and name validated."""
    chosen = [bool(message.backup_id), bool(message.resume_id), bool(message.abort_id)]
    if sum(chosen) != 1:
        raise ValidationError("give backup_id (a new run), resume_id or abort_id: exactly one")
    confirm = message.confirm_cluster
    if len(confirm) > 200 or not confirm.isprintable():
        raise ValidationError("confirm_cluster must be printable and at most 200 characters")
    if message.resume_id:
        return TableRestoreStart(
            resume_id=table_restore_id_of(message.resume_id, "resume_id"),
            confirm_cluster=confirm,
            keys=restore_keys_of(message.age_keys),
        )
    if message.abort_id:
        return TableRestoreStart(
            abort_id=table_restore_id_of(message.abort_id, "abort_id"), confirm_cluster=confirm
        )
    return TableRestoreStart(
        request=request_of(message, requested_by),
        restore_id=(
            table_restore_id_of(message.table_restore_id) if message.table_restore_id else ""
        ),
        confirm_cluster=confirm,
    )
