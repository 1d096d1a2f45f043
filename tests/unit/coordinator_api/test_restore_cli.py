"""`ringsnap restore` while the coordinator daemon holds the catalog: it goes through the daemon's
API with the same plan, confirmation, progress, report and exit codes; with the catalog locked and
no daemon answering, it refuses as before.

The daemon is conftest's harness (which holds its catalog's lock, as the daemon does), its restore
sessions on the fakes of `restore_rig`.
"""

from __future__ import annotations

import concurrent.futures
import json
import socket
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner, Result

from ringsnap.coordinator.api.token import TOKEN_FILE_ENV
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.cli import console
from ringsnap.coordinator.cli import restore as restore_cli
from ringsnap.coordinator.cli.client import ADDRESS_ENV, CONFIG_ENV, ExitCode
from ringsnap.coordinator.model import RestoreState
from ringsnap.plugins.errors import DriverError
from tests.support.coordinator_config import write_config

from .conftest import Harness, config_data
from .restore_rig import RestoreRig, install, install_hosted

RECENT = datetime.now(UTC) - timedelta(hours=2)


@pytest.fixture
def app() -> typer.Typer:
    root = typer.Typer(pretty_exceptions_enable=False)

    @root.callback()
    def _root() -> None:
        """ringsnap (test root)."""

    root.command("restore")(restore_cli.restore_command)
    return root


