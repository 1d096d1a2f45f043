"""One path for `ringsnap restore`: with the coordinator daemon up (conftest's harness, holding its
catalog) and with it down (no daemon answers; the catalog is free), the same `CoordinatorServicer`
runs the restore, and the operator sees the same plan, progress, report and exit codes.

Both coordinators restore on the fakes of `restore_rig`, with the same backup (rs-1); each run's
output is compared with ids, times and durations taken out.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
import typer
from typer.testing import Result

from ringsnap.coordinator.api.servicer import CoordinatorServicer
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.cli import console
from ringsnap.coordinator.cli import restore as restore_cli
from ringsnap.coordinator.cli.client import ExitCode
from ringsnap.coordinator.model import RestoreState
from ringsnap.coordinator.service import Coordinator
from ringsnap.coordinator.table_restore import daemon as table_daemon
from tests.support.coordinator_config import write_config

from . import table_restore_rig
from .conftest import Harness, config_data
from .restore_rig import RECENT, RestoreRig, install, install_hosted
from .test_restore_cli import run

#: Each start of a restore as a servicer handled it: (the servicer, the coordinator it serves).
Handled = list[tuple[object, Coordinator]]


@pytest.fixture
def handled(monkeypatch: pytest.MonkeyPatch) -> Handled:
    """Records every StartRestore a `CoordinatorServicer` handles. Requested before the harness,
    so that the daemon's server registers the recording method too."""
    seen: Handled = []
    original = CoordinatorServicer.StartRestore

    async def recording(self: CoordinatorServicer, request: Any, context: Any) -> Any:
        seen.append((self, self._coordinator))
        return await original(self, request, context)

    monkeypatch.setattr(CoordinatorServicer, "StartRestore", recording)
    return seen


@pytest.fixture
def daemon(handled: Handled, harness: Harness) -> Iterator[Harness]:
    harness.seed_backup("rs-1", RECENT)
    yield harness


def _listening(harness: Harness) -> dict[str, Any]:
    """The daemon's config as it runs with it (its real address)."""
    data = config_data(harness.tmp)
    data["coordinator"]["listen"] = f"127.0.0.1:{harness.server.port}"
    return data


@pytest.fixture
def app() -> typer.Typer:
    root = typer.Typer(pretty_exceptions_enable=False)

    @root.callback()
    def _root() -> None:
        """ringsnap (test root)."""

    root.command("restore")(restore_cli.restore_command)
    return root


