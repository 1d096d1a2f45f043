"""What a restore of nodes shows the operator: its plan (as a document and on the terminal), its
report with every node's verdict, and the exit code of its outcome. The same for a restore run in
the CLI's process and one run by the daemon."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.text import Text

from ringsnap.coordinator.cli import render
from ringsnap.coordinator.cli.client import ExitCode
from ringsnap.coordinator.cli.console import (
    backup_fields,
    err,
    jsonable,
    out,
    plan_table,
    print_title,
)
from ringsnap.coordinator.cli.local_catalog import UNREADABLE, config_path, viewer_catalog
from ringsnap.coordinator.model import NodeVerdict, RestoreMode, RestoreRecord, RestoreState
from ringsnap.coordinator.restore.plan import RestorePlan
from ringsnap.coordinator.restore.s3_keys import NO_KEYS, RestoreKeys


def plan_document(plan: RestorePlan) -> dict[str, Any]:
    return {
        "restore_id": plan.restore_id,
        **backup_fields(plan.backup.id, plan.backup.cluster, plan.backup.started_at),
        "mode": plan.mode.value,
        "whole_ring": plan.whole_ring,
        "nodes": [
            {
                "name": node.name,
                "host_id": node.host_id,
                "seed": node.seed,
                "cassandra_running": node.running,
                "volumes": [jsonable(v) for v in node.volumes],
            }
            for node in plan.nodes
        ],
        "snapshots": {a.array: a.ref.snapshot_name for a in plan.arrays},
        "destroyed": list(plan.destroyed),
        "lost_backups": list(plan.lost_backups),
        "warnings": list(plan.warnings),
        "refusals": list(plan.refusals),
        "expected_seconds": plan.expected_seconds,
    }


def print_plan(plan: RestorePlan | Mapping[str, Any]) -> None:
    """The plan for the operator (stderr), from its `plan_document` (what both the in-process and
    the daemon's plan become)."""
    doc = plan_document(plan) if isinstance(plan, RestorePlan) else plan
    nodes = doc["nodes"]
    started = datetime.fromisoformat(doc["backup_started_at"])
    scope = "the whole ring" if doc["whole_ring"] else f"{len(nodes)} node(s) alone"
    err.print(
        Text.assemble(
            ("Restore plan ", "bold"),
            (doc["restore_id"], "bold cyan"),
            f": backup {doc['backup_id']} of cluster {doc['cluster']} (taken {started:%Y-%m-%d %H:%M:%S} UTC),"
            f" {doc['mode']} mode, {scope}",
        )
    )
    table = plan_table("node", "host id", "Cassandra", "start", "volume", "mounted at", "snapshot")
    snapshots = doc["snapshots"]
    # No volumes (a restore from S3, or of native snapshots): the node's row says where from.
    in_place = "the bucket's copy (S3)" if doc["mode"] == "s3" else "its own snapshot"
    for node in nodes:
        for index, volume in enumerate(node["volumes"] or [None]):
            first = index == 0
            table.add_row(
                node["name"] if first else "",
                node["host_id"][:8] if first else "",
                ("running" if node["cassandra_running"] else "down") if first else "",
                ("seed, first" if node["seed"] else "after seeds") if first else "",
                f"{volume['array']}:{volume['volume']} ({volume['role']})" if volume else "-",
                volume["mount_point"] if volume else "data directories",
                snapshots.get(volume["array"], "?") if volume else in_place,
            )
    err.print(table)
    err.print(Text("Destroyed:", style="bold red"))
    for line in doc["destroyed"]:
        err.print(f"  - {line}")
    if doc["lost_backups"]:
        err.print(f"  - backups whose snapshots go with it: {', '.join(doc['lost_backups'])}")
    for line in doc["warnings"]:
        err.print(render.labelled("warning: ", "yellow", line))
    expected = doc["expected_seconds"]
    expectation = (
        f"about {render.duration(expected)} (median of past restores)"
        if expected is not None
        else "unknown (no past restore of this cluster)"
    )
    err.print(f"Expected duration: {expectation}")
    for line in doc["refusals"]:
        err.print(render.labelled("refused: ", "bold red", line))


#: A report's state in green, in red (else yellow).
_GOOD, _BAD = {RestoreState.PROVEN}, {RestoreState.NOT_PROVEN, RestoreState.FAILED}


def print_report(record: RestoreRecord) -> None:
    about = f"of backup {record.backup_id} ({record.mode.value})"
    print_title("Restore", record, about, good=_GOOD, bad=_BAD, error=record.error)
    for node in record.nodes:
        verdict_style = {
            NodeVerdict.PROVEN: "green",
            NodeVerdict.NOT_PROVEN: "red",
            NodeVerdict.PENDING: "yellow",
        }[node.verdict]
        out.print(
            Text.assemble(
                f"  {node.name} ",
                (node.verdict.value.upper(), f"bold {verdict_style}"),
                (f"  (last step: {node.step.value})", "dim"),
            )
        )
        for line in node.proof:
            out.print(f"      {line}")
        for line in node.unproven:
            out.print(render.labelled("      not proven: ", "yellow", line))
        if node.next_step:
            out.print(render.labelled("      next step: ", "bold", node.next_step))
    for volume_clone in record.clones:
        array, original, clone = volume_clone
        out.print(
            f"  clone: {array}:{clone} is mounted in place of {original} (kept untouched); name"
            f" {clone} in the coordinator's config so that backups take the clone"
        )
    for line in record.warnings:
        out.print(render.labelled("  warning: ", "yellow", line))


def exit_code_of(record: RestoreRecord) -> ExitCode:
    return {
        RestoreState.PROVEN: ExitCode.OK,
        RestoreState.NOT_PROVEN: ExitCode.NOT_PROVEN,
        RestoreState.FAILED: ExitCode.FAILED,
        RestoreState.INTERRUPTED: ExitCode.INTERRUPTED,
        RestoreState.RUNNING: ExitCode.INTERRUPTED,
        RestoreState.ABORTED: ExitCode.OK,
    }[record.state]


@dataclass(frozen=True)
class RestoreOptions:
    """What the operator asked for: the same whether the restore runs here or in the daemon."""

    backup_id: str | None
    nodes: tuple[str, ...]
    mode: RestoreMode
    dry_run: bool
    yes: bool
    force: bool
    resume: str | None
    as_json: bool
    #: `--key-file`: an encrypted copy's secret keys (in memory only, never shown).
    keys: RestoreKeys = field(default=NO_KEYS, repr=False, compare=False)


def open_restores_lines(config: Path | None) -> Iterator[str]:
    """For `ringsnap status`: restores that did not finish, each node's state and next step.

    Read from the catalog directly (shared, read-only), so it works with or without the daemon;
    only `[coordinator] catalog` is read from the config, so it needs none of its secrets.
    """
    try:
        _, catalog = viewer_catalog(config_path(config))
    except UNREADABLE as exc:
        yield f"(unfinished restores cannot be listed: {exc})"
        return
    if catalog is None:
        return
    with catalog:
        for record in catalog.open_restores():
            source = " from S3" if record.mode is RestoreMode.S3 else ""
            yield (
                f"restore {record.id} of backup {record.backup_id} ({record.cluster}){source}:"
                f" {record.state.value}{': ' + record.error if record.error else ''}"
            )
            for node in record.nodes:
                if node.next_step:
                    yield f"  {node.name} (last step: {node.step.value}): {node.next_step}"
        for table_restore in catalog.list_table_restores():
            if table_restore.state.finished:
                continue
            source = " from S3" if table_restore.from_s3 else ""
            yield (
                f"table restore {table_restore.id} of backup {table_restore.backup_id}"
                f" ({table_restore.cluster}){source}: {table_restore.state.value}"
                f"{': ' + table_restore.error if table_restore.error else ''}; next step:"
                f" {table_restore.next_action} (--resume or --abort {table_restore.id})"
            )
