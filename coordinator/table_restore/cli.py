"""`ringsnap restore BACKUP --keyspace K [--table T ...] [--as K.T2]`, and `--resume`/`--abort` of
a table restore: the plan, the typed confirmation (or --yes), progress per node and step, the
report, `--output json` and the exit codes of the whole-ring restore (0 done and checked, 6 not
checked, 3 refused, 4 failed: resume or abort it, 130 interrupted)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import typer
from rich.table import Table
from rich.text import Text

from ringsnap.coordinator import render
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.client import CliError, ExitCode
from ringsnap.coordinator.commands import operator_name
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.restore_cli import ProgressPrinter, confirm, err, out
from ringsnap.coordinator.table_restore.counts import NOT_COMPARED
from ringsnap.coordinator.table_restore.model import (
    TableRestoreFailed,
    TableRestoreRecord,
    TableRestoreRefused,
    TableRestoreRequest,
    TableRestoreState,
)
from ringsnap.coordinator.table_restore.plan import TableRestorePlan
from ringsnap.coordinator.table_restore.session import open_table_restore_session
from ringsnap.errors import ValidationError
from ringsnap.names import keyspace_name, table_name


@dataclass(frozen=True)
class TableRestoreOptions:
    backup_id: str | None
    keyspace: str
    tables: tuple[str, ...]
    target: str | None
    dry_run: bool
    yes: bool
    resume: str | None
    abort: str | None
    as_json: bool


def parse_target(value: str) -> tuple[str, str]:
    """`K.T2` → (K, T2), both validated."""
    keyspace, dot, table = value.partition(".")
    if not dot:
        raise ValidationError(f"--as {value!r}: give keyspace.table")
    return keyspace_name(keyspace), table_name(table)


def record_document(record: TableRestoreRecord) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(_json(record))
    document["next_step"] = record.next_step.value
    document["next_action"] = record.next_action
    return document


def _json(record: TableRestoreRecord) -> str:
    from pydantic import TypeAdapter

    return TypeAdapter(TableRestoreRecord).dump_json(record).decode()


def plan_document(plan: TableRestorePlan) -> dict[str, Any]:
    document = record_document(plan.record)
    document["refusals"] = list(plan.refusals)
    return document


def print_plan(doc: Mapping[str, Any]) -> None:
    targets = ", ".join(
        f"{t['source_keyspace']}.{t['source_table']}"
        + (
            f" as {t['keyspace']}.{t['table']}"
            if (t["keyspace"], t["table"]) != (t["source_keyspace"], t["source_table"])
            else ""
        )
        + f" ({t['action']})"
        for t in doc["targets"]
    )
    err.print(
        Text.assemble(
            ("Table restore plan ", "bold"),
            (doc["id"], "bold cyan"),
            f": backup {doc['backup_id']} of cluster {doc['cluster']}: {targets or 'no table'};"
            " live, no node is stopped",
        )
    )
    table = Table(box=None, pad_edge=False)
    for column in ("node", "table", "SSTables", "bytes", "staging", "free"):
        table.add_column(column, overflow="fold")
    for node in doc["nodes"]:
        for index, tables in enumerate(node["tables"]):
            first = index == 0
            table.add_row(
                node["name"] if first else "",
                tables["table"],
                str(tables["sstables"]),
                render.size(tables["bytes"]),
                node["staging_directory"] if first else "",
                render.size(node["free_bytes"]) if first else "",
            )
    err.print(table)
    for clone in doc["clones"]:
        err.print(
            f"  clone: {clone['array']}:{clone['volume']} of {clone['node']} (its"
            f" {clone['source_mount_point']}), mounted read-only, deleted after staging"
        )
    for target in doc["targets"]:
        if target["action"] == "dropped":
            err.print(
                render.labelled(
                    "changes: ",
                    "bold red",
                    f"{target['keyspace']}.{target['table']} is created again with id"
                    f" {target['source_id']}, then imported into",
                )
            )
        elif target["action"] == "new":
            err.print(
                render.labelled(
                    "changes: ",
                    "bold",
                    f"{target['keyspace']}.{target['table']} is created with the schema of"
                    f" {target['source_keyspace']}.{target['source_table']}, then imported into",
                )
            )
        else:
            err.print(
                render.labelled(
                    "changes: ",
                    "bold red",
                    f"the backup's rows are imported into {target['keyspace']}.{target['table']}"
                    " (rows written since stay; the newer write of a row wins)",
                )
            )
    for line in doc["warnings"]:
        err.print(render.labelled("warning: ", "yellow", line))
    for line in doc.get("refusals", []):
        err.print(render.labelled("refused: ", "bold red", line))


def print_report(record: TableRestoreRecord) -> None:
    styles = {
        TableRestoreState.SUCCEEDED: "bold green",
        TableRestoreState.UNVERIFIED: "bold red",
        TableRestoreState.FAILED: "bold red",
        TableRestoreState.ABORTED: "bold yellow",
        TableRestoreState.RUNNING: "bold yellow",
    }
    took = ""
    if record.finished_at is not None:
        took = f" in {render.duration((record.finished_at - record.started_at).total_seconds())}"
    out.print(
        Text.assemble(
            ("Table restore ", "bold"),
            (record.id, "bold cyan"),
            f" of backup {record.backup_id}: ",
            (record.state.value.upper(), styles[record.state]),
            took,
        )
    )
    if record.error:
        out.print(render.labelled("error: ", "bold red", record.error))
    for node in record.nodes:
        out.print(Text.assemble(f"  {node.name}", (f"  (last step: {node.step.value})", "dim")))
    for line in record.verification:
        style = (
            "green"
            if line.startswith("ok:")
            else "yellow"
            if line.startswith(NOT_COMPARED)
            else "bold red"
        )
        out.print(Text.assemble("    ", (line, style)))
    for clone in record.clones:
        if clone.clone and not clone.deleted:
            out.print(
                render.labelled(
                    "  clone left: ",
                    "bold red",
                    f"{clone.array}:{clone.clone} (resume or abort deletes it)",
                )
            )
    for line in record.warnings:
        out.print(render.labelled("  warning: ", "yellow", line))
    if record.state is TableRestoreState.FAILED:
        out.print(
            render.labelled(
                "  next step: ",
                "bold",
                f"{record.next_action} (`ringsnap restore --resume {record.id}`, or give up with"
                f" `ringsnap restore --abort {record.id}`)",
            )
        )


def exit_code_of(record: TableRestoreRecord) -> ExitCode:
    return {
        TableRestoreState.SUCCEEDED: ExitCode.OK,
        TableRestoreState.ABORTED: ExitCode.OK,
        TableRestoreState.UNVERIFIED: ExitCode.NOT_PROVEN,
        TableRestoreState.FAILED: ExitCode.FAILED,
        TableRestoreState.RUNNING: ExitCode.INTERRUPTED,
    }[record.state]


async def run_table_restore(
    config: CoordinatorConfig, catalog: Catalog, options: TableRestoreOptions
) -> TableRestoreRecord | dict[str, Any]:
    """In this process; a plan's document when it ends at the plan (dry run or refusal)."""
    try:
        existing = options.resume or options.abort
        if existing:
            cluster = (await asyncio.to_thread(catalog.get_table_restore, existing)).cluster
        else:
            assert options.backup_id is not None
            cluster = (await asyncio.to_thread(catalog.get_backup, options.backup_id)).cluster
        async with open_table_restore_session(config, cluster, catalog=catalog) as session:
            progress = ProgressPrinter(quiet=options.as_json)
            if options.abort:
                return await session.abort(options.abort, progress)
            if options.resume:
                return await session.resume(options.resume, progress)
            request = TableRestoreRequest(
                backup_id=options.backup_id or "",
                keyspace=options.keyspace,
                tables=options.tables,
                target=parse_target(options.target) if options.target else None,
                requested_by=operator_name(),
            )
            plan = await session.plan(request)
            document = plan_document(plan)
            if options.as_json and (options.dry_run or plan.refused):
                return document
            print_plan(document)
            if plan.refused:
                raise TableRestoreRefused("the plan refused: " + "; ".join(plan.refusals))
            if options.dry_run:
                return document
            await asyncio.to_thread(confirm, cluster, options.yes)
            return await session.run(plan, progress)
    finally:
        await asyncio.to_thread(catalog.close)