_ELAPSED = re.compile(r"^\s*\d+(\.\d+)? (ms|s|min)\s+")
_IDS = (
    (re.compile(r"rr-\d{8}-\d{6}-[0-9a-f]+"), "rr-ID"),
    (re.compile(r"tr[-_]\d{8}[-_]\d{6}[-_][0-9a-f]+"), "tr-ID"),
    (re.compile(r"\b[0-9a-f]{32}\b"), "OPERATION"),
    (re.compile(r"\b\d+(\.\d+)? ?(ms|s|min|h)\b"), "TIME"),
    (re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"), "MOMENT"),
)
#: The lines that say where the restore runs: the only ones that differ, on purpose.
_WHERE = (
    "holds the catalog: the restore runs in the daemon",
    "holds the catalog: the table restore runs in the daemon",
    "started in the coordinator (operation",
    "started in this process (no coordinator daemon runs)",
)


def _normal(line: str) -> str:
    line = _ELAPSED.sub("", line)
    for pattern, name in _IDS:
        line = pattern.sub(name, line)
    return " ".join(line.split())


def seen_by_operator(result: Result) -> dict[str, Any]:
    """What the operator saw: the plan's lines, the progress lines (in any order: nodes run in
    parallel), the report and the exit code; ids, times and where it ran taken out."""
    lines = [_normal(line) for line in result.stderr.splitlines() if line.strip()]
    shown = [line for line in lines if not any(where in line for where in _WHERE)]
    plan_at = next(i for i, line in enumerate(shown) if line.startswith("Restore plan"))
    progress_at = next(i for i, line in enumerate(shown) if line.endswith(("...", "done")))
    return {
        "exit": result.exit_code,
        "plan": shown[plan_at:progress_at],
        "progress": sorted(shown[progress_at:]),
        "report": [_normal(line) for line in result.stdout.splitlines() if line.strip()],
    }


def _restores(app: typer.Typer, config: Path, rig: RestoreRig) -> list[Result]:
    """A proven restore, then one whose proof fails on n2 (its canary gone)."""
    proven = run(app, "rs-1", "--yes", "--config", str(config))
    assert proven.exit_code == ExitCode.OK, proven.output
    rig.ring.present.discard("canary-n2")
    not_proven = run(app, "rs-1", "--yes", "--config", str(config))
    assert not_proven.exit_code == ExitCode.NOT_PROVEN, not_proven.output
    return [proven, not_proven]


def test_restore_with_the_daemon_up_and_down_runs_the_same_servicer_and_shows_the_same(
    app: typer.Typer,
    handled: Handled,
    daemon: Harness,
    full_config: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    up_runs = _restores(app, full_config, install(daemon, monkeypatch))
    assert len(handled) == 2
    assert all(coordinator is daemon.coordinator for _, coordinator in handled)

    config, rig = install_hosted(tmp_path / "daemon-down", monkeypatch)
    down_runs = _restores(app, config, rig)
    assert len(handled) == 4
    hosted = [coordinator for _, coordinator in handled[2:]]
    # The daemon's code, in this process's own coordinator (one per command: each hosts its own).
    assert all(type(c) is Coordinator and c is not daemon.coordinator for c in hosted)
    assert all(type(servicer) is CoordinatorServicer for servicer, _ in handled)
    assert hosted[0] is not hosted[1]
    # Where it ran is said, and is all that differs.
    assert "started in the coordinator (operation" in up_runs[0].stderr
    assert "holds the catalog" not in down_runs[0].stderr
    assert "started in this process (no coordinator daemon runs)" in down_runs[0].stderr
    up = [seen_by_operator(result) for result in up_runs]
    down = [seen_by_operator(result) for result in down_runs]

    for seen in ("exit", "plan", "progress", "report"):
        assert [run[seen] for run in down] == [run[seen] for run in up], seen
    # What is compared is the whole of it: the plan, each node's steps, the verdicts.
    plan, progress, report = up[1]["plan"], up[1]["progress"], up[1]["report"]
    assert plan[0].startswith("Restore plan rr-ID: backup rs-1 of cluster prod"), plan
    assert "n2: stopped done" in progress and "n3: verified done" in progress, progress
    assert "n2 NOT-PROVEN (last step: verified)" in report, report


def test_ctrl_c_interrupts_a_restore_this_process_hosts_and_resume_finishes_it(
    app: typer.Typer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no daemon, the restore ends with this process, as when it ran in the CLI itself:
    Ctrl-C interrupts it (exit 130), its record says where each node stands, and --resume (in a
    coordinator hosted anew) finishes it."""
    config, rig = install_hosted(tmp_path, monkeypatch)
    shown = console.ProgressPrinter.line

    def ctrl_c_once_stopped(self: console.ProgressPrinter, text: str) -> None:
        shown(self, text)
        if text == "n1: stopped done":
            raise KeyboardInterrupt

    monkeypatch.setattr(console.ProgressPrinter, "line", ctrl_c_once_stopped)
    result = run(app, "rs-1", "--yes", "--config", str(config))
    assert result.exit_code == ExitCode.INTERRUPTED, result.output
    assert "interrupted: the restore's record says where each node stands" in result.stderr
    assert "goes on in the coordinator" not in result.stderr
    # The daemon's code logs for a journal: on the terminal, stdout is the command's alone.
    assert "restore starting" not in result.stdout and not structlog.is_configured()
    with Catalog(config_data(tmp_path)["coordinator"]["catalog"]) as catalog:
        (record,) = catalog.list_restores()
    assert record.state is RestoreState.INTERRUPTED, record
    assert "start n1" not in rig.events, "nothing ran on after the interruption"

    monkeypatch.setattr(console.ProgressPrinter, "line", shown)
    resumed = run(app, "--resume", record.id, "--config", str(config))
    assert resumed.exit_code == ExitCode.OK, resumed.output
    assert f"Restore {record.id} of backup rs-1 (revert): PROVEN" in " ".join(
        resumed.stdout.split()
    )


def test_table_restore_with_the_daemon_up_and_down_runs_the_same_servicer_and_shows_the_same(
    app: typer.Typer, harness: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ringsnap restore BACKUP --keyspace K` takes the same one path: the daemon's servicer, or
    the same servicer hosted here while no daemon runs."""
    seen: list[Coordinator] = []
    original = CoordinatorServicer.StartTableRestore

    async def recording(self: CoordinatorServicer, request: Any, context: Any) -> Any:
        seen.append(self._coordinator)
        return await original(self, request, context)

    def fakes_for(catalog: Catalog) -> table_restore_rig.Fakes:
        table_restore_rig.seed(catalog)
        made = table_restore_rig.Fakes()
        monkeypatch.setattr(table_daemon, "open_table_restore_session", made.open_session)
        return made

    def table_restore(config: Path) -> Result:
        args = [table_restore_rig.BACKUP, "--keyspace", "shop", "--table", "orders", "--yes"]
        return run(app, *args, "--config", str(config))

    # The daemon's server registered its methods at its start: it is started again to record.
    monkeypatch.setattr(CoordinatorServicer, "StartTableRestore", recording)
    harness.call(harness.server.stop(0))
    harness.call(harness.server.start())
    daemon_config = write_config(harness.tmp / "coordinator.toml", _listening(harness))
    fakes_for(harness.catalog)
    up = table_restore(daemon_config)

    config, _rig = install_hosted(tmp_path / "daemon-down", monkeypatch)
    with Catalog(config_data(tmp_path / "daemon-down")["coordinator"]["catalog"]) as catalog:
        made = fakes_for(catalog)
    down = table_restore(config)

    assert up.exit_code == down.exit_code == ExitCode.OK, (up.output, down.output)
    assert seen[0] is harness.coordinator and seen[1] is not harness.coordinator
    assert len(seen) == 2 and type(seen[1]) is Coordinator
    assert "started in this process (no coordinator daemon runs)" in down.stderr
    assert any(e.endswith(":import:shop.orders") for e in made.events)
    # The plan and progress (stderr; in any order: nodes run in parallel), and the report.
    for stream in ("stderr", "stdout"):
        lines_up, lines_down = (
            sorted(
                _normal(line)
                for line in getattr(result, stream).splitlines()
                if line.strip() and not any(where in line for where in _WHERE)
            )
            for result in (up, down)
        )
        assert lines_down == lines_up, stream
    assert "Table restore tr-ID of backup" in _normal(up.stdout), up.stdout
