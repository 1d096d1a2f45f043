"""`ringsnap restore BACKUP --keyspace K [--table T ...] [--as K.T2]`, and `--resume`/`--abort` of
a table restore: the plan, the typed confirmation (or --yes), progress per node and step, the
report, `--output json` and the exit codes of the whole-ring restore (0 done and checked, 6 not
checked, 3 refused, 4 failed: resume or abort it, 130 interrupted)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

import typer
from rich.text import Text

from ringsnap.coordinator.cli import render
from ringsnap.coordinator.cli.client import CliError, ExitCode
from ringsnap.coordinator.cli.console import (
    err,
    operator_name,
    out,
    plan_table,
    print_title,
)
from ringsnap.coordinator.cli.operation import finish
from ringsnap.coordinator.restore.s3_keys import NO_KEYS, RestoreKeys
from ringsnap.coordinator.table_restore.counts import NOT_COMPARED
from ringsnap.coordinator.table_restore.documents import record_document
from ringsnap.coordinator.table_restore.model import (
    TableRestoreFailed,
    TableRestoreRecord,
    TableRestoreRefused,
    TableRestoreRequest,
    TableRestoreState,
)
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
    #: `--from s3`: staged from the backup's copy on S3 instead of array clones.
    from_s3: bool = False
    #: `--key-file`: an encrypted copy's secret keys (in memory only).
    keys: RestoreKeys = field(default=NO_KEYS, repr=False, compare=False)


def parse_target(value: str) -> tuple[str, str]:
    """`K.T2` → (K, T2), both validated."""
    keyspace, dot, table = value.partition(".")
    if not dot:
        raise ValidationError(f"--as {value!r}: give keyspace.table")
    return keyspace_name(keyspace), table_name(table)


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
    table = plan_table("node", "table", "SSTables", "bytes", "staging", "free")
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


#: A report's state in green, in red (else yellow).
_GOOD, _BAD = (
    {TableRestoreState.SUCCEEDED},
    {TableRestoreState.NOT_PROVEN, TableRestoreState.FAILED, TableRestoreState.INTERRUPTED},
)


def print_report(record: TableRestoreRecord) -> None:
    about = f"of backup {record.backup_id}"
    print_title("Table restore", record, about, good=_GOOD, bad=_BAD, error=record.error)
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
    if record.state in (TableRestoreState.FAILED, TableRestoreState.INTERRUPTED):
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
        TableRestoreState.NOT_PROVEN: ExitCode.NOT_PROVEN,
        TableRestoreState.FAILED: ExitCode.FAILED,
        TableRestoreState.RUNNING: ExitCode.INTERRUPTED,
        TableRestoreState.INTERRUPTED: ExitCode.INTERRUPTED,
    }[record.state]


def request_of(options: TableRestoreOptions) -> TableRestoreRequest:
    """The new run the options ask for (names validated)."""
    return TableRestoreRequest(
        backup_id=options.backup_id or "",
        keyspace=options.keyspace,
        tables=options.tables,
        target=parse_target(options.target) if options.target else None,
        requested_by=operator_name(),
        from_s3=options.from_s3,
        keys=options.keys,
    )


def table_restore_main(
    run: Callable[[], TableRestoreRecord | dict[str, Any]], options: TableRestoreOptions
) -> NoReturn:
    """Run it (through the coordinator: `table_restore_client`) and exit with its code (the
    caller maps CliError and RingsnapError)."""
    try:
        result = run()
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
    finish(
        result,
        as_json=options.as_json,
        key="table_restore",
        document=record_document,
        report=print_report,
        exit_code=exit_code_of,
    )