def table_restore_main(
    config: CoordinatorConfig, catalog: Catalog, options: TableRestoreOptions
) -> None:
    """Run it and exit with its code (the caller maps CliError and RingsnapError)."""
    try:
        result = asyncio.run(run_table_restore(config, catalog, options))
    except TableRestoreRefused as error:
        raise CliError(str(error), ExitCode.REFUSED, reason="RESTORE_REFUSED") from None
    except TableRestoreFailed as error:
        if error.record is not None:
            if options.as_json:
                typer.echo(json.dumps({"table_restore": record_document(error.record)}, indent=2))
                raise typer.Exit(int(ExitCode.FAILED)) from None
            print_report(error.record)
        raise CliError(
            str(error),
            ExitCode.FAILED,
            reason="RESTORE_FAILED",
            hint="its record says where each node stands; `ringsnap restore --resume ID` goes on,"
            " `ringsnap restore --abort ID` removes the staging and any clone",
        ) from None
    if isinstance(result, dict):
        if options.as_json:
            typer.echo(json.dumps({"plan": result}, indent=2))
        raise typer.Exit(int(ExitCode.REFUSED if result["refusals"] else ExitCode.OK))
    if options.as_json:
        typer.echo(json.dumps({"table_restore": record_document(result)}, indent=2))
    else:
        print_report(result)
    raise typer.Exit(int(exit_code_of(result)))