@pytest.fixture
def rig(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> RestoreRig:
    harness.seed_backup("rs-1", RECENT)
    return install(harness, monkeypatch)


def flat(text: str) -> str:
    return " ".join(text.split())


def run(app: typer.Typer, *args: str, input: str | None = None) -> Result:
    env = {ADDRESS_ENV: "", TOKEN_FILE_ENV: "", CONFIG_ENV: "", "COLUMNS": "200"}
    return CliRunner().invoke(app, ["restore", *args], input=input, env=env, catch_exceptions=False)


def test_restore_through_the_daemon_prints_plan_progress_and_report(
    app: typer.Typer, harness: Harness, rig: RestoreRig, full_config: Path
) -> None:
    rig.hold_stop()  # the restore waits in its stop until the CLI has followed it there
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        running = pool.submit(run, app, "rs-1", "--yes", "--config", str(full_config))
        rig.wait_stopping()
        time.sleep(0.5)
        rig.release_stop()
        result = running.result(60)
    assert result.exit_code == ExitCode.OK, result.output
    (record,) = harness.catalog.list_restores()
    assert record.state is RestoreState.PROVEN
    stderr, stdout = flat(result.stderr), flat(result.stdout)
    assert f"the coordinator daemon at {harness.address} holds the catalog" in stderr
    for expected in (
        f"Restore plan {record.id}: backup rs-1 of cluster prod",
        "revert mode, the whole ring",
        "a1:n1-data (data) /data rs-1",
        "Destroyed: - every write made since the backup on the whole ring",
        "Expected duration: unknown",
        f"restore {record.id} started in the coordinator",
    ):
        assert expected in stderr, expected
    progress = [line.split() for line in result.stderr.splitlines() if "..." in line]
    assert any(line[-2:] == ["stopped", "..."] for line in progress), result.stderr
    assert all(line[1] in ("ms", "s") for line in progress), "each line shows the elapsed time"
    assert f"Restore {record.id} of backup rs-1 (revert): PROVEN" in stdout
    assert "n1 PROVEN (last step: verified)" in stdout
    assert record.requested_by, "the operator is recorded"


def test_exit_codes_not_proven_refused_failed_and_resumed(
    app: typer.Typer, harness: Harness, rig: RestoreRig, full_config: Path
) -> None:
    rig.ring.present.discard("canary-n2")
    result = run(app, "rs-1", "--yes", "--config", str(full_config))
    assert result.exit_code == ExitCode.NOT_PROVEN, result.output
    assert "NOT-PROVEN in" in result.stdout and "n2 NOT-PROVEN" in flat(result.stdout)
    rig.ring.present.add("canary-n2")

    rig.agents["n3"].unreachable = True
    result = run(app, "rs-1", "--yes", "--config", str(full_config))
    assert result.exit_code == ExitCode.REFUSED, result.output
    assert "refused: node n3: the agent cannot be reached" in flat(result.stderr)
    assert "error: the plan refused" in flat(result.stderr)
    document = json.loads(
        run(app, "rs-1", "--yes", "--config", str(full_config), "-o", "json").stdout
    )
    assert any("node n3" in line for line in document["plan"]["refusals"])
    rig.agents["n3"].unreachable = False

    rig.array.fail_revert = DriverError("HTTP 500: revert failed", array="a1")
    result = run(app, "rs-1", "--yes", "--config", str(full_config))
    assert result.exit_code == ExitCode.FAILED, result.output
    assert "revert failed" in flat(result.stderr)
    assert "ringsnap restore --resume ID" in flat(result.stderr)
    failed = harness.catalog.list_restores(limit=1)[0]
    assert failed.state is RestoreState.FAILED
    # The report says what each node was left in and the exact next step.
    assert "UNMOUNTED" in flat(result.stdout), result.stdout
    assert f"--resume {failed.id}" in flat(result.stdout)

    rig.array.fail_revert = None
    result = run(app, "--resume", failed.id, "--config", str(full_config), "-o", "json")
    assert result.exit_code == ExitCode.OK, result.output
    document = json.loads(result.stdout)
    assert document["restore"]["id"] == failed.id
    assert document["restore"]["state"] == "proven"
    assert [n["verdict"] for n in document["restore"]["nodes"]] == ["proven"] * 3


def test_confirmation_through_the_daemon(
    app: typer.Typer,
    harness: Harness,
    rig: RestoreRig,
    full_config: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    result = run(app, "rs-1", "--config", str(full_config))
    assert result.exit_code == ExitCode.USAGE, result.output
    assert "no terminal to ask on" in flat(result.stderr)
    assert "Restore plan rr-" in result.stderr, "the plan is printed first"

    monkeypatch.setattr(console, "_interactive", lambda: True)
    result = run(app, "rs-1", "--config", str(full_config), input="edge\n")
    assert result.exit_code == ExitCode.REFUSED, result.output
    assert "nothing was done: 'edge' is not 'prod'" in flat(result.stderr)
    assert not rig.stops() and not harness.catalog.list_restores()
    assert harness.coordinator.leases.holder("prod") is None

    result = run(app, "rs-1", "--config", str(full_config), input="prod\n")
    assert result.exit_code == ExitCode.OK, result.output
    assert "Type the cluster's name (prod)" in result.stderr
    (record,) = harness.catalog.list_restores()
    assert record.state is RestoreState.PROVEN


def test_dry_run_through_the_daemon_changes_nothing(
    app: typer.Typer, harness: Harness, rig: RestoreRig, full_config: Path
) -> None:
    result = run(app, "rs-1", "--dry-run", "--nodes", "n2", "--config", str(full_config))
    assert result.exit_code == ExitCode.OK, result.output
    assert "n2" in result.stderr and "1 node(s) alone" in flat(result.stderr)
    assert "nodetool repair -full" in flat(result.stderr)

    result = run(app, "rs-1", "--dry-run", "--config", str(full_config), "--output", "json")
    assert result.exit_code == ExitCode.OK, result.output
    plan = json.loads(result.stdout)["plan"]
    assert plan["backup_id"] == "rs-1" and plan["cluster"] == "prod"
    assert plan["whole_ring"] is True and plan["mode"] == "revert"
    assert plan["snapshots"] == {"a1": "rs-1"}
    assert plan["nodes"][0]["volumes"][0] == {
        "array": "a1",
        "volume": "n1-data",
        "role": "data",
        "mount_point": "/data",
        "attached_volume": "",
    }
    assert not rig.stops() and not harness.catalog.list_restores()

    result = run(app, "rs-none", "--dry-run", "--config", str(full_config))
    assert result.exit_code == ExitCode.NOT_FOUND
    assert "no backup 'rs-none'" in flat(result.stderr)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_locked_catalog_without_an_answering_daemon_is_refused(
    app: typer.Typer, tmp_path: Path
) -> None:
    data = config_data(tmp_path)
    data["coordinator"]["listen"] = f"127.0.0.1:{_closed_port()}"
    config = write_config(tmp_path / "coordinator.toml", data)
    with Catalog(data["coordinator"]["catalog"]):  # another restore holds it
        result = run(app, "rs-1", "--dry-run", "--config", str(config))
        assert result.exit_code == ExitCode.REFUSED, result.output
        assert "is held by another process" in flat(result.stderr)
        document = json.loads(run(app, "rs-1", "--config", str(config), "--output", "json").stdout)
        assert document["error"]["reason"] == "CATALOG_LOCKED"


def test_help_says_the_restore_runs_in_the_daemon_while_it_runs(app: typer.Typer) -> None:
    result = CliRunner().invoke(app, ["restore", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    text = flat(result.stdout)
    assert "While the daemon runs" in text and "runs in the daemon instead, through its API" in text
    assert "Ctrl-C stops following, not the restore" in text


def test_with_the_catalog_free_the_restore_runs_in_this_process(
    app: typer.Typer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The path the daemon's absence takes: this process hosts the coordinator's service, rendered
    by the same functions."""
    config, rig = install_hosted(tmp_path, monkeypatch)
    data = config_data(tmp_path)

    result = run(app, "rs-1", "--yes", "--config", str(config))
    assert result.exit_code == ExitCode.OK, result.output
    assert "holds the catalog" not in result.stderr
    assert "Restore plan rr-" in result.stderr and "a1:n1-data (data)" in result.stderr
    assert "n1: stopped done" in result.stderr, "in-process, every progress line shows"
    assert "of backup rs-1 (revert): PROVEN" in flat(result.stdout)

    rig.ring.present.discard("canary-n1")
    result = run(app, "rs-1", "--yes", "--config", str(config))
    assert result.exit_code == ExitCode.NOT_PROVEN, result.output
    with Catalog(data["coordinator"]["catalog"]) as catalog:
        states = [r.state for r in catalog.list_restores()]
    assert states == [RestoreState.NOT_PROVEN, RestoreState.PROVEN]


def test_a_bad_config_is_a_usage_error_naming_the_file(app: typer.Typer, tmp_path: Path) -> None:
    broken = tmp_path / "coordinator.toml"
    broken.write_text("[coordinator]\ncolour = 'red'\n")
    result = run(app, "rs-1", "--yes", "--config", str(broken))
    assert result.exit_code == ExitCode.USAGE, result.output
    assert str(broken) in flat(result.stderr) and "colour" in flat(result.stderr)
