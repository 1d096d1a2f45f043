"""`ringsnap restore ... --keyspace`: its arguments, the plan and report it prints, its JSON and
its exit codes (the run itself: test_table_restore_workflow and the integration test)."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.cli.client import ExitCode
from ringsnap.coordinator.cli.restore import restore_command
from ringsnap.coordinator.cli.restore_report import open_restores_lines
from ringsnap.coordinator.cli.table_restore import (
    exit_code_of,
    parse_target,
    print_plan,
    print_report,
)
from ringsnap.coordinator.table_restore.documents import plan_document, record_document
from ringsnap.coordinator.table_restore.model import (
    CloneRecord,
    NodeProgress,
    NodeTables,
    Step,
    TableRestoreRecord,
    TableRestoreState,
)
from ringsnap.coordinator.table_restore.plan import TableRestorePlan
from ringsnap.errors import ValidationError
from tests.support.table_restore_world import DROPPED_ORDERS

RECORD = TableRestoreRecord(
    id="tr-20261124-030000-abcd",
    cluster="prod",
    backup_id="rs-1",
    requested_by="alice",
    started_at=datetime(2026, 11, 24, 3, tzinfo=UTC),
    targets=(DROPPED_ORDERS,),
    nodes=(
        NodeProgress(
            name="node1",
            staging_directory="/data/.ringsnap-staging/tr-20261124-030000-abcd",
            free_bytes=10**9,
            tables=(NodeTables(table="orders", sstables=3, bytes=4096),),
        ),
    ),
    clones=(CloneRecord(node="node1", array="a1", volume="node1_data", clone="node1_data_tr"),),
)


def test_as_takes_keyspace_dot_table() -> None:
    assert parse_target("shop.orders_copy") == ("shop", "orders_copy")
    for bad in ("orders", "shop.bad name", "shop."):
        with pytest.raises(ValidationError):
            parse_target(bad)


def test_the_plan_and_report_name_what_changes_and_what_to_do(
    capsys: pytest.CaptureFixture[str],
) -> None:
    document = plan_document(TableRestorePlan(RECORD, refusals=("node node2: disk full",)))
    assert json.loads(json.dumps(document))["refusals"] == ["node node2: disk full"]
    print_plan(document)
    out = " ".join(capsys.readouterr().err.split())
    assert "created again with id 5a1c395e-b41f-11e5-9f22-ba0be0483c18" in out
    assert "refused: node node2: disk full" in out


def test_a_failed_record_says_its_next_step_in_json_and_text(
    capsys: pytest.CaptureFixture[str],
) -> None:
    failed = replace(RECORD, state=TableRestoreState.FAILED, step=Step.STAGE, error="disk full")
    document = record_document(failed)
    assert document["next_step"] == "unmount"
    assert document["clones"][0]["clone"] == "node1_data_tr"
    print_report(failed)
    out = " ".join(capsys.readouterr().out.split())
    assert "clone left: a1:node1_data_tr" in out
    assert "next step: unmount the clones" in out
    assert f"ringsnap restore --resume {RECORD.id}" in out


@pytest.mark.parametrize(
    ("state", "code"),
    [
        (TableRestoreState.SUCCEEDED, ExitCode.OK),
        (TableRestoreState.NOT_PROVEN, ExitCode.NOT_PROVEN),
        (TableRestoreState.FAILED, ExitCode.FAILED),
        (TableRestoreState.ABORTED, ExitCode.OK),
    ],
)
def test_exit_codes_are_the_restores(state: TableRestoreState, code: ExitCode) -> None:
    assert exit_code_of(replace(RECORD, state=state)) is code


def test_a_table_restore_without_a_backup_is_a_usage_error() -> None:
    app = typer.Typer()
    app.command()(restore_command)
    result = CliRunner().invoke(app, ["--keyspace", "shop", "--output", "json"])
    assert result.exit_code == ExitCode.USAGE, result.output
    assert "BACKUP --keyspace K" in json.loads(result.output)["error"]["message"]


def test_status_lists_an_unfinished_table_restore_with_its_next_step(tmp_path: Path) -> None:
    catalog_file = tmp_path / "catalog.db"
    with Catalog(catalog_file) as catalog:
        catalog.save_table_restore(
            replace(RECORD, state=TableRestoreState.FAILED, step=Step.SCHEMA, error="no")
        )
        catalog.save_table_restore(
            replace(RECORD, id="tr-20261124-040000-abcd", state=TableRestoreState.SUCCEEDED)
        )
    config = tmp_path / "coordinator.toml"
    config.write_text(f'[coordinator]\ncatalog = "{catalog_file}"\n')
    lines = list(open_restores_lines(config))
    assert len(lines) == 1
    assert lines[0].startswith(f"table restore {RECORD.id} of backup rs-1 (prod): failed: no")
    assert "import the staged SSTables" in lines[0]
