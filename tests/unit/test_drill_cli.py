"""`ringsnap drill`'s own checks before anything is planned: a backup or --latest (one of them),
--nodes or --ring (not both), exit code 2 and a message that says what to do."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from ringsnap.coordinator.cli import drill as drill_cli
from ringsnap.coordinator.drill.model import DrillState


@pytest.fixture
def app() -> typer.Typer:
    root = typer.Typer(pretty_exceptions_enable=False)

    @root.callback()
    def _root() -> None:
        """ringsnap (test root)."""

    root.command("drill")(drill_cli.drill_command)
    return root


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--cluster", "c1"], "name a backup to drill, or --latest (not both)"),
        (["rs-1", "--latest", "--cluster", "c1"], "name a backup to drill, or --latest"),
        (["--latest", "--cluster", "c1", "--ring", "--nodes", "n1"], "exclude each other"),
    ],
)
def test_usage_errors_exit_2_and_say_why(app: typer.Typer, args: list[str], expected: str) -> None:
    result = CliRunner().invoke(app, ["drill", *args, "-o", "json"])
    assert result.exit_code == 2, result.output
    error = json.loads(result.stdout)["error"]
    assert expected in error["message"] and error["reason"] == "INVALID_ARGUMENT"


def test_every_drill_state_has_its_exit_code() -> None:
    assert {state: int(code) for state, code in drill_cli.EXIT_CODES.items()} == {
        DrillState.PROVEN: 0,
        DrillState.NOT_PROVEN: 6,
        DrillState.FAILED: 4,
        DrillState.INTERRUPTED: 130,
        DrillState.RUNNING: 130,
    }


def test_the_report_shows_each_nodes_row_counts_for_table_restores(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from datetime import UTC, datetime

    from ringsnap.coordinator.drill.model import DrillNode, DrillRecord, DrillVerdict

    record = DrillRecord(
        id="dr-20261124-090000-00aa",
        cluster="prod",
        backup_id="rs-1",
        trigger="cli:test",
        requested_by="test",
        started_at=datetime(2026, 11, 24, 9, tzinfo=UTC),
        nodes=(
            DrillNode(
                name="n1",
                verdict=DrillVerdict.PROVEN,
                row_counts=(("shop.orders", 1200), ("shop.users", 0)),
            ),
            DrillNode(name="n2", verdict=DrillVerdict.PROVEN),
        ),
        state=DrillState.PROVEN,
    )
    drill_cli.print_report(record)
    shown = capsys.readouterr().out
    assert "rows over its primary ranges (for table restores): shop.orders 1200, shop.users 0" in (
        shown
    )
    assert shown.count("rows over its primary ranges") == 1
