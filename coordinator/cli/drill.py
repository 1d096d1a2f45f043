"""`ringsnap drill`: prove a backup restorable without touching production.

Runs in this process, from the coordinator's config and catalog (so it works while the daemon is
down): the plan (nodes, clones per array, the drill host, expected duration; a drill changes nothing
in production, so nothing is asked), live progress per node and step, a report per node with its
proof lines or why it is not proven, and an exit code scripts can use: 0 proven, 6 not proven,
4 failed, 3 refused, 130 interrupted.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
from rich.text import Text

from ringsnap.coordinator.assembly import load_config
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.cli import render
from ringsnap.coordinator.cli.client import CliError, ExitCode, Target
from ringsnap.coordinator.cli.console import (
    Output,
    ProgressPrinter,
    backup_fields,
    err,
    error_exit_code,
    fail,
    jsonable,
    operator_name,
    out,
    plan_table,
    print_title,
)
from ringsnap.coordinator.cli.local_catalog import (
    ConfigOption,
    OutputOption,
    catalog_or_daemon,
    config_path,
    quiet_cql_driver,
)
from ringsnap.coordinator.cli.operation import ends_at_plan, finish
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.drill.model import DrillRecord, DrillState, DrillVerdict
from ringsnap.coordinator.drill.plan import DrillPlan, DrillRequest
from ringsnap.coordinator.drill.session import open_drill_session
from ringsnap.coordinator.drill.workflow import DrillRefused
from ringsnap.errors import RingsnapError

EXIT_CODES = {
    DrillState.PROVEN: ExitCode.OK,
    DrillState.NOT_PROVEN: ExitCode.NOT_PROVEN,
    DrillState.FAILED: ExitCode.FAILED,
    DrillState.INTERRUPTED: ExitCode.INTERRUPTED,
    DrillState.RUNNING: ExitCode.INTERRUPTED,
}


def plan_document(plan: DrillPlan) -> dict[str, Any]:
    return {
        "drill_id": plan.drill_id,
        **backup_fields(plan.backup.id, plan.backup.cluster, plan.backup.started_at),
        "drill_host": plan.drill_host,
        "parallel": plan.parallel,
        "deadline_seconds": plan.deadline_seconds,
        "nodes": [
            {
                "name": n.name,
                "host_id": n.host_id,
                "drill_id_on_host": n.purpose_id,
                "clones": [
                    {
                        "array": v.array,
                        "volume": v.volume,
                        "role": v.role,
                        "stood_at": v.source_mount_point,
                        "snapshot": next(
                            (r.snapshot_name for r in n.snapshots if r.array == v.array), ""
                        ),
                    }
                    for v in n.volumes
                ],
            }
            for n in plan.nodes
        ],
        "changes_in_production": plan.changes,
        "warnings": list(plan.warnings),
        "refusals": list(plan.refusals),
        "expected_seconds": plan.expected_seconds,
    }


def print_plan(plan: DrillPlan) -> None:
    doc = plan_document(plan)
    err.print(
        Text.assemble(
            ("Drill plan ", "bold"),
            (doc["drill_id"], "bold cyan"),
            f": backup {doc['backup_id']} of cluster {doc['cluster']}"
            f" (taken {plan.backup.started_at:%Y-%m-%d %H:%M:%S} UTC), on drill host"
            f" {doc['drill_host'] or '(none)'}, {len(plan.nodes)} node(s), {plan.parallel} at a time",
        )
    )
    table = plan_table("node", "host id", "clone of", "stood at", "snapshot")
    for node in doc["nodes"]:
        for index, clone in enumerate(node["clones"]):
            first = index == 0
            table.add_row(
                node["name"] if first else "",
                node["host_id"][:8] if first else "",
                f"{clone['array']}:{clone['volume']} ({clone['role']})",
                clone["stood_at"],
                clone["snapshot"],
            )
    err.print(table)
    err.print(render.labelled("Changes: ", "bold green", plan.changes))
    for line in plan.warnings:
        err.print(render.labelled("warning: ", "yellow", line))
    expected = plan.expected_seconds
    err.print(
        "Expected duration: "
        + (
            f"about {render.duration(expected)} (past drills of this cluster)"
            if expected is not None
            else "unknown (no past drill of this cluster)"
        )
    )
    for line in plan.refusals:
        err.print(render.labelled("refused: ", "bold red", line))


_VERDICT_STYLES = {
    DrillVerdict.PROVEN: "bold green",
    DrillVerdict.NOT_PROVEN: "bold red",
    DrillVerdict.FAILED: "bold red",
    DrillVerdict.PENDING: "bold yellow",
}


#: A report's state in green, in red (else yellow).
_GOOD, _BAD = {DrillState.PROVEN}, {DrillState.NOT_PROVEN, DrillState.FAILED}


def print_report(record: DrillRecord) -> None:
    about = f"of backup {record.backup_id} ({record.cluster})"
    print_title("Drill", record, about, good=_GOOD, bad=_BAD)
    for node in record.nodes:
        seconds = sum(s for _, s in node.step_seconds)
        out.print(
            Text.assemble(
                f"  {node.name} ",
                (node.verdict.value.upper(), _VERDICT_STYLES[node.verdict]),
                (f"  ({render.duration(seconds)}, last step: {node.step.value})", "dim"),
            )
        )
        for line in node.proof:
            out.print(f"      {line}")
        if node.row_counts:
            counted = ", ".join(f"{table} {rows}" for table, rows in node.row_counts)
            out.print(f"      rows over its primary ranges (for table restores): {counted}")
        for line in node.problems:
            out.print(render.labelled("      not proven: ", "red", line))
        for line in node.teardown:
            out.print(render.labelled("      teardown: ", "yellow", line))
    for line in record.warnings:
        out.print(render.labelled("  warning: ", "yellow", line))


@dataclass(frozen=True)
class DrillOptions:
    request: DrillRequest
    dry_run: bool
    as_json: bool


async def _drill(
    config: CoordinatorConfig, catalog: Catalog, options: DrillOptions
) -> DrillRecord | dict[str, Any]:
    try:
        async with open_drill_session(config, options.request.cluster, catalog=catalog) as session:
            plan = await session.plan(options.request)
            ended = ends_at_plan(
                plan_document(plan),
                as_json=options.as_json,
                dry_run=options.dry_run,
                print_plan=lambda _: print_plan(plan),
                refused=DrillRefused,
            )
            if ended is not None:
                return ended
            progress = ProgressPrinter(quiet=options.as_json)
            return await session.run(plan, options.request, progress)
    finally:
        await asyncio.to_thread(catalog.close)


def _open_catalog(config: CoordinatorConfig, config_file: Path) -> Catalog | Target:
    """The catalog, opened exclusively; or, when the coordinator daemon holds it and answers, the
    daemon to drill through."""
    return catalog_or_daemon(
        config,
        config_file,
        hint="wait for it to end (a restore or another drill run from the command line)",
    )


def drill_command(  # noqa: PLR0917 - typer maps parameters to the command line
    backup: str = typer.Argument(None, help="The backup to drill (see `ringsnap list`)."),
    latest: bool = typer.Option(False, "--latest", help="Drill the newest complete backup."),
    cluster: str = typer.Option(..., "--cluster", help="The cluster whose backup is drilled."),
    nodes: str = typer.Option(
        "",
        "--nodes",
        help="Comma-separated node names to drill (default: one node, the one drilled longest ago).",
    ),
    ring: bool = typer.Option(False, "--ring", help="Drill every node of the backup."),
    parallel: int = typer.Option(
        1, "--parallel", min=1, help="Nodes drilled at once (bounded by the cluster's config)."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan and make nothing."),
    yes: bool = typer.Option(
        False, "--yes", "-y", help="Accepted for scripts: a drill asks no confirmation."
    ),
    config: ConfigOption = None,
    output: OutputOption = Output.TEXT,
) -> None:
    """Prove a backup restorable without touching production.

    Clones the backup's snapshots on the arrays, starts each drilled node on its clones on the
    cluster's drill host in a network namespace with no route anywhere, checks it (SSTable digests,
    host id and cluster name, the backup's canary, the node's own data, the manifest), then deletes
    everything it made. Changes nothing in production, so it asks nothing.

    Exit codes: 0 proven, 6 not proven, 4 failed, 3 refused, 130 interrupted.
    """
    del yes  # nothing to confirm
    as_json = output is Output.JSON
    quiet_cql_driver()
    try:
        if bool(backup) == latest:
            raise CliError(
                "name a backup to drill, or --latest (not both)",
                ExitCode.USAGE,
                reason="INVALID_ARGUMENT",
            )
        chosen = tuple(n.strip() for n in nodes.split(",") if n.strip())
        if chosen and ring:
            raise CliError(
                "--nodes and --ring exclude each other", ExitCode.USAGE, reason="INVALID_ARGUMENT"
            )
        loaded = load_config(config_path(config))
        try:
            loaded.cluster(cluster)
        except KeyError:
            raise CliError(
                f"unknown cluster {cluster!r}; configured:"
                f" {', '.join(c.name for c in loaded.clusters)}",
                ExitCode.USAGE,
                reason="INVALID_ARGUMENT",
            ) from None
        request = DrillRequest(
            cluster=cluster,
            backup_id=backup or "",
            nodes=chosen,
            ring=ring,
            parallel=parallel,
            trigger=f"cli:{operator_name()}",
            requested_by=operator_name(),
        )
        config_file = config_path(config)
        opened = _open_catalog(loaded, config_file)
        result: DrillRecord | dict[str, Any]
        if isinstance(opened, Catalog):
            result = asyncio.run(_drill(loaded, opened, DrillOptions(request, dry_run, as_json)))
        elif dry_run:
            raise CliError(
                "a dry run plans in this process, and the coordinator daemon holds the catalog",
                ExitCode.REFUSED,
                reason="CATALOG_LOCKED",
                hint="run it without --dry-run (the daemon plans, then drills), or while the"
                " daemon is stopped",
            )
        else:
            from ringsnap.coordinator.cli import drill_remote as remote

            result = remote.drill(opened, request, as_json=as_json)
    except CliError as error:
        fail(error, as_json)
    except DrillRefused as error:
        fail(CliError(str(error), ExitCode.REFUSED, reason="DRILL_REFUSED"), as_json)
    except KeyboardInterrupt:
        err.print("interrupted: what the drill made was torn down; its record says how far it got")
        raise typer.Exit(int(ExitCode.INTERRUPTED)) from None
    except RingsnapError as error:
        fail(CliError(str(error), error_exit_code(error)), as_json)
    finish(
        result,
        as_json=as_json,
        key="drill",
        document=jsonable,
        report=print_report,
        exit_code=lambda record: EXIT_CODES[record.state],
    )
