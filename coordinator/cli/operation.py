"""What the CLI's long operations (whole-ring restore, table restore, drill) share, in their own
process or through the daemon: ending at the plan (dry run, refusal, `--output json`), following
the daemon's operation with one progress line per change to the run's record or error
(`follow_run`, for restores and table restores), and the final document, report and exit code. Each command keeps its own plan and report rendering; the flow is here, once."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, NoReturn, TypeVar

import typer

from ringsnap.api.v1 import types_pb2
from ringsnap.coordinator.cli.client import (
    CliError,
    Coordinator,
    ExitCode,
    Target,
    reason_exit_code,
)
from ringsnap.coordinator.cli.console import ProgressPrinter, err

R = TypeVar("R")

#: Operation phases that are the runners' own, not a workflow's progress line.
OWN_PHASES = frozenset({"", "plan", "record"})


def ends_at_plan(
    document: dict[str, Any],
    *,
    as_json: bool,
    dry_run: bool,
    print_plan: Callable[[dict[str, Any]], None],
    refused: Callable[[str], Exception],
) -> dict[str, Any] | None:
    """The plan shown (text) or kept for the JSON output: the document when the command ends at
    it (a dry run, or a refusal with --output json), None to go on; a refusal raises `refused`."""
    refusals = list(document.get("refusals", []))
    if as_json and (dry_run or refusals):
        return document
    print_plan(document)
    if refusals:
        raise refused("the plan refused: " + "; ".join(refusals))
    return document if dry_run else None


def follow(
    client: Coordinator,
    operation: types_pb2.Operation,
    printer: ProgressPrinter,
    *,
    what: str,
    hint: str,
    lost_hint: str = "",
    own_phases: frozenset[str] = OWN_PHASES,
) -> types_pb2.Operation:
    """Watch the daemon's operation to its end, printing each new progress line; Ctrl-C or a lost
    daemon stop following, not the operation (`what` names it, `hint` says where to look, and
    `lost_hint` when the daemon was lost, if it says more). With a coordinator this process hosts,
    Ctrl-C is raised on: leaving the hosted service interrupts the run, as it did in-process."""
    final = operation
    shown = ("", "")
    try:
        for update in client.watch(operation.operation_id):
            final = update
            seen = (update.phase, update.message)
            if update.phase not in own_phases and update.message and seen != shown:
                printer.line(update.message)
                shown = seen
    except KeyboardInterrupt:
        if client.target.hosted:
            raise  # this process runs it: the command's own handler says it was interrupted
        raise CliError(
            f"stopped following; {what} goes on in the coordinator",
            ExitCode.INTERRUPTED,
            reason="INTERRUPTED",
            hint=hint,
        ) from None
    except CliError as error:
        if error.exit_code is not ExitCode.UNREACHABLE:
            raise
        raise CliError(
            f"lost the coordinator while following {what}: {error}",
            ExitCode.UNREACHABLE,
            reason=error.reason,
            hint=lost_hint or hint,
        ) from None
    return final


@dataclass(frozen=True)
class FollowedRun(Generic[R]):
    """A run the coordinator executes as an operation, as the CLI follows it to its record:
    `what` names it ("restore rr-…"), `resume` is the command that goes on with it, `get` reads its
    record, `failed`/`refused` are the
    workflow's own errors (failed with the record when it can be read), `hint` says where to look
    when the CLI stops following, `lost_hint` (if it says more) when the daemon was lost."""

    what: str
    resume: str
    get: Callable[[], R]
    failed: Callable[[str, R | None], Exception]
    refused: Callable[[str], Exception]
    hint: str
    lost_hint: str = ""
    own_phases: frozenset[str] = OWN_PHASES


def follow_run(
    client: Coordinator,
    operation: types_pb2.Operation,
    run: FollowedRun[R],
    *,
    as_json: bool,
) -> R:
    """The started run followed to its end, one progress line per change: its final record, or
    the error it ended with (RESTORE_REFUSED → `refused`, RESTORE_FAILED → `failed`, any other
    reason its CliError). A coordinator that stopped meanwhile (the operation cancelled) leaves the
    record saying where the run stands; without one, INTERRUPTED."""
    if not as_json:
        err.print(_started(client.target, run, operation.operation_id), style="dim")
    final = follow(
        client,
        operation,
        ProgressPrinter(as_json),
        what=run.what,
        hint=run.hint,
        lost_hint=run.lost_hint,
        own_phases=run.own_phases,
    )
    if final.state == types_pb2.OPERATION_STATE_FAILED:
        reason = final.error_reason
        message = final.message or "; ".join(final.errors) or "no reason given"
        if reason == "RESTORE_FAILED":
            try:
                record: R | None = run.get()
            except CliError:
                record = None
            raise run.failed(message, record)
        if reason == "RESTORE_REFUSED":
            raise run.refused(message)
        raise CliError(message, reason_exit_code(reason, ExitCode.FAILED), reason=reason)
    try:
        return run.get()
    except CliError:
        if final.state != types_pb2.OPERATION_STATE_CANCELLED:
            raise
        raise CliError(
            f"the coordinator stopped during {run.what}",
            ExitCode.INTERRUPTED,
            reason="INTERRUPTED",
            hint=f"`ringsnap status` says where each node stands; `{run.resume}` goes on",
        ) from None


def _started(target: Target, run: FollowedRun[Any], operation_id: str) -> str:
    if target.hosted:
        # The operation's id is not shown: it ends with this process.
        return (
            f"{run.what} started in this process (no coordinator daemon runs): Ctrl-C"
            f" interrupts it; `{run.resume}` goes on"
        )
    return (
        f"{run.what} started in the coordinator (operation {operation_id}); Ctrl-C"
        " stops following, not the restore"
    )


def say_the_daemon_runs(target: Target, what: str, *, as_json: bool) -> None:
    """Tell the operator (not a JSON reader) that `what` runs in the daemon holding the catalog
    (nothing to tell when this process hosts the coordinator: no daemon runs)."""
    if not as_json and not target.hosted:
        err.print(
            f"the coordinator daemon at {target.address} holds the catalog: {what} runs in the"
            " daemon",
            style="dim",
        )


def raise_refusal_or_error(
    final: types_pb2.Operation,
    *,
    refused_reason: str,
    refused: Callable[[str], Exception],
    failed_reason: str,
) -> None:
    """For a failed operation: its refusal raised as `refused`, and an error of another kind than
    the workflow's own failure (`failed_reason`, or INTERNAL) raised as the CliError of its reason.
    The workflow's own failure returns: its record says more."""
    if final.state != types_pb2.OPERATION_STATE_FAILED or not final.error_reason:
        return
    message = final.message or "; ".join(final.errors) or "no reason given"
    if final.error_reason == refused_reason:
        raise refused(message)
    if final.error_reason not in {failed_reason, "INTERNAL"}:
        raise CliError(
            message,
            reason_exit_code(final.error_reason, ExitCode.FAILED),
            reason=final.error_reason,
        )


def finish(
    result: R | Mapping[str, Any],
    *,
    as_json: bool,
    key: str,
    document: Callable[[R], Any],
    report: Callable[[R], None],
    exit_code: Callable[[R], ExitCode],
) -> NoReturn:
    """Print the plan's document (a command that ended at its plan) or the record (`key` in
    JSON, else the report) and exit with the command's code."""
    if isinstance(result, Mapping):
        if as_json:
            typer.echo(json.dumps({"plan": dict(result)}, indent=2))
        raise typer.Exit(int(ExitCode.REFUSED if result.get("refusals") else ExitCode.OK))
    if as_json:
        typer.echo(json.dumps({key: document(result)}, indent=2))
    else:
        report(result)
    raise typer.Exit(int(exit_code(result)))
