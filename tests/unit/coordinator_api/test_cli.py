"""`ringsnap` verbs through typer's CliRunner against a real coordinator server (see conftest):
output for people and scripts, paging, confirmations, exit codes, an unreachable coordinator."""

from __future__ import annotations

import concurrent.futures
import json
import socket
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner, Result

from ringsnap.coordinator.api.token import TOKEN_FILE_ENV
from ringsnap.coordinator.cli import commands, render
from ringsnap.coordinator.cli.client import ADDRESS_ENV, ExitCode
from ringsnap.coordinator.runs.lease import Lease, RunKind
from ringsnap.coordinator.runs.resources import (
    Resource,
    ResourceType,
    array_snapshot,
    native_tag,
)

from .conftest import ARRAY, Harness, fail_snapshots

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def app() -> typer.Typer:
    root = typer.Typer(pretty_exceptions_enable=False)

    @root.callback()
    def _root() -> None:
        """ringsnap (test root)."""

    commands.register(root)
    return root


@pytest.fixture
def cli_config(harness: Harness) -> Path:
    """What an operator passes as --config: the coordinator's own file (its [coordinator] table)."""
    path = harness.tmp / "coordinator.toml"
    path.write_text(
        "[coordinator]\n"
        f'listen = "{harness.address}"\n'
        f'catalog = "{harness.config.coordinator.catalog}"\n'
        "\n[tls]\n"
        'cert_file = "/nonexistent/is/not/read/by/the/cli.crt"\n'
    )
    return path


def flat(text: str) -> str:
    """Output with its line wrapping undone, for substring checks."""
    return " ".join(text.split())


def run(app: typer.Typer, *args: str, input: str | None = None) -> Result:
    env = {ADDRESS_ENV: "", TOKEN_FILE_ENV: ""}
    return CliRunner().invoke(app, list(args), input=input, env=env, catch_exceptions=False)


def run_json(app: typer.Typer, *args: str, code: int = 0) -> Any:
    result = run(app, *args, "--output", "json")
    assert result.exit_code == code, result.output
    return json.loads(result.stdout)


# -- backup ----------------------------------------------------------------------------------------


def test_backup_shows_progress_then_verdict_freeze_window_and_catalog_entry(
    app: typer.Typer, cli_config: Path, harness: Harness
) -> None:
    harness.hold_flush("n2")  # the run waits in its flush phase until the CLI follows it
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        running = pool.submit(
            run, app, "backup", "prod", "--policy", "daily", "--config", str(cli_config)
        )
        harness.wait_flushing("n2")
        time.sleep(0.3)
        harness.release_flush("n2")
        result = running.result(30)
    assert result.exit_code == 0, result.output
    assert "started (operation" in flat(result.stderr)
    progress = [line.split() for line in result.stderr.splitlines()[1:]]
    assert ["flush"] in [line[2:] for line in progress], result.stderr
    assert all(line[1] in ("ms", "s") for line in progress), (
        "each phase line shows the elapsed time"
    )
    for phase in ("plan", "flush", "freeze+snapshot+thaw", "record"):
        assert phase in flat(result.stdout), "the catalog entry lists the phase timings"
    assert "COMPLETE backup rs-" in flat(result.stdout)
    assert "of all 3 nodes" in flat(result.stdout)
    assert "freeze window" in flat(result.stdout) and "slowest freeze" in flat(result.stdout)
    assert "never proven" in flat(result.stdout)
    assert "n1-data" in flat(result.stdout), "the catalog entry lists the nodes' volumes"


def test_backup_json(app: typer.Typer, cli_config: Path) -> None:
    document = run_json(app, "backup", "prod", "--config", str(cli_config))
    assert document["verdict"] == "complete"
    assert document["exit_code"] == 0
    assert document["operation"]["state"] == "OPERATION_STATE_SUCCEEDED"
    assert document["backup"]["state"] == "BACKUP_STATE_COMPLETE"
    assert len(document["backup"]["nodes"]) == 3
    assert document["backup"]["freeze"]["total"].endswith("s")


