"""Giving up a restore from S3 and purging the copies, through the daemon (the harness's real
coordinator and server; its restore sessions on the fakes of `restore_rig` and of the agents' S3
calls; the purge against moto's in-process S3 filled by the real export).

- `ringsnap restore --abort rr-...` through the daemon (AbortRestore): every node's staging
  removed, the node the restore stopped started again, the record aborted; a wrong confirmation and
  a busy cluster refused before anything is asked.
- `ringsnap export purge` through the daemon: PlanPurge (a viewer's dry run) lists and deletes
  nothing, PurgeExports (an operator's) deletes exactly the unreferenced components in one request
  as an operation of kind export, refused while an export of the cluster runs or the cluster is
  held.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
import typer
from moto import mock_aws
from typer.testing import CliRunner

from ringsnap.agent.manifest import manifest
from ringsnap.agent.s3.client import make_client
from ringsnap.agent.s3.export import export_node
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.api.v1 import coordinator_pb2 as pb
from ringsnap.api.v1 import types_pb2
from ringsnap.coordinator.api import access
from ringsnap.coordinator.api.token import TOKEN_FILE_ENV
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.cli.client import ADDRESS_ENV, CONFIG_ENV, ExitCode
from ringsnap.coordinator.cli.export import export_command
from ringsnap.coordinator.cli.restore import restore_command
from ringsnap.coordinator.export.model import ExportRecord, ExportState, NodeExport
from ringsnap.coordinator.model import (
    RestoreMode,
    RestoreNode,
    RestoreRecord,
    RestoreState,
    RestoreStep,
)
from ringsnap.coordinator.restore import abort as restore_abort
from ringsnap.coordinator.runs.lease import Lease, RunKind
from ringsnap.sandbox.sstables import table_directory, write_sstable
from tests.support.coordinator_config import write_config
from tests.support.coordinator_rpc import reason_of, rpc_error, watch_to_end

from .conftest import Harness, config_data
from .restore_rig import S3Rig, fake_arrays, install_s3

RESTORE_ID = "rr-20261124-050000-abcd"
SERVICE = "/ringsnap.api.v1.CoordinatorService/"
S3 = S3Settings(bucket="ringsnap-copies", prefix="copies/")


def _failed_restore() -> RestoreRecord:
    """A restore from S3 left half-way: n1 downloaded, n2 stopped before its install, n3 not."""
    return RestoreRecord(
        id=RESTORE_ID,
        cluster="prod",
        backup_id="rs-1",
        mode=RestoreMode.S3,
        nodes=(
            RestoreNode(name="n1", step=RestoreStep.DOWNLOADED),
            RestoreNode(name="n2", step=RestoreStep.STOPPED),
            RestoreNode(name="n3"),
        ),
        whole_ring=True,
        requested_by="me",
        started_at=datetime.now(UTC) - timedelta(minutes=30),
        state=RestoreState.FAILED,
        error="node n3: downloaded: S3 endpoint unreachable",
    )


@pytest.fixture
def rig(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> S3Rig:
    return install_s3(harness, monkeypatch)


@pytest.fixture
def aborting(harness: Harness, rig: S3Rig, monkeypatch: pytest.MonkeyPatch) -> S3Rig:
    monkeypatch.setattr(restore_abort, "open_restore_session", rig.open_session)
    harness.catalog.save_restore(_failed_restore())
    return rig


def _cli(app_command: Any, *args: str) -> Any:
    app = typer.Typer(pretty_exceptions_enable=False)

    @app.callback()
    def _root() -> None:
        """ringsnap (test root)."""

    app.command("run")(app_command)
    env = {ADDRESS_ENV: "", TOKEN_FILE_ENV: "", CONFIG_ENV: "", "COLUMNS": "200"}
    return CliRunner().invoke(app, ["run", *args], env=env, catch_exceptions=False)


def test_the_cli_gives_a_restore_up_through_the_daemon(
    harness: Harness, aborting: S3Rig, full_config: Path
) -> None:
    result = _cli(restore_command, "--abort", RESTORE_ID, "--yes", "--config", str(full_config))

    assert result.exit_code == ExitCode.OK, result.output
    record = harness.catalog.get_restore(RESTORE_ID)
    assert record.state is RestoreState.ABORTED
    discards = sorted(e for e in aborting.events if e.endswith(":discard-staging"))
    assert discards == ["n1:discard-staging", "n2:discard-staging", "n3:discard-staging"]
    assert [e for e in aborting.events if e.startswith("start ")] == ["start n2"]
    assert not any(e.startswith("stop ") for e in aborting.events)
    stdout = " ".join(result.stdout.split())
    assert f"Restore {RESTORE_ID} of backup rs-1 (s3): ABORTED" in stdout
    assert "node n1: removed /data/.ringsnap-s3/rr-1 (12 files, 3.0 MiB)" in stdout
    assert "node n2: Cassandra started again" in stdout
    assert f"the coordinator daemon at {harness.address} holds the catalog" in result.stderr


def test_abort_restore_is_refused_before_anything_when_unconfirmed_or_busy(
    harness: Harness, aborting: S3Rig
) -> None:
    stub = harness.stub()
    refused = rpc_error(
        stub.AbortRestore, pb.AbortRestoreRequest(restore_id=RESTORE_ID, confirm_cluster="edge")
    )
    assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert reason_of(refused) == "RESTORE_REFUSED"

    with harness.coordinator.leases.hold(Lease("prod", RunKind.BACKUP, asked_by="schedule:test")):
        busy = rpc_error(
            stub.AbortRestore,
            pb.AbortRestoreRequest(restore_id=RESTORE_ID, confirm_cluster="prod"),
        )
    assert busy.code() == grpc.StatusCode.ABORTED
    assert aborting.events == [], "a refused abort asked a node"
    assert harness.catalog.get_restore(RESTORE_ID).state is RestoreState.FAILED

    operation = stub.AbortRestore(
        pb.AbortRestoreRequest(restore_id=RESTORE_ID, confirm_cluster="prod"), timeout=10
    )
    final = watch_to_end(harness, operation.operation_id)[-1]
    assert final.state == types_pb2.OPERATION_STATE_SUCCEEDED, final
    assert final.kind == types_pb2.OPERATION_KIND_RESTORE
    assert f"restore {RESTORE_ID} of backup rs-1: aborted" in final.message
    again = stub.GetRestore(pb.GetRestoreRequest(restore_id=RESTORE_ID), timeout=10)
    assert again.state == pb.RESTORE_STATE_ABORTED


def test_the_cli_in_its_own_process_refuses_a_restore_installed_somewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a daemon (the catalog free), from the real catalog: a restore from S3 installed on a
    node cannot be given up, and nothing is asked of any node (no agent is reachable here)."""
    fake_arrays(monkeypatch)  # the coordinator this process hosts opens them; none is asked
    data = config_data(tmp_path)
    config = write_config(tmp_path / "coordinator.toml", data)
    installed = replace(
        _failed_restore(),
        nodes=(
            RestoreNode(name="n1", step=RestoreStep.RESTORED),
            RestoreNode(name="n2", step=RestoreStep.STOPPED),
        ),
    )
    Path(data["coordinator"]["catalog"]).parent.mkdir(parents=True, exist_ok=True)
    with Catalog(Path(data["coordinator"]["catalog"])) as catalog:
        catalog.save_restore(installed)

    result = _cli(
        restore_command, "--abort", RESTORE_ID, "--yes", "--config", str(config), "-o", "json"
    )

    assert result.exit_code == ExitCode.REFUSED, result.output
    message = json.loads(result.stdout)["error"]["message"]
    assert f"restore {RESTORE_ID} installed the backup on node n1" in message
    assert f"ringsnap restore --resume {RESTORE_ID}" in message
    with Catalog(Path(data["coordinator"]["catalog"])) as catalog:
        assert catalog.get_restore(RESTORE_ID).state is RestoreState.FAILED


