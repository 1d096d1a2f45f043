"""Restores through the coordinator's API: PlanRestore, StartRestore, GetRestore, ListRestores.

The harness's real coordinator and server; its restore sessions are real sessions (plan, workflow,
catalog journal) on fakes of the agents, the array and the ring (`restore_rig`).
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import pytest

from ringsnap.api.v1 import coordinator_pb2 as pb
from ringsnap.api.v1 import types_pb2
from ringsnap.coordinator.api import messages
from ringsnap.coordinator.api.errors import classify
from ringsnap.coordinator.catalog import RestoreNotFoundError
from ringsnap.coordinator.cli import restore_client, restore_report
from ringsnap.coordinator.cli.client import REASON_EXIT_CODES, ExitCode
from ringsnap.coordinator.model import (
    NodeVerdict,
    PhaseTiming,
    RestoreMode,
    RestoreNode,
    RestoreRecord,
    RestoreState,
    RestoreStep,
    RestoreVolume,
    Verification,
    VolumeRole,
)
from ringsnap.coordinator.restore.daemon import RestoreNotConfirmed, restore_progress_line
from ringsnap.coordinator.restore.plan import RestoreRequest
from ringsnap.coordinator.restore.workflow import RestoreFailed, RestoreRefused
from ringsnap.plugins.errors import DriverError
from tests.support.coordinator_rpc import reason_of, rpc_error, watch_to_end

from .conftest import Harness
from .restore_rig import RECENT, RestoreRig, install, start_restore


@pytest.fixture
def rig(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> RestoreRig:
    harness.seed_backup("rs-1", RECENT)
    return install(harness, monkeypatch)


def restore_of(harness: Harness, restore_id: str) -> pb.Restore:
    return harness.stub().GetRestore(pb.GetRestoreRequest(restore_id=restore_id), timeout=10)


# -- PlanRestore -----------------------------------------------------------------------------------


def test_plan_restore_maps_the_plan_and_changes_nothing(harness: Harness, rig: RestoreRig) -> None:
    plan = harness.stub().PlanRestore(pb.PlanRestoreRequest(backup_id="rs-1"), timeout=30)
    assert plan.restore_id.startswith("rr-")
    assert (plan.backup_id, plan.cluster) == ("rs-1", "prod")
    assert plan.backup_started_at.ToDatetime(tzinfo=UTC) == RECENT
    assert plan.mode == pb.RESTORE_MODE_REVERT and plan.whole_ring
    assert [n.name for n in plan.nodes] == ["n1", "n2", "n3"]
    first = plan.nodes[0]
    assert (first.host_id, first.seed, first.cassandra_running) == ("host-n1", True, True)
    assert [(v.array, v.volume, v.role, v.mount_point) for v in first.volumes] == [
        ("a1", "n1-data", types_pb2.FILESYSTEM_ROLE_DATA, "/data"),
        ("a1", "n1-cl", types_pb2.FILESYSTEM_ROLE_COMMITLOG, "/commitlog"),
    ]
    assert not plan.nodes[1].seed, "one seed: the first target, since none is configured"
    assert [a.array for a in plan.arrays] == ["a1"]
    assert plan.arrays[0].snapshot.snapshot_name == "rs-1"
    assert len(plan.arrays[0].snapshot.members) == 6
    assert list(plan.destroyed) == ["every write made since the backup on the whole ring"]
    assert not plan.refusals and not plan.lost_backups and not plan.warnings
    assert not plan.HasField("expected_duration"), "no past restore of the cluster"
    assert rig.opened == rig.closed == ["prod"], "the plan's session is closed again"
    assert rig.catalogs == [harness.catalog], "the daemon restores with its own catalog"
    assert not rig.stops() and not harness.catalog.list_restores()

    partial = harness.stub().PlanRestore(
        pb.PlanRestoreRequest(backup_id="rs-1", nodes=["n2"], mode=pb.RESTORE_MODE_CLONE),
        timeout=30,
    )
    assert [n.name for n in partial.nodes] == ["n2"] and partial.nodes[0].seed
    assert not partial.whole_ring and partial.mode == pb.RESTORE_MODE_CLONE
    assert "nodetool repair -full" in " ".join(partial.warnings)
    assert "kept untouched" in partial.destroyed[0]


def test_the_plan_document_is_the_same_in_process_and_through_the_api(
    harness: Harness, rig: RestoreRig
) -> None:
    rig.agents["n3"].running = False
    rig.array.destroys = ["snapshot rs-0 is deleted"]
    plan = harness.call(harness.coordinator.restores.plan_restore(RestoreRequest("rs-1")))
    plan = dataclasses.replace(plan, lost_backups=("rs-0",), expected_seconds=93.25)
    through_api = pb.RestorePlan.FromString(messages.restore_plan(plan).SerializeToString())
    document = restore_report.plan_document(plan)
    assert restore_client.plan_document(through_api) == document
    assert document["nodes"][2]["cassandra_running"] is False
    assert "array a1: snapshot rs-0 is deleted" in document["destroyed"]
    assert any("n3: Cassandra is not running" in w for w in document["warnings"])


def test_plan_restore_refusals_and_errors(harness: Harness, rig: RestoreRig) -> None:
    stub = harness.stub()
    error = rpc_error(stub.PlanRestore, pb.PlanRestoreRequest(backup_id="rs-none"))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert reason_of(error) == "BACKUP_NOT_FOUND"
    for hostile in ("", "../x"):
        error = rpc_error(stub.PlanRestore, pb.PlanRestoreRequest(backup_id=hostile))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT

    rig.agents["n2"].unreachable = True
    plan = stub.PlanRestore(pb.PlanRestoreRequest(backup_id="rs-1"), timeout=30)
    assert any("node n2: the agent cannot be reached" in r for r in plan.refusals), plan.refusals


# -- StartRestore ----------------------------------------------------------------------------------


def test_start_restore_needs_the_clusters_name_typed(harness: Harness, rig: RestoreRig) -> None:
    for typed in ("", "edge", "Prod"):
        request = pb.StartRestoreRequest(backup_id="rs-1", confirm_cluster=typed)
        error = rpc_error(harness.stub().StartRestore, request)
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert reason_of(error) == "RESTORE_NOT_CONFIRMED"
        assert "confirmed with the cluster's name" in (error.details() or "")
    assert rig.opened == [] and not harness.catalog.list_restores()
    assert harness.coordinator.leases.holder("prod") is None


def test_start_restore_runs_the_confirmed_plan_with_progress_through_watch(
    harness: Harness, rig: RestoreRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    refreshed: list[bool] = []
    record_restores = harness.coordinator.metrics.record_restores

    def counted(*args: Any, **kwargs: Any) -> None:
        refreshed.append(True)
        record_restores(*args, **kwargs)

    monkeypatch.setattr(harness.coordinator.metrics, "record_restores", counted)
    stub = harness.stub()
    plan = stub.PlanRestore(pb.PlanRestoreRequest(backup_id="rs-1"), timeout=30)
    rig.hold_stop()
    started = start_restore(harness, restore_id=plan.restore_id)
    assert started.kind == types_pb2.OPERATION_KIND_RESTORE
    assert started.backup_id == "rs-1"

    updates: list[types_pb2.Operation] = []
    stream = stub.WatchOperation(
        pb.WatchOperationRequest(operation_id=started.operation_id), timeout=30
    )
    for update in stream:  # the restore waits in its stop until the watcher has seen it there
        updates.append(update)
        if update.phase == "stopped":
            rig.release_stop()
    final = updates[-1]
    assert final.state == types_pb2.OPERATION_STATE_SUCCEEDED, final
    assert final.phase == "record"
    assert final.message == f"restore {plan.restore_id} of backup rs-1: proven"
    phases = [u.phase for u in updates]
    # A watcher sees the newest state at each read: some lines may merge, never reorder.
    assert "stopped" in phases and phases[-1] == "record"
    assert all(u.state != types_pb2.OPERATION_STATE_SUCCEEDED for u in updates[:-1])
    assert phases.index("stopped") < len(phases) - 1
    stopped = next(u.message for u in updates if u.phase == "stopped")
    assert stopped in {restore_progress_line(n, "stopped", "") for n in ("n1", "n2", "n3")}

    record = restore_of(harness, plan.restore_id)
    assert record.state == pb.RESTORE_STATE_PROVEN
    assert (record.cluster, record.backup_id, record.requested_by) == ("prod", "rs-1", "alice")
    assert record.HasField("finished_at") and not record.error
    assert [(a.array, a.done) for a in record.arrays_done] == [("a1", "reverted")]
    assert {t.phase for t in record.timings} >= {"stop", "revert", "verify"}
    for node in record.nodes:
        assert node.verdict == pb.NODE_VERDICT_PROVEN
        assert node.step == pb.RESTORE_STEP_VERIFIED
        assert node.HasField("manifest_ok") and node.manifest_ok
        assert node.proof and not node.next_step
        assert [t.phase for t in node.step_timings][:2] == ["stopped", "released"]
    backup = harness.catalog.get_backup("rs-1")
    assert backup.verification is Verification.PROVEN
    assert backup.verified_by == plan.restore_id
    assert rig.opened == rig.closed == ["prod", "prod"]
    assert harness.coordinator.leases.holder("prod") is None
    assert refreshed, "the restore metrics are refreshed after each restore"

    again = rpc_error(
        stub.StartRestore,
        pb.StartRestoreRequest(
            backup_id="rs-1", confirm_cluster="prod", restore_id=plan.restore_id
        ),
    )
    assert reason_of(again) == "RESTORE_REFUSED", "a plan runs once"


def test_a_restore_makes_the_cluster_busy_for_backups_and_restores(
    harness: Harness, rig: RestoreRig
) -> None:
    stub = harness.stub()
    rig.hold_stop()
    restore = start_restore(harness)
    rig.wait_stopping()
    try:
        backup = stub.StartBackup(pb.StartBackupRequest(cluster="prod", trigger="cli:bob"))
        skipped = watch_to_end(harness, backup.operation_id)[-1]
        assert skipped.state == types_pb2.OPERATION_STATE_FAILED
        assert skipped.error_reason == "CLUSTER_BUSY"
        assert "is being restored by restore rr-" in skipped.message
        assert "skipped the backup asked by cli:bob" in skipped.message

        status = stub.GetStatus(pb.GetStatusRequest(), timeout=10)
        prod = next(c for c in status.clusters if c.cluster == "prod")
        assert prod.running_kind == "restore" and prod.running_run_id.startswith("rr-")
        assert prod.running_operation_id == restore.operation_id
        assert any(s.kind == "busy" and s.trigger == "cli:bob" for s in status.recent_skips)

        error = rpc_error(
            stub.StartRestore, pb.StartRestoreRequest(backup_id="rs-1", confirm_cluster="prod")
        )
        assert error.code() == grpc.StatusCode.ABORTED
        assert reason_of(error) == "CLUSTER_BUSY"
        assert "restore rr-" in (error.details() or "")
        plan = stub.PlanRestore(pb.PlanRestoreRequest(backup_id="rs-1"), timeout=30)
        assert any("being restored" in r for r in plan.refusals)

        error = rpc_error(stub.DeleteBackup, pb.DeleteBackupRequest(backup_id="rs-1"))
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert reason_of(error) == "BACKUP_STATE" and "snapshots are in use" in (
            error.details() or ""
        )
        error = rpc_error(
            stub.PlanRetention, pb.PlanRetentionRequest(cluster="prod", policy="daily", apply=True)
        )
        assert reason_of(error) == "BACKUP_STATE" and "being restored" in (error.details() or "")
        assert "rs-1" in harness.array.snapshots

        other = stub.StartBackup(pb.StartBackupRequest(cluster="edge"), timeout=10)
        assert watch_to_end(harness, other.operation_id)[-1].state == (
            types_pb2.OPERATION_STATE_SUCCEEDED
        ), "only the restored cluster is busy"
    finally:
        rig.release_stop()
    final = watch_to_end(harness, restore.operation_id)[-1]
    assert final.state == types_pb2.OPERATION_STATE_SUCCEEDED
    assert len(rig.stops()) == 3, "the second restore stopped nothing"
    after = stub.StartBackup(pb.StartBackupRequest(cluster="prod"), timeout=10)
    assert watch_to_end(harness, after.operation_id)[-1].state == (
        types_pb2.OPERATION_STATE_SUCCEEDED
    )


def test_a_restore_is_refused_while_a_backup_of_the_cluster_runs(
    harness: Harness, rig: RestoreRig
) -> None:
    stub = harness.stub()
    harness.hold_flush("n1")
    backup = stub.StartBackup(pb.StartBackupRequest(cluster="prod", trigger="schedule:x"))
    harness.wait_flushing("n1")
    try:
        plan = stub.PlanRestore(pb.PlanRestoreRequest(backup_id="rs-1"), timeout=30)
        assert any("being backed up (by schedule:x)" in r for r in plan.refusals)
        error = rpc_error(
            stub.StartRestore, pb.StartRestoreRequest(backup_id="rs-1", confirm_cluster="prod")
        )
        assert error.code() == grpc.StatusCode.ABORTED
        assert reason_of(error) == "CLUSTER_BUSY"
        assert "being backed up (by schedule:x)" in (error.details() or "")
        assert "nothing was changed" in (error.details() or "")
        assert rig.opened == ["prod"] and not rig.stops(), "only the plan looked"
    finally:
        harness.release_flush("n1")
    watch_to_end(harness, backup.operation_id)


def test_start_restore_refuses_a_refused_unknown_or_changed_plan(
    harness: Harness, rig: RestoreRig
) -> None:
    stub = harness.stub()
    rig.agents["n2"].unreachable = True
    error = rpc_error(
        stub.StartRestore, pb.StartRestoreRequest(backup_id="rs-1", confirm_cluster="prod")
    )
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert reason_of(error) == "RESTORE_REFUSED"
    assert "node n2: the agent cannot be reached" in (error.details() or "")
    rig.agents["n2"].unreachable = False

    error = rpc_error(
        stub.StartRestore,
        pb.StartRestoreRequest(
            backup_id="rs-1", confirm_cluster="prod", restore_id="rr-20260101-000000-abcd"
        ),
    )
    assert reason_of(error) == "RESTORE_REFUSED"
    assert "holds no plan rr-20260101-000000-abcd" in (error.details() or "")

    plan = stub.PlanRestore(pb.PlanRestoreRequest(backup_id="rs-1"), timeout=30)
    rig.array.destroys = ["snapshot rs-2 is deleted"]  # a newer backup finished meanwhile
    error = rpc_error(
        stub.StartRestore,
        pb.StartRestoreRequest(
            backup_id="rs-1", confirm_cluster="prod", restore_id=plan.restore_id
        ),
    )
    assert reason_of(error) == "RESTORE_REFUSED"
    assert "changed since it was shown (what is destroyed)" in (error.details() or "")
    assert not rig.stops() and not harness.catalog.list_restores()
    assert rig.opened == rig.closed
    assert harness.coordinator.leases.holder("prod") is None


def test_a_failed_restore_fails_its_operation_and_resumes(
    harness: Harness, rig: RestoreRig
) -> None:
    rig.array.fail_revert = DriverError("HTTP 500: revert failed", array="a1")
    operation = start_restore(harness)
    final = watch_to_end(harness, operation.operation_id)[-1]
    assert final.state == types_pb2.OPERATION_STATE_FAILED
    assert final.error_reason == "RESTORE_FAILED"
    assert "revert failed" in final.message
    (record,) = harness.catalog.list_restores()
    failed = restore_of(harness, record.id)
    assert failed.state == pb.RESTORE_STATE_FAILED and "revert failed" in failed.error
    for node in failed.nodes:
        assert node.step == pb.RESTORE_STEP_RELEASED
        assert f"ringsnap restore --resume {record.id}" in node.next_step
    assert harness.coordinator.leases.holder("prod") is None

    stub = harness.stub()
    error = rpc_error(
        stub.StartRestore, pb.StartRestoreRequest(resume_id=record.id, confirm_cluster="edge")
    )
    assert reason_of(error) == "RESTORE_NOT_CONFIRMED"
    rig.array.fail_revert = None
    resumed = stub.StartRestore(
        pb.StartRestoreRequest(resume_id=record.id, confirm_cluster="prod"), timeout=30
    )
    assert watch_to_end(harness, resumed.operation_id)[-1].state == (
        types_pb2.OPERATION_STATE_SUCCEEDED
    )
    assert restore_of(harness, record.id).state == pb.RESTORE_STATE_PROVEN
    assert len(rig.stops()) == 3, "a resume does not stop the nodes again"

    error = rpc_error(
        stub.StartRestore, pb.StartRestoreRequest(resume_id=record.id, confirm_cluster="prod")
    )
    assert reason_of(error) == "RESTORE_REFUSED" and "is finished" in (error.details() or "")
    error = rpc_error(
        stub.StartRestore, pb.StartRestoreRequest(resume_id="rr-none", confirm_cluster="prod")
    )
    assert error.code() == grpc.StatusCode.NOT_FOUND and reason_of(error) == "RESTORE_NOT_FOUND"


def test_a_restore_not_proven_succeeds_as_an_operation_with_the_failed_verdict(
    harness: Harness, rig: RestoreRig
) -> None:
    rig.ring.present.discard("canary-n2")
    operation = start_restore(harness)
    final = watch_to_end(harness, operation.operation_id)[-1]
    assert final.state == types_pb2.OPERATION_STATE_SUCCEEDED
    assert final.message.endswith(": not-proven")
    (record,) = harness.catalog.list_restores()
    verdicts = {n.name: n.verdict for n in restore_of(harness, record.id).nodes}
    assert verdicts == {
        "n1": pb.NODE_VERDICT_PROVEN,
        "n2": pb.NODE_VERDICT_NOT_PROVEN,
        "n3": pb.NODE_VERDICT_PROVEN,
    }


def test_stopping_the_coordinator_interrupts_a_running_restore(
    harness: Harness, rig: RestoreRig
) -> None:
    rig.hold_stop()
    operation = start_restore(harness)
    rig.wait_stopping()
    watcher = harness.stub().WatchOperation(
        pb.WatchOperationRequest(operation_id=operation.operation_id)
    )
    harness.call(harness.coordinator.stop())
    assert list(watcher)[-1].state == types_pb2.OPERATION_STATE_CANCELLED
    (record,) = harness.catalog.list_restores()
    assert record.state is RestoreState.INTERRUPTED
    assert rig.opened == rig.closed
    assert harness.coordinator.leases.holder("prod") is None


# -- GetRestore, ListRestores ----------------------------------------------------------------------


def test_get_and_list_restores(harness: Harness, rig: RestoreRig) -> None:
    stub = harness.stub()
    error = rpc_error(stub.GetRestore, pb.GetRestoreRequest(restore_id="rr-none"))
    assert error.code() == grpc.StatusCode.NOT_FOUND and reason_of(error) == "RESTORE_NOT_FOUND"
    error = rpc_error(stub.GetRestore, pb.GetRestoreRequest(restore_id="../x"))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT

    ids = []
    for _ in range(2):
        operation = start_restore(harness)
        watch_to_end(harness, operation.operation_id)
        ids.append(harness.catalog.list_restores(limit=1)[0].id)
    listed = stub.ListRestores(pb.ListRestoresRequest(), timeout=10)
    assert [r.restore_id for r in listed.restores] == list(reversed(ids))
    assert stub.ListRestores(pb.ListRestoresRequest(cluster="edge"), timeout=10).restores == []
    assert len(stub.ListRestores(pb.ListRestoresRequest(limit=1), timeout=10).restores) == 1
    assert listed.restores[0] == restore_of(harness, ids[1])

    plan = stub.PlanRestore(pb.PlanRestoreRequest(backup_id="rs-1"), timeout=30)
    assert plan.HasField("expected_duration"), "the median of the past proven restores"


# -- messages and errors ---------------------------------------------------------------------------


def _node(name: str, manifest_ok: bool | None) -> RestoreNode:
    return RestoreNode(
        name=name,
        host_id=f"host-{name}",
        volumes=(
            RestoreVolume(
                array="a1",
                volume=f"{name}-data",
                role=VolumeRole.DATA_AND_COMMITLOG,
                mount_point="/var/lib/cassandra",
                attached_volume=f"{name}-data_rr",
            ),
        ),
        was_running=False,
        backup_canary=f"canary-{name}",
        pre_restore_canary=f"pre-{name}",
        manifest_ok=manifest_ok,
        step=RestoreStep.ATTACHED,
        step_seconds=(("stopped", 1.25), ("released", 0.5)),
        verdict=NodeVerdict.NOT_PROVEN,
        proof=("manifest: 1 SSTables present",),
        unproven=("no pre-restore canary",),
        next_step="start Cassandra",
    )


def _non_default(instance: Any) -> None:
    for field in dataclasses.fields(instance):
        if field.default is not dataclasses.MISSING:
            default: Any = field.default
        elif field.default_factory is not dataclasses.MISSING:
            default = field.default_factory()
        else:
            default = None
        assert getattr(instance, field.name) != default, f"{field.name} is left at its default"


def test_restore_messages_round_trip_every_field() -> None:
    started = datetime(2026, 11, 24, 3, 0, 0, 123456, tzinfo=UTC)
    record = RestoreRecord(
        id="rr-20261124-030000-abcd",
        cluster="prod",
        backup_id="rs-1",
        mode=RestoreMode.CLONE,
        nodes=(_node("n1", True), _node("n2", False), _node("n3", None)),
        whole_ring=True,
        requested_by="alice (sudo)",
        started_at=started,
        state=RestoreState.FAILED,
        finished_at=started + timedelta(minutes=3, microseconds=7),
        error="node n2: attach failed",
        warnings=("run nodetool repair",),
        arrays_done=(("a1", "cloned:rr_1"),),
        clones=(("a1", "n1-data", "n1-data_rr"),),
        timings=(PhaseTiming(phase="stop", seconds=2.5), PhaseTiming(phase="clone", seconds=0.125)),
    )
    _non_default(record)
    _non_default(record.nodes[0])
    _non_default(record.nodes[0].volumes[0])
    wire = pb.Restore.FromString(messages.restore(record).SerializeToString())
    assert messages.restore_record(wire) == record
    assert not wire.nodes[2].HasField("manifest_ok") and wire.nodes[1].HasField("manifest_ok")
    for state in RestoreState:
        for step in RestoreStep:
            same = dataclasses.replace(
                record, state=state, nodes=(dataclasses.replace(record.nodes[0], step=step),)
            )
            assert messages.restore_record(messages.restore(same)) == same
    running = dataclasses.replace(record, finished_at=None, mode=RestoreMode.REVERT)
    assert messages.restore_record(messages.restore(running)) == running
    with pytest.raises(ValueError, match="restore state"):
        messages.restore_record(pb.Restore(mode=pb.RESTORE_MODE_REVERT))


@pytest.mark.parametrize(
    ("error", "code", "reason", "exit_code"),
    [
        (RestoreNotConfirmed("x"), grpc.StatusCode.FAILED_PRECONDITION, "RESTORE_NOT_CONFIRMED", 3),
        (RestoreRefused("x"), grpc.StatusCode.FAILED_PRECONDITION, "RESTORE_REFUSED", 3),
        (RestoreFailed("x"), grpc.StatusCode.UNAVAILABLE, "RESTORE_FAILED", 4),
        (RestoreNotFoundError("rr-x"), grpc.StatusCode.NOT_FOUND, "RESTORE_NOT_FOUND", 66),
    ],
)
def test_restore_error_mapping(
    error: Exception, code: grpc.StatusCode, reason: str, exit_code: int
) -> None:
    assert classify(error) == (code, reason)
    assert REASON_EXIT_CODES[reason] == ExitCode(exit_code)