def test_backup_exit_codes_refused_failed_partial(
    app: typer.Typer, cli_config: Path, harness: Harness
) -> None:
    harness.agents["n3"].unreachable = True
    result = run(app, "backup", "prod", "--config", str(cli_config))
    assert result.exit_code == ExitCode.REFUSED, result.output
    assert "REFUSED" in flat(result.stdout) and "node n3: agent unreachable" in flat(result.stdout)
    assert "Traceback" not in result.output

    document = run_json(app, "backup", "edge", "--config", str(cli_config), code=0)
    assert document["verdict"] == "complete"
    harness.agents["e2"].unreachable = True
    result = run(app, "backup", "edge", "--config", str(cli_config))
    assert result.exit_code == ExitCode.PARTIAL, result.output
    assert "PARTIAL" in flat(result.stdout) and "e2 (agent unreachable" in flat(result.stdout)
    assert "NOT protected" in flat(result.stdout)

    harness.agents["n3"].unreachable = False
    fail_snapshots(harness, "HTTP 500: controller failover")
    result = run(app, "backup", "prod", "--config", str(cli_config))
    assert result.exit_code == ExitCode.FAILED, result.output
    assert "FAILED" in flat(result.stdout) and "controller failover" in flat(result.stdout)
    assert "nodes were thawed" in flat(result.stdout)


def test_backup_of_a_busy_cluster_is_refused(
    app: typer.Typer, cli_config: Path, harness: Harness
) -> None:
    harness.hold_flush("n1")
    first = run_json(app, "backup", "prod", "--no-wait", "--config", str(cli_config))
    harness.wait_flushing("n1")
    try:
        document = run_json(app, "backup", "prod", "--config", str(cli_config), code=3)
        assert document["verdict"] == "refused"
        assert document["operation"]["error_reason"] == "CLUSTER_BUSY"
        assert document["backup"] is None

        status = run(app, "status", "--config", str(cli_config))
        assert status.exit_code == 0
        assert first["operation"]["backup_id"] in status.stdout
        assert "recently skipped" in status.stdout
    finally:
        harness.release_flush("n1")


def test_unknown_cluster_is_a_usage_error(app: typer.Typer, cli_config: Path) -> None:
    result = run(app, "backup", "staging", "--config", str(cli_config))
    assert result.exit_code == ExitCode.USAGE
    assert "unknown cluster 'staging'" in flat(result.stderr)
    assert "Traceback" not in result.output


# -- list / show -----------------------------------------------------------------------------------


def test_list_pages_through_more_than_one_page(
    app: typer.Typer, cli_config: Path, harness: Harness
) -> None:
    for i in range(230):
        harness.seed_backup(f"rs-{i:04d}", T0 + timedelta(minutes=i))
    document = run_json(app, "list", "--limit", "0", "--config", str(cli_config))
    ids = [b["backup_id"] for b in document["backups"]]
    assert ids == [f"rs-{i:04d}" for i in reversed(range(230))]
    assert document["truncated"] is False

    limited = run_json(app, "list", "prod", "--limit", "150", "--config", str(cli_config))
    assert len(limited["backups"]) == 150 and limited["truncated"] is True

    result = run(app, "list", "--config", str(cli_config))
    assert result.exit_code == 0
    lines = [line for line in result.stdout.splitlines() if line.startswith("rs-")]
    assert len(lines) == 50
    assert lines[0].split()[0] == "rs-0229"
    assert "complete" in lines[0] and "never proven" in lines[0] and "3/3" in lines[0]
    assert "--limit 0 lists all" in flat(result.stderr)


def test_list_of_an_empty_catalog(app: typer.Typer, cli_config: Path) -> None:
    result = run(app, "list", "prod", "--config", str(cli_config))
    assert result.exit_code == 0
    assert "no backups of cluster prod" in flat(result.stdout)


