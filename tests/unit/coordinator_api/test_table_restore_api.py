"""Table restores through the coordinator's API: PlanTableRestore plans and changes nothing,
StartTableRestore runs the real session and workflow (on the fakes of the workflow's tests) as an
operation that holds the cluster, refuses an unconfirmed cluster or a refused plan before anything
is made, and `ringsnap restore --keyspace` through the daemon (`cli.table_restore_client`) ends with the
same record; resume and abort go through the same call.

The proof on a real ring and a real daemon is tests/integration/test_table_restore.py."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import grpc
import pytest
import typer

from ringsnap.api.v1 import coordinator_pb2 as pb
from ringsnap.api.v1 import types_pb2
from ringsnap.coordinator.api import access
from ringsnap.coordinator.api.table_restore_messages import record_of
from ringsnap.coordinator.cli import table_restore_client as remote
from ringsnap.coordinator.cli.client import Target
from ringsnap.coordinator.runs.lease import RunKind
from ringsnap.coordinator.table_restore import daemon
from ringsnap.coordinator.table_restore.model import TableRestoreFailed, TableRestoreState
from tests.support.coordinator_rpc import reason_of, rpc_error

from .conftest import Harness
from .table_restore_rig import BACKUP, NODES, Fakes, options, request, seed


@pytest.fixture
def fakes(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> Fakes:
    seed(harness.catalog)
    made = Fakes()
    original = made.agents["n2"].import_staged_table

    async def import_staged_table(restore_id: str, keyspace: str, table: str) -> Any:
        made.held.append(harness.coordinator.leases.holder("prod"))
        return await original(restore_id, keyspace, table)

    made.agents["n2"].import_staged_table = import_staged_table  # type: ignore[method-assign]
    original_clone = made.array.clone

    async def clone(ref: Any, suffix: str) -> Any:
        # A test that watches the run opens its watch first: the array's first step waits for it
        # (at most 10 s), so no progress line goes out before anyone listens.
        for _ in range(1000):
            if made.go.is_set():
                break
            await asyncio.sleep(0.01)
        return await original_clone(ref, suffix)

    made.array.clone = clone  # type: ignore[method-assign]

    monkeypatch.setattr(daemon, "open_table_restore_session", made.open_session)
    return made


def test_a_plan_through_the_api_changes_nothing_and_carries_the_clis_document(
    harness: Harness, fakes: Fakes
) -> None:
    plan = harness.stub().PlanTableRestore(pb.PlanTableRestoreRequest(**request()), timeout=30)
    assert list(plan.refusals) == []
    assert plan.table_restore.cluster == "prod"
    assert [(t.table, t.action) for t in plan.table_restore.targets] == [("orders", "exists")]
    document = json.loads(plan.document_json)
    assert document["id"] == plan.table_restore.table_restore_id
    assert [n["name"] for n in document["nodes"]] == list(NODES)
    # Nothing was cloned, mounted or imported; nothing recorded.
    assert fakes.events == [] and harness.catalog.list_table_restores() == []


def test_an_unconfirmed_cluster_or_a_refused_plan_is_refused_before_anything_is_made(
    harness: Harness, fakes: Fakes
) -> None:
    error = rpc_error(
        harness.stub().StartTableRestore,
        pb.StartTableRestoreRequest(**request(), confirm_cluster="edge"),
    )
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert reason_of(error) == "RESTORE_REFUSED"
    assert "'edge' is not 'prod'" in (error.details() or "")

    fakes.cql.views["shop.orders"] = ("orders_by_note",)
    error = rpc_error(
        harness.stub().StartTableRestore,
        pb.StartTableRestoreRequest(**request(), confirm_cluster="prod"),
    )
    assert reason_of(error) == "RESTORE_REFUSED"
    assert "materialized view shop.orders_by_note" in (error.details() or "")
    assert harness.coordinator.leases.holder("prod") is None
    assert fakes.events == [] and harness.catalog.list_table_restores() == []


def test_bad_names_are_invalid_arguments(harness: Harness, fakes: Fakes) -> None:
    for fields in (
        request(keyspace="shop; DROP"),
        request(as_keyspace="shop"),
        {"resume_id": "../x", "confirm_cluster": "prod"},
        {**request(), "abort_id": "tr-20261124-030000-abcd"},
    ):
        error = rpc_error(harness.stub().StartTableRestore, pb.StartTableRestoreRequest(**fields))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, fields


def test_a_run_through_the_api_holds_the_cluster_and_records_the_restore(
    harness: Harness, fakes: Fakes
) -> None:
    fakes.go.clear()
    operation = harness.stub().StartTableRestore(
        pb.StartTableRestoreRequest(
            **request(),
            confirm_cluster="prod",
            table_restore_id="tr-20261124-050000-00aa",
            requested_by="alice",
        ),
        timeout=30,
    )
    assert operation.kind == types_pb2.OPERATION_KIND_RESTORE
    stream = harness.stub().WatchOperation(
        pb.WatchOperationRequest(operation_id=operation.operation_id), timeout=30
    )
    first = next(stream)  # the watch is attached: the run may go on
    fakes.go.set()
    updates = [first, *stream]
    assert updates[-1].state == types_pb2.OPERATION_STATE_SUCCEEDED, updates[-1]
    assert updates[-1].message == "table restore tr-20261124-050000-00aa: succeeded"
    assert any(u.message.startswith("n2: import") for u in updates)
    assert fakes.held and all(
        h is not None
        and h.kind is RunKind.TABLE_RESTORE
        and h.run_id == "tr-20261124-050000-00aa"
        and h.backup_id == BACKUP
        for h in fakes.held
    )
    assert harness.coordinator.leases.holder("prod") is None
    record = harness.catalog.get_table_restore("tr-20261124-050000-00aa")
    assert record.state is TableRestoreState.SUCCEEDED and record.requested_by == "alice"
    # Never drilled: the counts could not be compared, and the report says how to get them.
    assert any(f"ringsnap drill {BACKUP} --cluster prod" in w for w in record.warnings)
    found = harness.stub().GetTableRestore(
        pb.GetTableRestoreRequest(table_restore_id=record.id), timeout=10
    )
    assert record_of(found).verification == record.verification


def test_the_cli_through_the_daemon_plans_runs_and_resumes_a_failed_restore(
    harness: Harness, fakes: Fakes
) -> None:
    target = Target(harness.address, harness.token_file, "test")
    dry = remote.table_restore(target, options(dry_run=True))
    assert isinstance(dry, dict) and dry["refusals"] == [] and fakes.events == []

    fakes.agents["n3"].fail["import:shop.orders"] = RuntimeError("nodetool import: disk full")
    with pytest.raises(TableRestoreFailed) as failed:
        remote.table_restore(target, options())
    record = failed.value.record
    assert record is not None and record.state is TableRestoreState.FAILED
    assert "disk full" in record.error and record.next_action.startswith("import")
    assert harness.coordinator.leases.holder("prod") is None

    resumed = remote.table_restore(target, options(backup_id=None, resume=record.id))
    assert not isinstance(resumed, dict)
    assert resumed.id == record.id and resumed.state is TableRestoreState.SUCCEEDED
    # The resume imported only where it had failed.
    imports = [e for e in fakes.events if e.endswith(":import:shop.orders")]
    assert (
        imports.count("n3:import:shop.orders") == 2 and imports.count("n1:import:shop.orders") == 1
    )


def test_a_plan_is_a_viewers_read_and_a_start_resume_or_abort_an_operators_call() -> None:
    service = "/ringsnap.api.v1.CoordinatorService/"
    plan = pb.PlanTableRestoreRequest(**request())
    assert access.required_role(service + "PlanTableRestore", plan) is access.Role.VIEWER
    for start in (
        pb.StartTableRestoreRequest(**request(), confirm_cluster="prod"),
        pb.StartTableRestoreRequest(resume_id="tr-20261124-050000-00aa"),
        pb.StartTableRestoreRequest(abort_id="tr-20261124-050000-00aa"),
    ):
        assert access.required_role(service + "StartTableRestore", start) is access.Role.OPERATOR


def test_ringsnap_restore_keyspace_goes_through_the_daemon_holding_the_catalog(
    harness: Harness, fakes: Fakes
) -> None:
    """The command as the operator types it, with the daemon's own config: the catalog is locked
    by the daemon, so plan, run and report come from the daemon; same JSON, same exit code."""
    from typer.testing import CliRunner

    from ringsnap.coordinator.api.token import TOKEN_FILE_ENV
    from ringsnap.coordinator.cli import restore as restore_cli
    from ringsnap.coordinator.cli.client import ADDRESS_ENV, CONFIG_ENV, REMOTE_ENV
    from tests.support.coordinator_config import write_config

    from .conftest import config_data

    data = config_data(harness.tmp)
    data["coordinator"]["listen"] = harness.address
    config = write_config(harness.tmp / "coordinator.toml", data)
    app = typer.Typer(pretty_exceptions_enable=False)
    app.callback()(lambda: None)
    app.command("restore")(restore_cli.restore_command)
    env = {ADDRESS_ENV: "", TOKEN_FILE_ENV: "", CONFIG_ENV: "", REMOTE_ENV: "", "COLUMNS": "200"}

    def restore(*args: str) -> Any:
        return CliRunner().invoke(
            app, ["restore", *args, "--config", str(config), "-o", "json"], env=env
        )

    planned = restore(BACKUP, "--keyspace", "shop", "--table", "orders", "--dry-run")
    assert planned.exit_code == 0, planned.output
    assert json.loads(planned.stdout)["plan"]["refusals"] == [] and fakes.events == []

    done = restore(BACKUP, "--keyspace", "shop", "--table", "orders", "--yes")
    assert done.exit_code == 0, done.output
    document = json.loads(done.stdout)["table_restore"]
    assert document["state"] == "succeeded"
    assert harness.catalog.get_table_restore(document["id"]).state is TableRestoreState.SUCCEEDED
    assert any(e.endswith(":import:shop.orders") for e in fakes.events)
