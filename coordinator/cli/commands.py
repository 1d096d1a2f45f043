"""`ringsnap backup | list | show | delete | status | retention`: the operator's verbs, talking to
the coordinator daemon over its API.

Every verb prints what happened for people (tables, live progress, a verdict) or, with
`--output json`, one JSON document on stdout for scripts. A failure prints what failed and what to
do, never a traceback, and exits with a documented code (`EXIT_CODES_HELP`).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from pathlib import Path

import typer
from rich.console import RenderableType
from rich.text import Text

from ringsnap.api.v1 import coordinator_pb2 as pb
from ringsnap.api.v1 import types_pb2
from ringsnap.coordinator.cli import render
from ringsnap.coordinator.cli.client import (
    EXIT_CODE_TABLE,
    CliError,
    Coordinator,
    ExitCode,
    reason_exit_code,
)
from ringsnap.coordinator.cli.console import Output, err, operator_name, out
from ringsnap.coordinator.cli.session import CONFIG, COORDINATOR, OUTPUT, YES, follow, session

#: The exit code table as `--help` shows it (typer keeps single newlines in rich mode).
EXIT_CODES_HELP = "[bold]Exit codes[/bold]\n\n" + "\n".join(
    f"{int(code):<4} {text}" for code, text in EXIT_CODE_TABLE
)


def _interactive() -> bool:
    return sys.stdin.isatty()


def _confirm(question: str, yes: bool, what: str) -> None:
    """Ask; refuse when there is nobody to ask. Raises CliError unless confirmed."""
    if yes:
        return
    if not _interactive():
        raise CliError(
            f"refusing to {what} without confirmation: there is no terminal to ask on",
            ExitCode.USAGE,
            reason="CONFIRMATION_REQUIRED",
            hint="review the plan above, then run the same command with --yes",
        )
    if not typer.confirm(question, default=False, err=True):
        raise CliError(
            f"nothing was done: you declined to {what}", ExitCode.REFUSED, reason="DECLINED"
        )


# -- backup ----------------------------------------------------------------------------------------


def _verdict(
    operation: types_pb2.Operation, backup: pb.Backup | None
) -> tuple[ExitCode, str, Text]:
    """Exit code, a one-word verdict for scripts, and the line for people."""
    if operation.state == types_pb2.OPERATION_STATE_SUCCEEDED and backup is not None:
        window = (
            f"; freeze window {render.freeze_window(backup)}" if backup.HasField("freeze") else ""
        )
        if backup.state == pb.BACKUP_STATE_PARTIAL:
            left_out = ", ".join(
                f"{n.name} ({n.excluded_reason})" for n in backup.nodes if n.excluded_reason
            )
            line = render.labelled(
                "PARTIAL ",
                "bold yellow",
                f"backup {backup.backup_id} of {render.nodes_summary(backup)} nodes in"
                f" {render.took(backup)}{window}. Left out: {left_out}. Those nodes are NOT"
                " protected by this backup.",
            )
            return ExitCode.PARTIAL, "partial", line
        line = render.labelled(
            "COMPLETE ",
            "bold green",
            f"backup {backup.backup_id} of all {backup.node_count} nodes in"
            f" {render.took(backup)}{window}",
        )
        return ExitCode.OK, "complete", line
    if operation.state == types_pb2.OPERATION_STATE_CANCELLED:
        line = render.labelled(
            "CANCELLED ",
            "bold red",
            "the coordinator stopped during the backup; every node was thawed and nothing was"
            " recorded as complete",
        )
        return ExitCode.FAILED, "cancelled", line
    reason = operation.error_reason
    code = reason_exit_code(reason, ExitCode.FAILED)
    message = operation.message or "; ".join(operation.errors) or "no reason given"
    if code is ExitCode.REFUSED:
        line = render.labelled(
            "REFUSED ",
            "bold red",
            f"the backup did not start, nothing changed on the nodes: {message}",
        )
        return code, "refused", line
    line = render.labelled(
        "FAILED ",
        "bold red",
        f"{message}. The nodes were thawed; nothing was recorded as complete.",
    )
    return code, "failed", line


def backup_command(  # noqa: PLR0917 - typer maps parameters to the command line
    cluster: str = typer.Argument(
        ..., metavar="CLUSTER", help="The cluster, as named in the coordinator's config."
    ),
    policy: str = typer.Option(
        "",
        "--policy",
        "-p",
        help="The retention policy the backup belongs to (\\[retention.<policy>]); retention runs"
        " after it. Default: none (kept until deleted).",
    ),
    wait: bool = typer.Option(
        True,
        "--wait/--no-wait",
        help="Follow the backup to its end (default), or print its operation and return at once.",
    ),
    config: Path | None = CONFIG,
    coordinator: str | None = COORDINATOR,
    output: Output = OUTPUT,
) -> None:
    """Take a backup of CLUSTER now, following its progress.

    Ends with the verdict, the freeze window and the catalog entry.

    Quiesce mode and partial backups are set per cluster in the coordinator's configuration. Ctrl-C stops following, not the backup.
    """
    with session(config, coordinator, output) as s:
        client = s.client()
        operation = client.start_backup(cluster, f"cli:{operator_name()}", policy)
        backup_id = operation.backup_id
        if not s.json:
            err.print(
                f"backup {backup_id} of cluster {cluster} started (operation"
                f" {operation.operation_id})"
            )
        if not wait:
            if s.json:
                s.emit({"operation": render.to_json(operation)})
            else:
                out.print(
                    f"follow it with `ringsnap status`; the result: `ringsnap show {backup_id}`"
                )
            return
        try:
            final = follow(s, operation, f"backup {backup_id}")
        except KeyboardInterrupt:
            raise CliError(
                f"stopped following; backup {backup_id} goes on in the coordinator",
                ExitCode.INTERRUPTED,
                reason="INTERRUPTED",
                hint=f"`ringsnap status`, then `ringsnap show {backup_id}`",
            ) from None
        backup: pb.Backup | None = None
        with contextlib.suppress(CliError):  # a busy cluster leaves no catalog entry
            backup = client.get_backup(backup_id)
        code, verdict, line = _verdict(final, backup)
        if s.json:
            s.emit(
                {
                    "verdict": verdict,
                    "exit_code": int(code),
                    "operation": render.to_json(final),
                    "backup": render.to_json(backup) if backup is not None else None,
                }
            )
        else:
            if backup is not None:
                out.print(render.backup_detail(backup))
                out.print()
            out.print(line)
        raise typer.Exit(int(code))


# -- list / show -----------------------------------------------------------------------------------

_PAGE_SIZE = 100


def list_command(
    cluster: str = typer.Argument(
        "", metavar="[CLUSTER]", help="Only this cluster (default: every cluster)."
    ),
    limit: int = typer.Option(
        50, "--limit", "-n", min=0, help="Show at most N backups, newest first; 0 shows all."
    ),
    config: Path | None = CONFIG,
    coordinator: str | None = COORDINATOR,
    output: Output = OUTPUT,
) -> None:
    """List backups, newest first (fetched page by page)."""
    with session(config, coordinator, output) as s:
        client = s.client()
        backups: list[pb.Backup] = []
        token = ""
        more = True
        while more and (limit == 0 or len(backups) < limit):
            size = _PAGE_SIZE if limit == 0 else min(_PAGE_SIZE, limit - len(backups))
            page = client.list_backups(cluster, size, token)
            backups.extend(page.backups)
            token = page.next_page_token
            more = bool(token)
        if s.json:
            s.emit({"backups": [render.to_json(b) for b in backups], "truncated": more})
            return
        if not backups:
            out.print(f"no backups{f' of cluster {cluster}' if cluster else ''} in the catalog")
            return
        out.print(render.backups_table(backups))
        if more:
            err.print(f"(the newest {len(backups)}; --limit 0 lists all)", style="dim")


def show_command(
    backup_id: str = typer.Argument(
        ..., metavar="BACKUP", help="The backup id (from `ringsnap list`)."
    ),
    config: Path | None = CONFIG,
    coordinator: str | None = COORDINATOR,
    output: Output = OUTPUT,
) -> None:
    """Show one backup in full.

    Its nodes and volumes, the array snapshots, the phase timings, the freeze window and its parts, and whether a restore or drill ever proved it. For a cluster with point-in-time recovery, its recoverable window too.
    """
    from ringsnap.coordinator.cli.pitr import pitr_status_lines

    with session(config, coordinator, output) as s:
        backup = s.client().get_backup(backup_id)
        if s.json:
            s.emit(render.to_json(backup))
        else:
            out.print(render.backup_detail(backup))
            for line in pitr_status_lines(config, backup.cluster):
                out.print(line)


# -- delete ----------------------------------------------------------------------------------------


def _destruction_plan(backup: pb.Backup, newest_complete: bool) -> RenderableType:
    lines = Text()
    lines.append("This deletes backup ")
    lines.append(backup.backup_id, style="bold")
    lines.append(
        f" of cluster {backup.cluster} ({render.state_name(backup.state)}, started"
        f" {render.when(render.moment(backup.started_at))}) from the catalog"
    )
    if backup.snapshots:
        lines.append(f" and DESTROYS its {len(backup.snapshots)} array snapshots:\n", style="bold")
        for ref in backup.snapshots:
            volumes = ", ".join(m.volume.name for m in ref.members)
            lines.append(f"  - array {ref.array}: snapshot {ref.snapshot_name} ({volumes})\n")
    else:
        lines.append("; it holds no array snapshots.\n")
    if newest_complete:
        lines.append(
            f"It is the NEWEST COMPLETE backup of cluster {backup.cluster}.\n", style="bold red"
        )
    if backup.verification == pb.VERIFICATION_STATE_PROVEN:
        lines.append("It is a backup a restore or drill has proven.\n", style="yellow")
    lines.append("This cannot be undone.", style="bold")
    return lines


def _is_newest_complete(client: Coordinator, backup: pb.Backup) -> bool:
    if backup.state != pb.BACKUP_STATE_COMPLETE:
        return False
    for cluster in client.status().clusters:
        if cluster.cluster == backup.cluster:
            return bool(
                cluster.HasField("last_successful_backup_at")
                and cluster.last_successful_backup_at == backup.finished_at
            )
    return False


def delete_command(
    backup_id: str = typer.Argument(
        ..., metavar="BACKUP", help="The backup id (from `ringsnap list`)."
    ),
    yes: bool = YES,
    config: Path | None = CONFIG,
    coordinator: str | None = COORDINATOR,
    output: Output = OUTPUT,
) -> None:
    """Delete a backup: its catalog entry and its array snapshots.

    Prints what will be destroyed and asks first; without a terminal it refuses unless --yes.
    """
    with session(config, coordinator, output) as s:
        client = s.client()
        backup = client.get_backup(backup_id)
        newest = _is_newest_complete(client, backup)
        err.print(_destruction_plan(backup, newest))
        _confirm(f"Delete backup {backup_id}?", yes, f"delete backup {backup_id}")
        operation = client.delete_backup(backup_id, f"`ringsnap delete` by {operator_name()}")
        final = follow(s, operation, f"deleting {backup_id}")
        failed = final.state != types_pb2.OPERATION_STATE_SUCCEEDED
        code = reason_exit_code(final.error_reason, ExitCode.FAILED) if failed else ExitCode.OK
        if s.json:
            s.emit({"exit_code": int(code), "operation": render.to_json(final)})
        elif failed:
            err.print(render.labelled("FAILED ", "bold red", final.message or "unknown error"))
        else:
            out.print(render.labelled("DELETED ", "bold green", final.message))
            for problem in final.errors:
                err.print(render.labelled("warning: ", "yellow", problem))
        raise typer.Exit(int(code))


# -- status ----------------------------------------------------------------------------------------


def status_command(
    config: Path | None = CONFIG,
    coordinator: str | None = COORDINATOR,
    output: Output = OUTPUT,
) -> None:
    """Per cluster: last backup, last success, what runs now, next scheduled run.

    Also the array snapshots of failed or deleted backups still to be cleaned up, and backups recently skipped (cluster busy, schedule missed). Restores that did not finish come first, read from the catalog, with each node's state and the exact next step: they show even while the daemon is down. Per cluster, the newest proven backup, the newer ones never proven, and the last restore drill (read from the catalog too). For node-local (LVM on the nodes' own disks) clusters: each node's thin-pool data and metadata use and thick copy-on-write room, asked of its agent, and each backup with no S3 copy (it dies with the nodes' disks).
    """
    from ringsnap.coordinator.cli.drill_status import drill_status_lines
    from ringsnap.coordinator.cli.local_catalog import config_path
    from ringsnap.coordinator.cli.node_local import node_local_lines
    from ringsnap.coordinator.cli.pitr import pitr_status_lines
    from ringsnap.coordinator.cli.restore_report import open_restores_lines

    restores = list(open_restores_lines(config))
    proofs = list(drill_status_lines(config_path(config)))
    node_local = node_local_lines(config)
    with session(config, coordinator, output) as s:
        if restores and not s.json:
            out.print(Text("Restores not finished", style="bold red"))
            for line in restores:
                out.print(line)
        status = s.client().status()
        if s.json:
            s.emit(
                {
                    **render.to_json(status),
                    "open_restores": restores,
                    "proofs": proofs,
                    "node_local": node_local,
                }
            )
        else:
            out.print(render.status_view(status))
            if proofs:
                out.print(Text("Proven backups and drills", style="bold"))
                for line in proofs:
                    out.print(line)
            for line in pitr_status_lines(config):
                out.print(line)
            if node_local:
                out.print(Text("Node-local snapshots", style="bold"))
                for line in node_local:
                    out.print(line)


# -- retention -------------------------------------------------------------------------------------


def retention_command(  # noqa: PLR0917 - typer maps parameters to the command line
    cluster: str = typer.Argument(..., metavar="CLUSTER", help="The cluster."),
    policy: str = typer.Argument(
        ...,
        metavar="POLICY",
        help="The retention policy (\\[retention.<policy>]).",
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Only show what the policy keeps and removes, and why."
    ),
    yes: bool = YES,
    config: Path | None = CONFIG,
    coordinator: str | None = COORDINATOR,
    output: Output = OUTPUT,
) -> None:
    """What retention POLICY keeps and removes of CLUSTER's backups, and why.

    With --dry-run nothing changes. Without it, the plan is shown, confirmed, then applied: the removed backups lose their catalog entries and their array snapshots.
    """
    with session(config, coordinator, output) as s:
        client = s.client()
        plan = client.plan_retention(cluster, policy, apply=False)
        removed = [d for d in plan.decisions if not d.keep]
        if dry_run or not removed:
            if s.json:
                s.emit({**render.to_json(plan), "dry_run": dry_run})
                return
            out.print(render.retention_table(plan))
            out.print(
                f"\npolicy {policy} keeps {len(plan.decisions) - len(removed)} and removes"
                f" {len(removed)} of {len(plan.decisions)} backups of cluster {cluster}"
            )
            if removed:
                out.print("dry run: nothing was deleted; run without --dry-run to apply")
            return
        if not s.json:
            out.print(render.retention_table(plan))
        err.print(
            Text(
                f"Applying policy {policy} DELETES {len(removed)} backups of cluster {cluster} and"
                " their array snapshots (the plan may shift if a backup finishes meanwhile)",
                style="bold",
            )
        )
        _confirm(
            f"Delete {len(removed)} backups?", yes, f"apply retention policy {policy} to {cluster}"
        )
        applied = client.plan_retention(cluster, policy, apply=True)
        gone = [d for d in applied.decisions if not d.keep]
        if s.json:
            s.emit({**render.to_json(applied), "dry_run": False})
            return
        out.print(
            render.labelled(
                "APPLIED ",
                "bold green",
                f"policy {policy}: removed {len(gone)} backups ("
                + ", ".join(d.backup_id for d in gone)
                + f"); kept {len(applied.decisions) - len(gone)}",
            )
        )


# -- wiring ----------------------------------------------------------------------------------------

COMMANDS: tuple[tuple[str, Callable[..., None]], ...] = (
    ("backup", backup_command),
    ("list", list_command),
    ("show", show_command),
    ("delete", delete_command),
    ("status", status_command),
    ("retention", retention_command),
)


def register(app: typer.Typer) -> None:
    """Attach the verbs to the `ringsnap` root app, each with the exit code table in its help."""
    app.info.epilog = EXIT_CODES_HELP
    for name, command in COMMANDS:
        app.command(name, epilog=EXIT_CODES_HELP)(command)