def test_show_prints_nodes_snapshots_timings_window_and_verification(
    app: typer.Typer, cli_config: Path, harness: Harness
) -> None:
    left = "array a1: temporary consistency group ringsnap-cg-1 in SVM svm1: HTTP 500"
    harness.seed_backup("rs-show", T0, warnings=(left,))
    result = run(app, "show", "rs-show", "--config", str(cli_config))
    assert result.exit_code == 0, result.output
    out = flat(result.stdout)
    for expected in (
        "rs-show",
        "complete",
        "never proven: no restore or drill has verified this backup yet",
        "61.0 ms = slowest freeze 40.0 ms + array call 12.0 ms + slowest thaw 5.0 ms",
        "coordination 4.0 ms",
        "freeze+snapshot+thaw",
        "host-n2",
        "canary-n3",
        "a1:n1-data (data)",
        "a1:n1-cl (commitlog)",
        "array snapshots",
        "rs-group",
        "n3-cl -> rs-show",
        f"warning {left}",
    ):
        assert expected in out, expected

    document = run_json(app, "show", "rs-show", "--config", str(cli_config))
    assert document["verification"] == "VERIFICATION_STATE_UNVERIFIED"
    assert document["freeze"]["array_call"] == "0.012s"
    assert document["warnings"] == [left]


