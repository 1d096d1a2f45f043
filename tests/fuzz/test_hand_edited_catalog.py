"""Catalog rows edited by hand (corrupt JSON columns, states outside their CHECK, text in number
columns, hostile ids, broken manifest chunks) through the real coordinator server and the real
`ringsnap list / show / status` verbs: every answer is either the data with the damaged part
reported, or a precise error naming the backup — never UNKNOWN/INTERNAL, never a traceback.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import typer
from typer.testing import CliRunner

from ringsnap.api.v1 import coordinator_pb2 as pb
from ringsnap.api.v1 import coordinator_pb2_grpc
from ringsnap.coordinator.api.token import TOKEN_FILE_ENV
from ringsnap.coordinator.cli import commands
from ringsnap.coordinator.cli.client import ADDRESS_ENV
from tests.fuzz.coordinator_rig import CoordinatorRig, running_coordinator

DAMAGED = "rs-seed-1"
_BACKUP = f"(SELECT pk FROM backups WHERE id = '{DAMAGED}')"
CORRUPTIONS = {
    "volumes not JSON": f"UPDATE backup_nodes SET volumes = '{{not json' WHERE backup = {_BACKUP}",
    "volumes wrong shape": (
        f"""UPDATE backup_nodes SET volumes = '[{{"array": 1}}]' WHERE backup = {_BACKUP}"""
    ),
    "snapshot ref not JSON": f"UPDATE snapshots SET ref = 'garbage' WHERE backup = {_BACKUP}",
    "snapshot ref wrong shape": f"UPDATE snapshots SET ref = '[1, 2]' WHERE backup = {_BACKUP}",
    "warnings not JSON": f"UPDATE backups SET warnings = 'nope' WHERE id = '{DAMAGED}'",
    "unknown state": f"UPDATE backups SET state = 'exploded' WHERE id = '{DAMAGED}'",
    "unknown quiesce mode": f"UPDATE backups SET quiesce_mode = 'yolo' WHERE id = '{DAMAGED}'",
    "unknown verification": f"UPDATE backups SET verification = 'maybe' WHERE id = '{DAMAGED}'",
    "text start time": f"UPDATE backups SET started_us = 'yesterday' WHERE id = '{DAMAGED}'",
    "huge start time": f"UPDATE backups SET started_us = 9223372036854775807 WHERE id = '{DAMAGED}'",
    "negative freeze": f"UPDATE backups SET freeze_total = -1e308 WHERE id = '{DAMAGED}'",
    "text freeze": f"UPDATE backups SET freeze_slowest = 'fast' WHERE id = '{DAMAGED}'",
    "huge phase": f"UPDATE phase_timings SET seconds = 1e300 WHERE backup = {_BACKUP}",
    "hostile id": f"UPDATE backups SET id = '../../etc/x' WHERE id = '{DAMAGED}'",
    "manifest chunk garbage": f"UPDATE manifest_chunks SET body = x'00ff' WHERE backup = {_BACKUP}",
    "phase with NUL": f"UPDATE phase_timings SET phase = 'a' || char(0) WHERE backup = {_BACKUP}",
}
PRECISE = {
    grpc.StatusCode.OK,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.DATA_LOSS,
    grpc.StatusCode.INVALID_ARGUMENT,
}


@pytest.fixture
def damaged(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CoordinatorRig]:
    with running_coordinator(tmp_path) as rig:
        catalog = rig.harness.config.coordinator.catalog
        with contextlib.closing(sqlite3.connect(catalog)) as db:
            db.execute("PRAGMA ignore_check_constraints = ON")
            db.execute(CORRUPTIONS[request.param])
            db.commit()
        yield rig


def _answer(call: Any, request: object) -> tuple[grpc.StatusCode, str]:
    try:
        call(request, timeout=10)
    except grpc.RpcError as exc:
        failed: Any = exc
        return failed.code(), failed.details() or ""
    return grpc.StatusCode.OK, ""


def _cli(rig: CoordinatorRig, *args: str) -> tuple[int, str]:
    app = typer.Typer(pretty_exceptions_enable=False)

    @app.callback()
    def _root() -> None:
        """ringsnap (test root)."""

    commands.register(app)
    config = rig.harness.tmp / "cli.toml"
    config.write_text(
        "[coordinator]\n"
        f'listen = "{rig.harness.address}"\n'
        f'catalog = "{rig.harness.config.coordinator.catalog}"\n'
        '\n[tls]\ncert_file = "/nonexistent/cli.crt"\n'
    )
    result = CliRunner().invoke(
        app,
        [*args, "--config", str(config)],
        env={ADDRESS_ENV: "", TOKEN_FILE_ENV: ""},
        catch_exceptions=True,
    )
    return result.exit_code, result.output + (repr(result.exception) if result.exception else "")


@pytest.mark.parametrize("damaged", sorted(CORRUPTIONS), indirect=True)
def test_a_hand_edited_row_is_reported_never_crashes_list_show_or_status(
    damaged: CoordinatorRig,
) -> None:
    stub = coordinator_pb2_grpc.CoordinatorServiceStub(damaged.channel)
    backup_id = DAMAGED
    with contextlib.closing(
        sqlite3.connect(damaged.harness.config.coordinator.catalog)
    ) as db:  # the hostile-id case renamed it
        if not db.execute("SELECT 1 FROM backups WHERE id = ?", (backup_id,)).fetchone():
            backup_id = "../../etc/x"
    answers = {
        "ListBackups": _answer(stub.ListBackups, pb.ListBackupsRequest(cluster="prod")),
        "GetBackup": _answer(stub.GetBackup, pb.GetBackupRequest(backup_id=backup_id)),
        "GetStatus": _answer(stub.GetStatus, pb.GetStatusRequest()),
    }
    for name, (code, details) in answers.items():
        assert code in PRECISE, f"{name}: {code.name} {details!r}"
        if code is not grpc.StatusCode.OK and name == "GetBackup":
            assert backup_id in details or "rs-seed-1" in details, details
    for verb in (["list", "prod"], ["show", backup_id], ["status"]):
        exit_code, output = _cli(damaged, *verb)
        assert "Traceback" not in output, output
        # Not 1: that is the CLI's "internal error".
        assert exit_code in (0, 2, 3, 65, 66), (verb, exit_code, output)
        assert not output.startswith("Error") or output.strip(), output
    assert damaged.healthy()
