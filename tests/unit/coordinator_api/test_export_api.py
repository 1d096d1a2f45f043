"""Exports through the coordinator's API: GetExport and ListExports give the records (per node:
step, uploaded and skipped, errors, clones left), `list`/`show` say which backups have a copy,
and StartExport refuses what cannot be exported before anything is made.

The proof of an export itself is tests/integration/test_s3_copy.py (real ring, array, S3)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc

from ringsnap.api.v1 import coordinator_pb2 as pb
from ringsnap.coordinator.api.export_messages import export_message
from ringsnap.coordinator.cli.export_remote import record_of
from ringsnap.coordinator.export.model import (
    ExportClone,
    ExportRecord,
    ExportState,
    NodeExport,
    NodeStep,
)
from tests.support.coordinator_rpc import reason_of, rpc_error

from .conftest import Harness

BACKUP = "rs-20261124-030000-abcd"
STARTED = datetime.now(UTC) - timedelta(hours=1)


def _record() -> ExportRecord:
    return ExportRecord(
        backup_id=BACKUP,
        cluster="prod",
        started_at=STARTED,
        finished_at=STARTED + timedelta(minutes=2),
        state=ExportState.FAILED,
        destination="s3://copies/prod/",
        error="node n2: unmount: target is busy",
        nodes=(
            NodeExport(
                "n1",
                step=NodeStep.DONE,
                exported=True,
                components=10,
                bytes_total=1000,
                files_uploaded=4,
                bytes_uploaded=400,
                commitlog_segments=2,
            ),
            NodeExport(
                "n2",
                step=NodeStep.EXPORT,
                exported=True,
                error="unmount: target is busy",
                clones=(ExportClone("a1", "n2-data", "data", "/data", "n2-data_rsx", "c9", 7),),
            ),
        ),
    )


def test_export_records_and_the_copy_in_list_and_show(harness: Harness) -> None:
    harness.seed_backup(BACKUP, STARTED)
    harness.seed_backup("rs-20261124-040000-abcd", STARTED + timedelta(hours=1))
    stub = harness.stub()
    assert stub.GetBackup(pb.GetBackupRequest(backup_id=BACKUP), timeout=10).off_array_copy == ""
    record = _record()
    harness.catalog.save_export(record)
    got = stub.GetExport(pb.GetExportRequest(backup_id=BACKUP), timeout=10)
    assert (got.state, got.destination, got.error) == ("failed", record.destination, record.error)
    n1, n2 = got.nodes
    assert (n1.files_uploaded, n1.files_skipped, n1.bytes_skipped) == (4, 6, 600)
    assert n2.clones_left == ["a1:n2-data_rsx"] and n2.step == "export"
    listed = stub.ListExports(pb.ListExportsRequest(cluster="prod"), timeout=10)
    assert [e.backup_id for e in listed.exports] == [BACKUP]
    # A failed export is no copy; a succeeded one is, in list and show.
    assert stub.GetBackup(pb.GetBackupRequest(backup_id=BACKUP), timeout=10).off_array_copy == ""
    harness.catalog.save_export(
        ExportRecord(
            backup_id=BACKUP,
            cluster="prod",
            started_at=STARTED,
            nodes=record.nodes,
            state=ExportState.SUCCEEDED,
            destination=record.destination,
        )
    )
    shown = stub.GetBackup(pb.GetBackupRequest(backup_id=BACKUP), timeout=10)
    assert shown.off_array_copy == "s3://copies/prod/"
    page = stub.ListBackups(pb.ListBackupsRequest(cluster="prod"), timeout=10)
    assert {b.backup_id: b.off_array_copy for b in page.backups} == {
        BACKUP: "s3://copies/prod/",
        "rs-20261124-040000-abcd": "",
    }


def test_show_says_a_copy_is_encrypted_and_for_whom(harness: Harness) -> None:
    """`ringsnap show` (GetBackup's off_array_copy): an encrypted copy names its recipients as
    the nodes' exports reported them; a node exported in plain text is named too."""
    harness.seed_backup(BACKUP, STARTED)
    stub = harness.stub()
    age = "age:age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p"
    nodes = tuple(
        NodeExport(name, step=NodeStep.DONE, exported=True, recipients=(age,))
        for name in ("n1", "n2")
    )
    record = ExportRecord(
        backup_id=BACKUP,
        cluster="prod",
        started_at=STARTED,
        nodes=nodes,
        state=ExportState.SUCCEEDED,
        destination="s3://copies/prod/",
    )
    harness.catalog.save_export(record)

    shown = stub.GetBackup(pb.GetBackupRequest(backup_id=BACKUP), timeout=10).off_array_copy

    assert shown == f"s3://copies/prod/ (encrypted on the nodes for {age}, at export)"
    harness.catalog.save_export(replace(record, nodes=(nodes[0], replace(nodes[1], recipients=()))))
    mixed = stub.GetBackup(pb.GetBackupRequest(backup_id=BACKUP), timeout=10).off_array_copy
    assert mixed.endswith(f"for {age}, at export; in plain text: n2)"), mixed


def test_the_agents_export_result_names_the_recipients_it_encrypted_for(tmp_path: Path) -> None:
    from ringsnap.agent.s3.commitlog import CommitlogExport
    from ringsnap.agent.s3.export import ExportResult
    from ringsnap.agent.s3.rpc import copy_recipients, result_message
    from ringsnap.agent.s3.settings import S3Settings
    from ringsnap.coordinator.agents.export import node_upload

    recipient = "age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p"
    name_key = tmp_path / "name.key"
    name_key.write_text("ab" * 32)
    encrypted = S3Settings(
        bucket="copies",
        encryption={"recipients": [recipient], "name_key_file": str(name_key)},  # type: ignore[arg-type]
    )
    assert copy_recipients(encrypted) == [f"age:{recipient}"]
    assert copy_recipients(S3Settings(bucket="copies")) == []
    sstables = ExportResult("b1", "n1", "k", 1, 2, 1, 2, 0, 1, 1.0)
    message = result_message(
        sstables, CommitlogExport("c", 0, 0, 0, 0), "", 1.0, copy_recipients(encrypted)
    )
    assert node_upload(message.result).recipients == (f"age:{recipient}",)


def test_start_export_refuses_before_anything_is_made(harness: Harness) -> None:
    stub = harness.stub()
    missing = rpc_error(stub.GetExport, pb.GetExportRequest(backup_id=BACKUP))
    assert missing.code() is grpc.StatusCode.NOT_FOUND and reason_of(missing) == "EXPORT_NOT_FOUND"
    harness.seed_backup(BACKUP, STARTED)
    unknown = rpc_error(stub.StartExport, pb.StartExportRequest(backup_id=BACKUP, nodes=["n9"]))
    assert unknown.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert reason_of(unknown) == "EXPORT_REFUSED" and "n9" in (unknown.details() or "")
    gone = rpc_error(stub.StartExport, pb.StartExportRequest(backup_id="rs-20990101-000000-0000"))
    assert gone.code() is grpc.StatusCode.NOT_FOUND


def test_a_record_survives_the_api_for_the_cli() -> None:
    record = _record()
    back = record_of(export_message(record))
    assert back.nodes[0] == record.nodes[0]
    assert (back.state, back.error, back.finished_at) == (
        record.state,
        record.error,
        record.finished_at,
    )
    assert [(c.array, c.clone) for c in back.nodes[1].clones_left] == [("a1", "n2-data_rsx")]
