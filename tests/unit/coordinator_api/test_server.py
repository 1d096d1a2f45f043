"""The coordinator's gRPC service: translation of every RPC, the error mapping, access, shutdown.

Through a real grpc.aio server on 127.0.0.1 in front of a real `Coordinator` (workflow, scheduler,
catalog in tmp) whose agents and arrays are fakes of our ports.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ringsnap.api.v1 import coordinator_pb2 as pb
from ringsnap.api.v1 import types_pb2
from ringsnap.coordinator.api.errors import classify
from ringsnap.coordinator.api.listeners import loopback_problem
from ringsnap.coordinator.backup import BackupFailed, BackupRefused
from ringsnap.coordinator.catalog import (
    BackupNotFoundError,
    BackupStateError,
    InvalidPageTokenError,
)
from ringsnap.coordinator.model import BackupState
from ringsnap.coordinator.ports import AgentError
from ringsnap.coordinator.runs.lease import ClusterHeld, Lease, RunKind
from ringsnap.coordinator.scheduler import BackupRequest
from ringsnap.coordinator.service import UnknownClusterError, UnknownPolicyError
from ringsnap.errors import RingsnapError, ValidationError
from ringsnap.plugins.errors import DriverError
from tests.support.coordinator_rpc import pb_stub, reason_of, rpc_error, watch_to_end

from .conftest import Harness, fail_snapshots

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


# -- backups, operations ---------------------------------------------------------------------------


def test_start_backup_streams_each_phase_and_records_a_complete_backup(harness: Harness) -> None:
    stub = harness.stub()
    harness.hold_flush("n1")
    started = stub.StartBackup(
        pb.StartBackupRequest(cluster="prod", trigger="cli:alice", policy="daily"), timeout=10
    )
    assert started.kind == types_pb2.OPERATION_KIND_BACKUP
    assert started.backup_id.startswith("rs-"), "the id is known before the run starts"

    updates: list[types_pb2.Operation] = []
    stream = stub.WatchOperation(
        pb.WatchOperationRequest(operation_id=started.operation_id), timeout=30
    )
    for update in stream:  # the run waits in its flush until the watcher has seen it there
        updates.append(update)
        if update.phase == "flush":
            harness.release_flush("n1")

    final = updates[-1]
    assert final.state == types_pb2.OPERATION_STATE_SUCCEEDED
    assert final.error_reason == ""
    assert final.HasField("finished_at")
    phases = [u.phase for u in updates if u.phase]
    assert phases.index("flush") < phases.index("record")
    assert updates[0].backup_id == started.backup_id
    assert all(u.state != types_pb2.OPERATION_STATE_SUCCEEDED for u in updates[:-1])
    assert (
        stub.GetOperation(pb.GetOperationRequest(operation_id=started.operation_id), timeout=10)
        == final
    )

    backup = stub.GetBackup(pb.GetBackupRequest(backup_id=started.backup_id), timeout=10)
    assert backup.state == pb.BACKUP_STATE_COMPLETE
    assert backup.trigger == "cli:alice"
    assert backup.policy == "daily"
    assert backup.quiesce_mode == pb.QUIESCE_MODE_FREEZE
    assert [n.name for n in backup.nodes] == ["n1", "n2", "n3"]
    assert backup.node_count == 3 and backup.excluded_node_count == 0
    assert backup.nodes[0].host_id == "host-n1"
    assert backup.nodes[0].sstable_count == 1 and backup.nodes[0].bytes == 4096
    roles = {v.name: v.role for v in backup.nodes[0].volumes}
    assert roles == {
        "n1-data": types_pb2.FILESYSTEM_ROLE_DATA,
        "n1-cl": types_pb2.FILESYSTEM_ROLE_COMMITLOG,
    }
    assert backup.nodes[0].volumes[0].id == "id-n1-data"
    assert len(backup.snapshots) == 1 and backup.snapshot_count == 1
    assert len(backup.snapshots[0].members) == 6
    assert backup.snapshots[0].members[0].volume.array == "a1"
    assert backup.HasField("freeze")
    assert backup.freeze.total == backup.freeze_window
    assert backup.freeze.total.ToTimedelta() >= backup.freeze.array_call.ToTimedelta()
    assert {t.phase for t in backup.timings} >= {"plan", "flush", "freeze+snapshot+thaw"}
    assert backup.verification == pb.VERIFICATION_STATE_UNVERIFIED
    assert not any(agent.frozen for agent in harness.agents.values())


def test_start_backup_refuses_unknown_cluster_and_policy(
    harness: Harness,
) -> None:
    stub = harness.stub()
    error = rpc_error(stub.StartBackup, pb.StartBackupRequest(cluster="nope"))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert reason_of(error) == "UNKNOWN_CLUSTER"
    assert "configured: edge, prod" in (error.details() or "")

    error = rpc_error(stub.StartBackup, pb.StartBackupRequest(cluster="prod", policy="weekly"))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert reason_of(error) == "UNKNOWN_POLICY"

    error = rpc_error(stub.StartBackup, pb.StartBackupRequest(cluster=""))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT

    assert harness.catalog.latest_backup("prod") is None, "nothing was started"


def test_the_per_request_backup_settings_are_gone_and_their_numbers_reserved() -> None:
    # The quiesce mode and partial backups are a cluster's configuration; the two fields the API
    # always refused are removed, their numbers and names kept from reuse.
    described = descriptor_pb2.DescriptorProto()
    pb.StartBackupRequest.DESCRIPTOR.CopyToProto(described)
    assert {"quiesce_mode", "allow_partial"}.isdisjoint(f.name for f in described.field)
    reserved = {n for r in described.reserved_range for n in range(r.start, r.end)}
    assert {2, 3} <= reserved
    assert {"quiesce_mode", "allow_partial"} <= set(described.reserved_name)


def test_second_backup_of_a_busy_cluster_fails_as_cluster_busy(harness: Harness) -> None:
    stub = harness.stub()
    harness.hold_flush("n1")
    first = stub.StartBackup(pb.StartBackupRequest(cluster="prod", trigger="first"), timeout=10)
    harness.wait_flushing("n1")

    second = stub.StartBackup(pb.StartBackupRequest(cluster="prod", trigger="second"), timeout=10)
    final = watch_to_end(harness, second.operation_id)[-1]
    assert final.state == types_pb2.OPERATION_STATE_FAILED
    assert final.error_reason == "CLUSTER_BUSY"
    assert "already being backed up (by first" in final.message

    status = stub.GetStatus(pb.GetStatusRequest(), timeout=10)
    prod = next(c for c in status.clusters if c.cluster == "prod")
    assert prod.running_backup_id == first.backup_id
    assert prod.running_trigger == "first"
    assert prod.running_operation_id == first.operation_id
    assert prod.HasField("running_since")
    assert any(s.kind == "busy" and s.trigger == "second" for s in status.recent_skips)

    harness.release_flush("n1")
    assert watch_to_end(harness, first.operation_id)[-1].state == (
        types_pb2.OPERATION_STATE_SUCCEEDED
    )


def test_unreachable_agent_fails_the_operation_as_refused(harness: Harness) -> None:
    harness.agents["n2"].unreachable = True
    started = harness.stub().StartBackup(pb.StartBackupRequest(cluster="prod"), timeout=10)
    final = watch_to_end(harness, started.operation_id)[-1]
    assert final.state == types_pb2.OPERATION_STATE_FAILED
    assert final.error_reason == "BACKUP_REFUSED"
    assert "node n2: agent unreachable" in final.message
    assert "--allow-partial" in final.message or "partial" in final.message


def test_array_failure_fails_the_operation_and_thaws_every_node(harness: Harness) -> None:
    fail_snapshots(harness)
    started = harness.stub().StartBackup(pb.StartBackupRequest(cluster="prod"), timeout=10)
    final = watch_to_end(harness, started.operation_id)[-1]
    assert final.state == types_pb2.OPERATION_STATE_FAILED
    assert final.error_reason == "BACKUP_FAILED"
    assert "HTTP 500" in final.message
    assert not any(agent.frozen for agent in harness.agents.values())
    backup = harness.stub().GetBackup(pb.GetBackupRequest(backup_id=started.backup_id), timeout=10)
    assert backup.state == pb.BACKUP_STATE_FAILED
    assert "HTTP 500" in backup.error


def test_unknown_operation_is_not_found_for_get_and_watch(harness: Harness) -> None:
    stub = harness.stub()
    error = rpc_error(stub.GetOperation, pb.GetOperationRequest(operation_id="0" * 32))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert reason_of(error) == "OPERATION_NOT_FOUND"
    assert "in memory" in (error.details() or "")

    stream = stub.WatchOperation(pb.WatchOperationRequest(operation_id="missing"), timeout=10)
    with pytest.raises(grpc.RpcError) as caught:
        list(stream)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


# -- catalog reads ---------------------------------------------------------------------------------


def test_list_backups_pages_never_overlap_and_basic_view_leaves_nodes_out(
    harness: Harness,
) -> None:
    for i in range(25):
        harness.seed_backup(f"rs-b{i:03d}", T0 + timedelta(hours=i))
    harness.seed_backup("rs-edge-1", T0, cluster="edge")
    stub = harness.stub()

    seen: list[str] = []
    token = ""
    pages = 0
    while True:
        page = stub.ListBackups(
            pb.ListBackupsRequest(cluster="prod", page_size=10, page_token=token), timeout=10
        )
        pages += 1
        assert len(page.backups) <= 10
        for backup in page.backups:
            assert not backup.nodes and not backup.snapshots and not backup.timings
            assert backup.node_count == 3 and backup.snapshot_count == 1
            assert backup.HasField("freeze")
        seen += [b.backup_id for b in page.backups]
        token = page.next_page_token
        if not token:
            break
    assert pages == 3
    assert seen == [f"rs-b{i:03d}" for i in reversed(range(25))]

    everything = stub.ListBackups(pb.ListBackupsRequest(page_size=1000), timeout=10)
    assert len(everything.backups) == 26 and not everything.next_page_token


def test_list_backups_full_view_is_bounded_and_bad_tokens_are_invalid(harness: Harness) -> None:
    for i in range(25):
        harness.seed_backup(f"rs-f{i:03d}", T0 + timedelta(minutes=i))
    stub = harness.stub()
    page = stub.ListBackups(
        pb.ListBackupsRequest(page_size=1000, view=pb.BACKUP_VIEW_FULL), timeout=10
    )
    assert 0 < len(page.backups) <= 20 and page.next_page_token
    assert len(page.backups[0].nodes) == 3

    error = rpc_error(stub.ListBackups, pb.ListBackupsRequest(page_token="garbage!"))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert reason_of(error) == "INVALID_PAGE_TOKEN"


def test_get_backup_not_found_and_invalid_ids(harness: Harness) -> None:
    stub = harness.stub()
    error = rpc_error(stub.GetBackup, pb.GetBackupRequest(backup_id="rs-nope"))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert reason_of(error) == "BACKUP_NOT_FOUND"
    assert "ringsnap list" in (error.details() or "")
    for hostile in ("../etc/passwd", "", "a b"):
        error = rpc_error(stub.GetBackup, pb.GetBackupRequest(backup_id=hostile))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_internal_errors_are_internal_and_say_where_to_look(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(backup_id: str) -> None:
        raise KeyError("secret-internal-detail")

    monkeypatch.setattr(harness.catalog, "get_backup", broken)
    error = rpc_error(harness.stub().GetBackup, pb.GetBackupRequest(backup_id="rs-x"))
    assert error.code() == grpc.StatusCode.INTERNAL
    assert "secret-internal-detail" not in (error.details() or "")
    assert "journalctl -u ringsnap-coordinator" in (error.details() or "")


# -- delete, retention, restore --------------------------------------------------------------------


def test_delete_backup_removes_entry_and_snapshot(harness: Harness) -> None:
    harness.seed_backup("rs-del", T0)
    assert "rs-del" in harness.array.snapshots
    operation = harness.stub().DeleteBackup(
        pb.DeleteBackupRequest(backup_id="rs-del", reason="test: by hand"), timeout=10
    )
    assert operation.kind == types_pb2.OPERATION_KIND_DELETE
    final = watch_to_end(harness, operation.operation_id)[-1]
    assert final.state == types_pb2.OPERATION_STATE_SUCCEEDED
    assert "1 array snapshots deleted" in final.message
    assert not final.errors
    assert "rs-del" not in harness.array.snapshots
    error = rpc_error(harness.stub().GetBackup, pb.GetBackupRequest(backup_id="rs-del"))
    assert error.code() == grpc.StatusCode.NOT_FOUND


def test_delete_with_a_failing_array_succeeds_and_reports_the_pending_cleanup(
    harness: Harness,
) -> None:
    harness.seed_backup("rs-stuck", T0)
    harness.array.delete_error = DriverError("snapshot busy", array="a1")
    operation = harness.stub().DeleteBackup(
        pb.DeleteBackupRequest(backup_id="rs-stuck"), timeout=10
    )
    final = watch_to_end(harness, operation.operation_id)[-1]
    assert final.state == types_pb2.OPERATION_STATE_SUCCEEDED
    assert len(final.errors) == 1 and "snapshot busy" in final.errors[0]
    assert harness.stub().GetStatus(pb.GetStatusRequest(), timeout=10).pending_cleanups == 1


def test_delete_refuses_unknown_and_running_backups(harness: Harness) -> None:
    stub = harness.stub()
    error = rpc_error(stub.DeleteBackup, pb.DeleteBackupRequest(backup_id="rs-none"))
    assert error.code() == grpc.StatusCode.NOT_FOUND

    harness.hold_flush("n1")
    started = stub.StartBackup(pb.StartBackupRequest(cluster="prod"), timeout=10)
    harness.wait_flushing("n1")
    error = rpc_error(stub.DeleteBackup, pb.DeleteBackupRequest(backup_id=started.backup_id))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert reason_of(error) == "BACKUP_STATE"
    assert "still running" in (error.details() or "")
    harness.release_flush("n1")
    watch_to_end(harness, started.operation_id)


def test_plan_retention_dry_run_changes_nothing_and_apply_deletes(harness: Harness) -> None:
    now = datetime.now(UTC)
    for days in range(4):
        harness.seed_backup(f"rs-d{days}", now - timedelta(days=days), policy="daily")
    stub = harness.stub()

    plan = stub.PlanRetention(pb.PlanRetentionRequest(cluster="prod", policy="daily"), timeout=10)
    assert not plan.applied
    assert [d.backup_id for d in plan.decisions] == ["rs-d0", "rs-d1", "rs-d2", "rs-d3"]
    assert [d.keep for d in plan.decisions] == [True, True, False, False]
    assert "newest complete backup" in plan.decisions[0].reason
    assert plan.decisions[3].reason == "beyond all buckets"
    assert plan.decisions[3].state == pb.BACKUP_STATE_COMPLETE
    assert len(harness.array.snapshots) == 4, "a dry run deletes nothing"

    applied = stub.PlanRetention(
        pb.PlanRetentionRequest(cluster="prod", policy="daily", apply=True), timeout=10
    )
    assert applied.applied
    assert [d.keep for d in applied.decisions] == [True, True, False, False]
    assert sorted(harness.array.snapshots) == ["rs-d0", "rs-d1"]

    error = rpc_error(stub.PlanRetention, pb.PlanRetentionRequest(cluster="prod", policy="x"))
    assert error.code() == grpc.StatusCode.NOT_FOUND and reason_of(error) == "UNKNOWN_POLICY"
    error = rpc_error(stub.PlanRetention, pb.PlanRetentionRequest(cluster="prod"))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_start_restore_of_an_unknown_backup_is_not_found(harness: Harness) -> None:
    """StartRestore is built (tests/unit/coordinator_api/test_restore_api.py); an unknown backup
    is refused before anything starts."""
    request = pb.StartRestoreRequest(backup_id="rs-x", confirm_cluster="prod")
    error = rpc_error(harness.stub().StartRestore, request)
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert reason_of(error) == "BACKUP_NOT_FOUND"
    assert not harness.coordinator.operations.running()


# -- status ----------------------------------------------------------------------------------------


def test_status_reports_last_backup_success_schedules_and_cleanups(harness: Harness) -> None:
    harness.seed_backup("rs-ok", T0)
    harness.seed_backup("rs-bad", T0 + timedelta(hours=1), failed=True)
    status = harness.stub().GetStatus(pb.GetStatusRequest(), timeout=10)

    assert [c.cluster for c in status.clusters] == ["edge", "prod"]
    edge, prod = status.clusters
    assert not edge.HasField("last_backup") and not edge.HasField("last_successful_backup_at")
    assert not edge.next_runs
    assert prod.last_backup.backup_id == "rs-bad"
    assert prod.last_backup.state == pb.BACKUP_STATE_FAILED
    assert prod.last_successful_backup_at.ToDatetime(tzinfo=UTC) == T0 + timedelta(seconds=3)
    assert not prod.running_backup_id
    assert [(r.schedule, r.cron, r.policy) for r in prod.next_runs] == [
        ("yearly", "0 3 1 1 *", "daily")
    ]
    next_run = prod.next_runs[0].next_run_at.ToDatetime(tzinfo=UTC)
    assert (next_run.month, next_run.day, next_run.hour) == (1, 1, 3)
    assert status.pending_cleanups == 0
    assert status.version


# -- errors, access, shutdown ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "code", "reason"),
    [
        (ValidationError("bad"), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT"),
        (InvalidPageTokenError("bad"), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PAGE_TOKEN"),
        (BackupNotFoundError("rs-x"), grpc.StatusCode.NOT_FOUND, "BACKUP_NOT_FOUND"),
        (UnknownClusterError("x"), grpc.StatusCode.NOT_FOUND, "UNKNOWN_CLUSTER"),
        (UnknownPolicyError("x"), grpc.StatusCode.NOT_FOUND, "UNKNOWN_POLICY"),
        (
            ClusterHeld(
                Lease("c", RunKind.BACKUP, asked_by="a", since=T0),
                Lease("c", RunKind.BACKUP, asked_by="b", since=T0),
            ),
            grpc.StatusCode.ABORTED,
            "CLUSTER_BUSY",
        ),
        (BackupRefused("x"), grpc.StatusCode.FAILED_PRECONDITION, "BACKUP_REFUSED"),
        (BackupStateError("x"), grpc.StatusCode.FAILED_PRECONDITION, "BACKUP_STATE"),
        (BackupFailed("x"), grpc.StatusCode.UNAVAILABLE, "BACKUP_FAILED"),
        (AgentError("x"), grpc.StatusCode.UNAVAILABLE, "AGENT_FAILED"),
        (DriverError("x"), grpc.StatusCode.UNAVAILABLE, "ARRAY_FAILED"),
        (RingsnapError("x"), grpc.StatusCode.FAILED_PRECONDITION, "FAILED_PRECONDITION"),
        (KeyError("x"), grpc.StatusCode.INTERNAL, "INTERNAL"),
        (ValueError("x"), grpc.StatusCode.INTERNAL, "INTERNAL"),
    ],
)
def test_error_mapping(error: Exception, code: grpc.StatusCode, reason: str) -> None:
    assert classify(error) == (code, reason)


def test_calls_without_the_token_are_refused_but_health_answers(harness: Harness) -> None:
    for token in ("", "wrong-token"):
        stub = pb_stub(harness.channel(token=token))
        error = rpc_error(stub.GetStatus, pb.GetStatusRequest())
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED
        assert str(harness.token_file) in (error.details() or "")
        with pytest.raises(grpc.RpcError) as caught:
            list(stub.WatchOperation(pb.WatchOperationRequest(operation_id="x"), timeout=10))
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED

    with grpc.insecure_channel(harness.address) as plain:  # what grpc_health_probe does
        health = health_pb2_grpc.HealthStub(plain)
        for service in ("", "ringsnap.api.v1.CoordinatorService"):
            answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as caught:
            pb_stub(plain).GetStatus(pb.GetStatusRequest(), timeout=10)
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert harness.token_file.stat().st_mode & 0o777 == 0o640


@pytest.mark.parametrize(
    ("listen", "loopback"),
    [
        ("127.0.0.1:7444", True),
        ("127.0.0.2:7444", True),
        ("[::1]:7444", True),
        ("localhost:7444", True),
        ("0.0.0.0:7444", False),
        ("10.0.0.5:7444", False),
        ("[::]:7444", False),
        ("coordinator.example:7444", False),
    ],
)
def test_only_loopback_addresses_are_served(listen: str, loopback: bool) -> None:
    assert (loopback_problem(listen) is None) is loopback


def test_stop_cancels_running_backups_thaws_nodes_and_says_why(harness: Harness) -> None:
    """SIGTERM's path: an API backup frozen in its snapshot and a scheduled one in its flush."""
    stub = harness.stub()
    harness.hold_snapshot()
    api_run = stub.StartBackup(pb.StartBackupRequest(cluster="prod"), timeout=10)
    harness.wait_snapshotting()
    assert all(harness.agents[n].frozen for n in ("n1", "n2", "n3"))

    harness.hold_flush("e1")

    async def scheduled() -> asyncio.Task[Any]:
        request = BackupRequest(cluster="edge", trigger="schedule:test", backup_id="rs-sched-1")
        return asyncio.create_task(harness.coordinator.backup(request))

    task = harness.call(scheduled())
    harness.wait_flushing("e1")
    watcher = stub.WatchOperation(pb.WatchOperationRequest(operation_id=api_run.operation_id))

    async def shutdown() -> None:
        await harness.server.enter_shutdown()
        await harness.coordinator.stop()

    harness.call(shutdown())

    assert task.cancelled()
    assert not any(agent.frozen for agent in harness.agents.values())
    final = list(watcher)[-1]
    assert final.state == types_pb2.OPERATION_STATE_CANCELLED
    for backup_id in (api_run.backup_id, "rs-sched-1"):
        backup = harness.catalog.get_backup(backup_id)
        assert backup.state is BackupState.FAILED
        assert "cancelled (the coordinator is stopping); every node was thawed" in backup.error
    with grpc.insecure_channel(harness.address) as plain:
        answer = health_pb2_grpc.HealthStub(plain).Check(
            health_pb2.HealthCheckRequest(), timeout=10
        )
        assert answer.status == health_pb2.HealthCheckResponse.NOT_SERVING
