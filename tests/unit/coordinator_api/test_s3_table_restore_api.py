"""A table restore `--from s3` through the daemon's API (and `ringsnap restore --keyspace --from s3`
from a bastion through `cli.table_restore_client`): the source travels in PlanTableRestore and
StartTableRestore, the plan asks no array, the run stages every node from the bucket and never
clones, the record read back says it came from S3, and a resume of it stays on S3. The harness's
real coordinator and server; the session's agents are the fakes of the table-restore workflow tests
with their S3 downloads (`TableS3Agent`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import grpc
import pytest

from ringsnap.api.v1 import coordinator_pb2 as pb
from ringsnap.api.v1 import types_pb2
from ringsnap.coordinator.api.table_restore_messages import record_of
from ringsnap.coordinator.cli import table_restore_client as remote
from ringsnap.coordinator.cli.client import Target
from ringsnap.coordinator.restore.s3_ports import S3Room
from ringsnap.coordinator.table_restore import daemon
from ringsnap.coordinator.table_restore.model import TableRestoreFailed, TableRestoreState
from tests.support.coordinator_rpc import rpc_error, watch_to_end
from tests.support.s3_restore_fakes import TableS3Agent

from .conftest import Harness
from .table_restore_rig import BACKUP, NODES, Fakes, options, request, seed


@pytest.fixture
def fakes(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> tuple[Fakes, dict[str, Any]]:
    seed(harness.catalog)
    made = Fakes()
    s3 = {n: TableS3Agent(made.agents[n], components=2) for n in NODES}

    made.s3 = s3
    monkeypatch.setattr(daemon, "open_table_restore_session", made.open_session)
    return made, s3


S3_SOURCE = {"source": pb.TABLE_RESTORE_SOURCE_S3}


def test_a_table_restore_from_s3_through_the_api_stages_from_the_bucket_and_never_clones(
    harness: Harness, fakes: tuple[Fakes, dict[str, Any]]
) -> None:
    made, _ = fakes
    stub = harness.stub()
    plan = stub.PlanTableRestore(pb.PlanTableRestoreRequest(**request(**S3_SOURCE)), timeout=30)
    assert list(plan.refusals) == []
    assert plan.table_restore.source == pb.TABLE_RESTORE_SOURCE_S3
    assert sorted(made.events) == [f"{n}:check" for n in NODES]  # the bucket asked, nothing else

    operation = stub.StartTableRestore(
        pb.StartTableRestoreRequest(
            **request(**S3_SOURCE),
            confirm_cluster="prod",
            table_restore_id=plan.table_restore.table_restore_id,
        ),
        timeout=30,
    )
    updates = watch_to_end(harness, operation.operation_id)
    assert updates[-1].state == types_pb2.OPERATION_STATE_SUCCEEDED, updates[-1]
    downloads = sorted(e for e in made.events if ":download:" in e)
    assert downloads == [f"{n}:download:shop.orders->shop.orders" for n in NODES]
    assert not any(e.startswith(("clone", "array")) or ":mount" in e for e in made.events)
    record = harness.catalog.get_table_restore(plan.table_restore.table_restore_id)
    assert record.from_s3 and record.state is TableRestoreState.SUCCEEDED
    found = stub.GetTableRestore(pb.GetTableRestoreRequest(table_restore_id=record.id), timeout=10)
    assert found.source == pb.TABLE_RESTORE_SOURCE_S3 and record_of(found).from_s3


def test_without_the_source_the_api_plans_from_the_array_and_a_bad_source_is_invalid(
    harness: Harness, fakes: tuple[Fakes, dict[str, Any]]
) -> None:
    plan = harness.stub().PlanTableRestore(pb.PlanTableRestoreRequest(**request()), timeout=30)
    assert plan.table_restore.source == pb.TABLE_RESTORE_SOURCE_ARRAY
    error = rpc_error(
        harness.stub().PlanTableRestore, pb.PlanTableRestoreRequest(**request(source=7))
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "source 7" in (error.details() or "")


def test_the_cli_from_a_bastion_restores_from_s3_and_resumes_on_s3(
    harness: Harness, fakes: tuple[Fakes, dict[str, Any]]
) -> None:
    made, s3 = fakes
    target = Target(harness.address, harness.token_file, "test")
    dry = remote.table_restore(target, options(dry_run=True, from_s3=True))
    assert isinstance(dry, dict) and dry["refusals"] == []
    assert all(e.endswith(":check") for e in made.events)

    s3["n3"].fail["download:shop.orders->shop.orders"] = ConnectionError("S3 endpoint unreachable")
    with pytest.raises(TableRestoreFailed) as failed:
        remote.table_restore(target, options(from_s3=True))
    record = failed.value.record
    assert record is not None and record.state is TableRestoreState.FAILED
    assert "S3 endpoint unreachable" in record.error

    del s3["n3"].fail["download:shop.orders->shop.orders"]
    resumed = remote.table_restore(target, options(backup_id=None, resume=record.id))
    assert not isinstance(resumed, dict) and resumed.state is TableRestoreState.SUCCEEDED
    assert resumed.from_s3
    assert made.events.count("n3:download:shop.orders->shop.orders") == 2
    assert not any(e.startswith("clone") for e in made.events)


def test_a_table_restore_from_s3_is_refused_when_a_nodes_copy_is_not_in_the_bucket(
    harness: Harness, fakes: tuple[Fakes, dict[str, Any]]
) -> None:
    made, s3 = fakes
    s3["n2"].check = replace(s3["n2"].check, manifest_found=False)
    # The whole node's room is not the table's: the staging's own check decides.
    s3["n3"].check = replace(s3["n3"].check, rooms=(S3Room("/data", 2**40, 1, "7"),))

    plan = harness.stub().PlanTableRestore(
        pb.PlanTableRestoreRequest(**request(**S3_SOURCE)), timeout=30
    )

    (refusal,) = plan.refusals
    assert refusal.startswith("node n2: the bucket holds no manifest object")
    assert s3["n2"].check.manifest_key in refusal and f"ringsnap export {BACKUP}" in refusal
    assert not any(":download:" in e for e in made.events)
    # From the array, the bucket is not asked.
    made.events.clear()
    harness.stub().PlanTableRestore(pb.PlanTableRestoreRequest(**request()), timeout=30)
    assert not any(e.endswith(":check") for e in made.events)
