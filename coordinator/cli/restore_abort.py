"""`ringsnap restore --abort rr-...`: give up a restore from S3 before its install.

Through the coordinator's API (AbortRestore): the daemon while it holds the catalog (also from a
bastion through `$RINGSNAP_REMOTE`), else the same service hosted by this process for the abort
(`hosted`). The operator types the cluster's name (or --yes); progress per node on stderr; the
report says per node what was removed and what is left to do. Exit codes: 0 given up, 4 not finished (each node's next step says why; the
same command finishes it), 3 refused (nothing was done), 130 interrupted.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import NoReturn

import typer

from ringsnap.api.v1 import coordinator_pb2 as pb
from ringsnap.api.v1 import types_pb2
from ringsnap.coordinator.api import messages
from ringsnap.coordinator.cli import operation as operation_cli
from ringsnap.coordinator.cli.client import (
    LONG_CALL_TIMEOUT,
    CliError,
    Coordinator,
    ExitCode,
    Target,
    reason_exit_code,
)
from ringsnap.coordinator.cli.console import (
    ProgressPrinter,
    err,
    error_exit_code,
    fail,
    jsonable,
    operator_name,
)
from ringsnap.coordinator.cli.hosted import command_coordinator
from ringsnap.coordinator.cli.restore_report import print_report
from ringsnap.coordinator.model import RestoreRecord, RestoreState
from ringsnap.coordinator.restore.abort import check_abortable
from ringsnap.coordinator.restore.workflow import RestoreRefused
from ringsnap.errors import RingsnapError


def confirm_abort(record: RestoreRecord, yes: bool) -> None:
    """The cluster's name, typed; or --yes. Without a terminal and --yes: exit 2."""
    if yes:
        return
    if not os.isatty(0):
        raise CliError(
            f"refusing to give up restore {record.id} without confirmation: there is no terminal"
            " to ask on",
            ExitCode.USAGE,
            reason="CONFIRMATION_REQUIRED",
            hint="run the same command with --yes",
        )
    typed = typer.prompt(
        f"Giving up restore {record.id} removes its downloaded copy on every node and starts"
        f" again the nodes it stopped. Type the cluster's name ({record.cluster}) to give it up",
        default="",
        show_default=False,
        err=True,
    )
    if typed.strip() != record.cluster:
        raise CliError(
            f"nothing was done: {typed.strip()!r} is not {record.cluster!r}",
            ExitCode.REFUSED,
            reason="DECLINED",
        )


def _through(target: Target, restore_id: str, yes: bool, as_json: bool) -> RestoreRecord:
    operation_cli.say_the_daemon_runs(target, "the abort", as_json=as_json)
    with Coordinator(target) as client:
        get = pb.GetRestoreRequest(restore_id=restore_id)
        record = messages.restore_record(client.call(client.stub.GetRestore, get))
        check_abortable(record)
        confirm_abort(record, yes)
        operation = client.call(
            client.stub.AbortRestore,
            pb.AbortRestoreRequest(
                restore_id=restore_id,
                confirm_cluster=record.cluster,
                requested_by=operator_name(),
            ),
            LONG_CALL_TIMEOUT,
        )
        final = operation_cli.follow(
            client,
            operation,
            ProgressPrinter(as_json),
            what=f"the abort of restore {restore_id}",
            hint="`ringsnap status` says where each node stands",
        )
        if final.state == types_pb2.OPERATION_STATE_FAILED:
            message = final.message or "; ".join(final.errors) or "no reason given"
            if final.error_reason == "RESTORE_REFUSED":
                raise RestoreRefused(message)
            raise CliError(
                message,
                reason_exit_code(final.error_reason, ExitCode.FAILED),
                reason=final.error_reason,
            )
        return messages.restore_record(client.call(client.stub.GetRestore, get))


def abort_ring_restore(config: Path | None, restore_id: str, yes: bool, as_json: bool) -> NoReturn:
    """Give `restore_id` up and exit with the command's code."""
    try:
        with command_coordinator(config) as target:
            record = _through(target, restore_id, yes, as_json)
    except CliError as error:
        fail(error, as_json)
        raise  # fail exits; for the type checker
    except RestoreRefused as error:
        fail(CliError(str(error), ExitCode.REFUSED, reason="RESTORE_REFUSED"), as_json)
        raise
    except KeyboardInterrupt:
        err.print("interrupted: the restore's record says where each node stands")
        raise typer.Exit(int(ExitCode.INTERRUPTED)) from None
    except RingsnapError as error:
        fail(CliError(str(error), error_exit_code(error)), as_json)
        raise
    if as_json:
        typer.echo(json.dumps({"restore": jsonable(record)}, indent=2))
    else:
        print_report(record)
    aborted = record.state is RestoreState.ABORTED
    raise typer.Exit(int(ExitCode.OK if aborted else ExitCode.FAILED))