def test_show_prints_the_point_in_time_window_of_the_backups_cluster(
    app: typer.Typer, cli_config: Path, harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ringsnap.coordinator.cli import pitr

    asked: list[tuple[Path | None, str | None]] = []

    def window(config: Path | None, cluster: str | None = None) -> list[str]:
        asked.append((config, cluster))
        return [f"{cluster}: point-in-time window A to B (`ringsnap restore --to TIME`)"]

    monkeypatch.setattr(pitr, "pitr_status_lines", window)
    harness.seed_backup("rs-pitr", T0)
    result = run(app, "show", "rs-pitr", "--config", str(cli_config))
    assert result.exit_code == 0, result.output
    assert asked == [(cli_config, "prod")]
    assert "prod: point-in-time window A to B" in flat(result.stdout)


def test_show_unknown_backup_is_not_found(app: typer.Typer, cli_config: Path) -> None:
    result = run(app, "show", "rs-missing", "--config", str(cli_config))
    assert result.exit_code == ExitCode.NOT_FOUND
    assert "no backup 'rs-missing'" in flat(result.stderr)
    document = run_json(app, "show", "rs-missing", "--config", str(cli_config), code=66)
    assert document["error"]["reason"] == "BACKUP_NOT_FOUND"
    assert document["error"]["exit_code"] == 66


# -- delete ----------------------------------------------------------------------------------------


def test_delete_without_yes_and_without_a_terminal_refuses(
    app: typer.Typer, cli_config: Path, harness: Harness
) -> None:
    harness.seed_backup("rs-keep", T0)
    result = run(app, "delete", "rs-keep", "--config", str(cli_config))
    assert result.exit_code == ExitCode.USAGE
    assert "DESTROYS its 1 array snapshots" in flat(result.stderr)
    assert "array a1: snapshot rs-keep" in flat(result.stderr)
    assert "NEWEST COMPLETE backup of cluster prod" in flat(result.stderr)
    assert "no terminal to ask on" in flat(result.stderr) and "--yes" in flat(result.stderr)
    assert "rs-keep" in harness.array.snapshots
    assert harness.catalog.get_backup("rs-keep")


def test_delete_declined_at_the_prompt_changes_nothing(
    app: typer.Typer, cli_config: Path, harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness.seed_backup("rs-keep", T0)
    monkeypatch.setattr(commands, "_interactive", lambda: True)
    result = run(app, "delete", "rs-keep", "--config", str(cli_config), input="n\n")
    assert result.exit_code == ExitCode.REFUSED
    assert "you declined" in flat(result.stderr)
    assert "rs-keep" in harness.array.snapshots


def test_delete_confirmed_destroys_the_snapshot(
    app: typer.Typer, cli_config: Path, harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness.seed_backup("rs-old", T0)
    harness.seed_backup("rs-new", T0 + timedelta(hours=1))
    monkeypatch.setattr(commands, "_interactive", lambda: True)
    result = run(app, "delete", "rs-old", "--config", str(cli_config), input="y\n")
    assert result.exit_code == 0, result.output
    assert "NEWEST COMPLETE" not in flat(result.stderr)
    assert "DELETED backup rs-old deleted from the catalog; 1 array snapshots deleted" in (
        result.stdout.replace("\n", " ")
    )
    assert "rs-old" not in harness.array.snapshots

    document = run_json(app, "delete", "rs-new", "--yes", "--config", str(cli_config))
    assert document["operation"]["state"] == "OPERATION_STATE_SUCCEEDED"
    assert not harness.array.snapshots

    result = run(app, "delete", "rs-new", "--yes", "--config", str(cli_config))
    assert result.exit_code == ExitCode.NOT_FOUND


# -- status / retention ----------------------------------------------------------------------------


def test_status_text_and_json(app: typer.Typer, cli_config: Path, harness: Harness) -> None:
    harness.seed_backup("rs-s1", datetime.now(UTC) - timedelta(hours=2))
    result = run(app, "status", "--config", str(cli_config))
    assert result.exit_code == 0, result.output
    assert "rs-s1" in flat(result.stdout)
    assert "never: no complete backup" in flat(result.stdout), "edge has no backup"
    assert "yearly" in flat(result.stdout) and "no schedule" in flat(result.stdout)
    assert "no pending snapshot cleanups" in flat(result.stdout)

    document = run_json(app, "status", "--config", str(cli_config))
    prod = next(c for c in document["clusters"] if c["cluster"] == "prod")
    assert prod["last_backup"]["backup_id"] == "rs-s1"
    assert prod["next_runs"][0]["schedule"] == "yearly"
    assert document["pending_cleanups"] == 0


def test_status_prints_the_node_local_lines_text_and_json(
    app: typer.Typer, cli_config: Path, harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ringsnap.coordinator.cli import node_local

    asked: list[Path | None] = []
    said = [
        "node1 (prod, array node1-das): thin pool das1/pool data 42.50%, metadata 7.25% used",
        "prod: backup rs-l1 has no S3 copy: its snapshots are on the own disks of node1 and die"
        " with them; export it (ringsnap export rs-l1)",
    ]

    def lines(config: Path | None) -> list[str]:
        asked.append(config)
        return said

    monkeypatch.setattr(node_local, "node_local_lines", lines)
    result = run(app, "status", "--config", str(cli_config))
    assert result.exit_code == 0, result.output
    text = flat(result.stdout)
    assert "Node-local snapshots" in text
    assert all(flat(line) in text for line in said), text
    document = run_json(app, "status", "--config", str(cli_config))
    assert document["node_local"] == said
    assert asked == [cli_config, cli_config]


def test_status_names_every_other_ledger_entry_its_run_and_what_the_daemon_does(
    app: typer.Typer, cli_config: Path, harness: Harness
) -> None:
    """A backup's snapshot is counted; every other entry gets its own line: what, which run
    left it, what the retry will do (or the run it waits for), and its last error."""
    catalog = harness.coordinator.catalog
    catalog.add_resource(array_snapshot("prod", ARRAY, "rs-old", "a failed backup's snapshot"))
    # (run kind, run id): an export's clone mounted by n1, a drill's mapping to the drill host,
    # a table restore's staging (a backup's tag comes below).
    left: dict[tuple[str, str], dict[str, Any]] = {
        ("export", "ex-1"): {"type": ResourceType.CLONE, "name": "n1-data-ex1", "node": "n1"},
        ("drill", "dr-1"): {
            "type": ResourceType.MAPPING,
            "name": "n2-data-dr1",
            "host": "drillbox",
            "drill_host": True,
        },
        ("table-restore", "tr-1"): {"type": ResourceType.STAGING, "name": "tr-1", "node": "e1"},
    }
    made = {
        run: catalog.add_resource(
            Resource(
                cluster="edge" if kind == "table-restore" else "prod",
                run_id=run,
                run_kind=kind,
                reason=f"left by {run}",
                array="" if kind == "table-restore" else ARRAY,
                mount_purpose="" if kind == "table-restore" else run,
                **fields,
            )
        )
        for (kind, run), fields in left.items()
    }
    catalog.resource_failed(made["ex-1"].id, "agent n1 unreachable")
    catalog.add_resource(native_tag("prod", "n3", "rs-tag", "a failed backup's tag"))
    lease = Lease("edge", RunKind.TABLE_RESTORE, "tr-2", asked_by="cli:ann")
    harness.coordinator.leases.take(lease)
    try:
        result = run(app, "status", "--config", str(cli_config))
        document = run_json(app, "status", "--config", str(cli_config))
    finally:
        harness.coordinator.leases.give_back(lease)
    assert result.exit_code == 0, result.output
    text = flat(result.stdout)
    assert "1 array snapshots of failed or deleted backups are still to be deleted" in text
    assert "4 other resources left by runs" in text
    assert (
        "clone n1-data-ex1 on array a1, made by export ex-1" in text
        and "the coordinator will: unmount it on node n1 (ex-1), then delete the clone on array a1"
        in text
        and "tried 1 times; last error: agent n1 unreachable" in text
    ), text
    assert (
        "mapping of n2-data-dr1 to host drillbox of the drill host on array a1, made by drill dr-1"
        in text
        and "stop the drill and unmount it on the drill host (dr-1), then unmap it on array a1"
        in text
    ), text
    assert "native-tag rs-tag on node n3, made by backup rs-tag" in text
    assert "clear the Cassandra snapshot tag through node n3's agent" in text
    assert "staging tr-1 on node e1, made by table-restore tr-1" in text
    assert "`ringsnap restore --abort tr-1` removes it now" in text
    assert "left alone while table restore tr-2" in text and "holds cluster edge" in text
    # The snapshot is not listed again; the JSON carries each entry typed.
    assert "rs-old" not in text
    listed = document["left_resources"]
    assert [e["type"] for e in listed] == ["clone", "mapping", "staging", "native-tag"]
    assert listed[0]["run_kind"] == "export" and listed[0]["run_id"] == "ex-1"
    assert listed[0]["attempts"] == 1 and listed[0]["last_error"] == "agent n1 unreachable"
    assert listed[2]["cluster"] == "edge" and listed[2]["held_by"].startswith("table restore tr-2")
    assert not any(listed[i].get("held_by") for i in (0, 1, 3))


def test_retention_dry_run_then_apply(app: typer.Typer, cli_config: Path, harness: Harness) -> None:
    now = datetime.now(UTC)
    for days in range(4):
        harness.seed_backup(f"rs-r{days}", now - timedelta(days=days), policy="daily")

    result = run(app, "retention", "prod", "daily", "--dry-run", "--config", str(cli_config))
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line for line in result.stdout.splitlines() if line.startswith("rs-")}
    assert "keep" in rows["rs-r0"] and "newest complete backup" in rows["rs-r0"]
    assert "REMOVE" in rows["rs-r3"] and "beyond all buckets" in rows["rs-r3"]
    assert "keeps 2 and removes 2 of 4" in flat(result.stdout)
    assert "nothing was deleted" in flat(result.stdout)
    assert len(harness.array.snapshots) == 4

    result = run(app, "retention", "prod", "daily", "--config", str(cli_config))
    assert result.exit_code == ExitCode.USAGE, "no terminal, no --yes: refused"
    assert len(harness.array.snapshots) == 4

    document = run_json(app, "retention", "prod", "daily", "--yes", "--config", str(cli_config))
    assert document["applied"] is True and document["dry_run"] is False
    assert sorted(harness.array.snapshots) == ["rs-r0", "rs-r1"]

    result = run(app, "retention", "prod", "monthly", "--dry-run", "--config", str(cli_config))
    assert result.exit_code == ExitCode.USAGE
    assert "unknown retention policy 'monthly'" in flat(result.stderr)


# -- reaching the coordinator ----------------------------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_unreachable_coordinator_says_how_to_start_it(
    app: typer.Typer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    address = f"127.0.0.1:{_closed_port()}"
    config = tmp_path / "coordinator.toml"
    config.write_text(f'[coordinator]\nlisten = "{address}"\ncatalog = "{tmp_path}/catalog.db"\n')
    for args in (("status",), ("list",), ("show", "rs-x"), ("backup", "prod")):
        result = run(app, *args, "--config", str(config))
        assert result.exit_code == ExitCode.UNREACHABLE, result.output
        assert f"not running at {address}" in flat(result.stderr)
        assert "systemctl start ringsnap-coordinator" in flat(result.stderr)
        assert "Traceback" not in result.output

    token = tmp_path / "token"
    token.write_text("stale\n")
    result = CliRunner().invoke(
        app,
        ["status", "--coordinator", address, "--output", "json"],
        env={TOKEN_FILE_ENV: str(token), ADDRESS_ENV: ""},
    )
    assert result.exit_code == ExitCode.UNREACHABLE
    error = json.loads(result.stdout)["error"]
    assert error["reason"] == "UNREACHABLE" and "ringsnap-coordinator serve" in error["hint"]


def test_wrong_token_and_bad_config_are_usage_errors(
    app: typer.Typer, harness: Harness, tmp_path: Path
) -> None:
    stale = tmp_path / "stale-token"
    stale.write_text("from-a-previous-start\n")
    result = CliRunner().invoke(
        app,
        ["status", "--coordinator", harness.address],
        env={TOKEN_FILE_ENV: str(stale), ADDRESS_ENV: ""},
    )
    assert result.exit_code == ExitCode.USAGE
    assert "refused the API token" in flat(result.stderr)

    missing = tmp_path / "missing.toml"
    result = run(app, "status", "--config", str(missing))
    assert result.exit_code == ExitCode.USAGE and "file not found" in flat(result.stderr)

    bad = tmp_path / "bad.toml"
    bad.write_text('[coordinator]\nlisten = "nowhere"\n')
    result = run(app, "status", "--config", str(bad))
    assert result.exit_code == ExitCode.USAGE
    assert "coordinator.listen" in flat(result.stderr)


def test_running_coordinator_without_readable_token_is_explained(
    app: typer.Typer, harness: Harness, tmp_path: Path
) -> None:
    result = CliRunner().invoke(
        app,
        ["status", "--coordinator", harness.address],
        env={TOKEN_FILE_ENV: str(tmp_path / "nope"), ADDRESS_ENV: ""},
    )
    assert result.exit_code == ExitCode.USAGE
    assert f"a coordinator answers at {harness.address}" in flat(result.stderr)


def test_help_documents_the_exit_codes(app: typer.Typer) -> None:
    for verb in ("backup", "list", "show", "delete", "status", "retention"):
        result = CliRunner().invoke(app, [verb, "--help"], env={"COLUMNS": "120"})
        assert result.exit_code == 0
        for code in ("66", "69", "130"):
            assert code in flat(result.stdout)


def test_a_bug_in_the_cli_is_one_line_not_a_traceback(
    app: typer.Typer, cli_config: Path, harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness.seed_backup("rs-bug", T0)

    def broken(backup: Any) -> None:
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(render, "backup_detail", broken)
    result = run(app, "show", "rs-bug", "--config", str(cli_config))
    assert result.exit_code == ExitCode.ERROR
    assert "internal error in ringsnap: ZeroDivisionError" in flat(result.stderr)
    assert "Traceback" not in result.output


def test_the_readme_documents_every_exit_code() -> None:
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    section = readme.split("## Operating ringsnap", 1)[1].split("\n## ", 1)[0]
    documented = {
        int(line.split("|")[1])
        for line in section.splitlines()
        if line.startswith("| ") and line[2].isdigit()
    }
    assert documented == {int(code) for code in ExitCode}
