"""`ringsnap restore --to T --from s3 --key-file K`: the key file reaches the restore of the base
copy (its plan, whose check opens each node's key object, and the workflow whose downloads carry
the keys); before, it was dropped, so an encrypted base was refused for want of the key given.
`--key-file` without `--from s3` is refused. The sessions, catalog and workflow are fakes of our
own seams; the restore's key handling behind them has its own tests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pyrage
import pytest
import typer
from typer.testing import CliRunner

from ringsnap.coordinator.cli import pitr as cli_pitr
from ringsnap.coordinator.cli.client import ExitCode
from ringsnap.coordinator.cli.restore import restore_command
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.model import RestoreMode
from ringsnap.coordinator.restore import pitr_session
from ringsnap.coordinator.restore.plan import RestoreRequest
from ringsnap.coordinator.restore.s3_keys import NO_KEYS, RestoreKeys


def _key_file(tmp_path: Path) -> tuple[Path, str]:
    identity = pyrage.x25519.Identity.generate()
    path = tmp_path / "restore.age"
    path.write_text(f"# the copies' key\n{identity}\n")
    return path, f"{identity.to_public()}"


def _invoke(*args: str) -> Any:
    app = typer.Typer(pretty_exceptions_enable=False)

    @app.callback()
    def _root() -> None:
        """ringsnap (test root)."""

    app.command("restore")(restore_command)
    return CliRunner().invoke(app, ["restore", *args], catch_exceptions=False)


def test_the_cli_gives_restore_to_time_the_key_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[dict[str, Any]] = []
    monkeypatch.setattr(cli_pitr, "restore_to_time", lambda *a, **k: asked.append(k))
    key_file, recipient = _key_file(tmp_path)
    when = "2026-11-29T10:00:00Z"

    done = _invoke("--to", when, "--from", "s3", "--key-file", str(key_file), "--yes")
    assert done.exit_code == 0, done.output
    (kwargs,) = asked
    assert kwargs["from_s3"] and kwargs["keys"].recipients == (recipient,)

    refused = _invoke("--to", when, "--key-file", str(key_file), "--yes")
    assert refused.exit_code == ExitCode.USAGE
    assert "--key-file opens an encrypted copy on S3" in refused.output
    assert len(asked) == 1


@dataclass
class _Session:
    requests: list[RestoreRequest] = field(default_factory=list)
    agents: dict[str, Any] = field(default_factory=dict)
    arrays: dict[str, Any] = field(default_factory=dict)
    ring: Any = None
    s3_agents: dict[str, Any] = field(default_factory=dict)
    settings: Any = None
    cluster: Any = field(default_factory=lambda: SimpleNamespace(seeds=(), nodes=()))

    async def plan(self, request: RestoreRequest) -> Any:
        self.requests.append(request)
        return SimpleNamespace(refused=False, refusals=(), keys=request.keys)


class _Workflow:
    made: list[dict[str, Any]] = []

    def __init__(self, *_: Any, **kwargs: Any) -> None:
        _Workflow.made.append(kwargs)

    async def run(self, plan: Any, requested_by: str) -> str:
        return f"restored by {requested_by}"


class _Catalog:
    def __init__(self, _path: Any) -> None:
        pass

    def backup_summaries(self, _cluster: str) -> list[Any]:
        return []

    def close(self) -> None:
        pass


@pytest.mark.parametrize("given", [True, False])
def test_run_point_in_time_plans_and_runs_with_the_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given: bool
) -> None:
    session = _Session()

    @contextlib.asynccontextmanager
    async def open_session(*_: Any, **__: Any) -> AsyncIterator[_Session]:
        yield session

    monkeypatch.setattr(pitr_session, "open_restore_session", open_session)
    monkeypatch.setattr(pitr_session, "Catalog", _Catalog)
    monkeypatch.setattr(pitr_session, "base_backup", lambda *_: SimpleNamespace(id="rs-1"))
    monkeypatch.setattr(pitr_session, "_pitr_agents", lambda _session: {})
    monkeypatch.setattr(pitr_session, "PointInTimeWorkflow", _Workflow)
    _Workflow.made.clear()
    key_file, _ = _key_file(tmp_path)
    keys = RestoreKeys.of_reference(str(key_file)) if given else NO_KEYS
    config = SimpleNamespace(
        coordinator=SimpleNamespace(catalog=tmp_path / "c.db"),
        clusters=[SimpleNamespace(name="prod")],
    )

    done = asyncio.run(
        pitr_session.run_point_in_time(
            cast(CoordinatorConfig, config), "prod", 1, "op", from_s3=True, keys=keys
        )
    )

    assert cast(str, done) == "restored by op"
    (request,) = session.requests
    assert request.mode is RestoreMode.S3 and request.backup_id == "rs-1"
    assert request.keys is keys
    (workflow,) = _Workflow.made
    assert workflow["keys"] is keys