# -- the purge ---------------------------------------------------------------------------------------


def _keys(s3: Any, under: str) -> set[str]:
    return {
        item["Key"]
        for page in s3.get_paginator("list_objects_v2").paginate(
            Bucket=S3.bucket, Prefix=S3.prefix + under
        )
        for item in page.get("Contents", ())
    }


@pytest.fixture
def bucket(harness: Harness, tmp_path: Path) -> Iterator[tuple[Any, set[str], set[str]]]:
    """moto's S3 holding n1's copy of rs-1 (kept: in the catalog, exported) and of rs-old (no
    record: its components are referenced by no kept copy); the daemon's config names it.
    Yields the client, the kept copy's component keys and the unreferenced ones."""
    with mock_aws():
        client = make_client(S3)
        client.create_bucket(Bucket=S3.bucket)
        root = tmp_path / "data"
        table = table_directory(root)
        write_sstable(table, 1, 5_000)
        export_node(
            client,
            S3,
            backup_id="rs-old",
            node="n1",
            data_directories=[root],
            manifest=lambda: manifest([root], cache=None),
        )
        old = _keys(client, "sstables/")
        for path in table.glob("nb-1-big-*"):
            path.unlink()  # compacted away before rs-1
        write_sstable(table, 2, 5_000)
        harness.seed_backup("rs-1", datetime.now(UTC) - timedelta(hours=2))
        export_node(
            client,
            S3,
            backup_id="rs-1",
            node="n1",
            data_directories=[root],
            manifest=lambda: manifest([root], cache=None),
        )
        harness.catalog.save_export(
            ExportRecord(
                backup_id="rs-1",
                cluster="prod",
                started_at=datetime.now(UTC) - timedelta(hours=1),
                nodes=(NodeExport("n1", exported=True),),
                state=ExportState.SUCCEEDED,
            )
        )
        kept = _keys(client, "sstables/") - old
        harness.coordinator.config = harness.coordinator.config.model_copy(update={"s3": S3})
        yield client, kept, old


def _request(**changes: Any) -> pb.PurgeExportsRequest:
    return pb.PurgeExportsRequest(cluster="prod", min_age_seconds=0, **changes)


def test_purge_through_the_daemon_dry_run_then_exactly_the_unreferenced_in_one_request(
    harness: Harness, bucket: tuple[Any, set[str], set[str]]
) -> None:
    client, kept, old = bucket
    assert len(old) == 8 and len(kept) == 8
    stub = harness.stub()
    assert access.required_role(SERVICE + "PlanPurge", _request()) is access.Role.VIEWER
    assert access.required_role(SERVICE + "PurgeExports", _request()) is access.Role.OPERATOR

    dry = stub.PlanPurge(_request(), timeout=30)
    assert dry.dry_run and dry.deleted == 8 and dry.referenced == 8 and not dry.operation_id
    assert _keys(client, "sstables/") == kept | old, "a dry run deleted something"

    done = stub.PurgeExports(_request(), timeout=30)
    assert not done.dry_run and done.deleted == 8 and done.delete_requests == 1
    assert done.copies_kept == 1 and done.operation_id
    assert _keys(client, "sstables/") == kept
    operation = stub.GetOperation(pb.GetOperationRequest(operation_id=done.operation_id))
    assert operation.kind == types_pb2.OPERATION_KIND_EXPORT
    assert operation.state == types_pb2.OPERATION_STATE_SUCCEEDED
    assert "8 unreferenced components deleted" in operation.message

    # Young components are kept by default (an export in progress uploads before its manifest).
    assert stub.PlanPurge(pb.PurgeExportsRequest(cluster="prod"), timeout=30).deleted == 0


def test_purge_is_refused_while_an_export_runs_or_the_cluster_is_held(
    harness: Harness, bucket: tuple[Any, set[str], set[str]]
) -> None:
    client, kept, old = bucket
    stub = harness.stub()
    with harness.coordinator.leases.hold(Lease("prod", RunKind.BACKUP, asked_by="schedule:test")):
        busy = rpc_error(stub.PurgeExports, _request())
    assert busy.code() == grpc.StatusCode.ABORTED

    running = harness.catalog.get_export("rs-1")
    harness.catalog.save_export(replace(running, state=ExportState.RUNNING))
    for method in (stub.PlanPurge, stub.PurgeExports):
        refused = rpc_error(method, _request())
        assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert reason_of(refused) == "EXPORT_REFUSED"
        assert "an export of cluster prod is running" in str(refused.details())
    assert _keys(client, "sstables/") == kept | old


def test_the_cli_purges_through_the_daemon(
    harness: Harness, bucket: tuple[Any, set[str], set[str]], full_config: Path
) -> None:
    client, kept, old = bucket
    args = ("purge", "--cluster", "prod", "--min-age", "0", "--config", str(full_config))
    dry = _cli(export_command, *args, "--dry-run", "-o", "json")
    assert dry.exit_code == ExitCode.OK, dry.output
    assert json.loads(dry.stdout)["purge"]["components"]["deleted"] == 8
    assert _keys(client, "sstables/") == kept | old

    done = _cli(export_command, *args)
    assert done.exit_code == ExitCode.OK, done.output
    assert "deleted 8" in " ".join(done.stdout.split())
    assert _keys(client, "sstables/") == kept
