"""`ringsnap export BACKUP` and `ringsnap export purge --cluster C`: copies of backups on S3.

Runs in this process, from the coordinator's config and catalog: each node's agent uploads its
SSTables and commit-log segments of the backup (from read-only clones of the array snapshot, or
its native snapshot); progress per node (bytes, files, rate, ETA) on stderr; a report per node;
exit codes: 0 exported, 4 failed (run it again: it resumes), 3 refused, 130 interrupted. While the
daemon holds the catalog, both go through it (`remote`, `purge_remote`); a purge also from a
bastion (`$RINGSNAP_REMOTE`).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.text import Text

from ringsnap.coordinator.assembly import load_config
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.cli import render
from ringsnap.coordinator.cli.client import REMOTE_ENV, CliError, ExitCode, Target, resolve_target
from ringsnap.coordinator.cli.console import Output, err, error_exit_code, fail, jsonable, out
from ringsnap.coordinator.cli.local_catalog import (
    ConfigOption,
    OutputOption,
    catalog_or_daemon,
    config_path,
)
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.export.model import ExportFailed, ExportRecord, ExportRefused
from ringsnap.coordinator.export.purge_daemon import configured_purge
from ringsnap.coordinator.export.retention import ClusterPurge
from ringsnap.coordinator.export.session import open_export_session
from ringsnap.errors import RingsnapError

PURGE = "purge"


class _Progress:
    """One line per node message on stderr; upload progress at most every 2 s per node."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.started = time.monotonic()
        self._last: dict[str, float] = {}

    def __call__(self, node: str, message: str) -> None:
        if self.quiet:
            return
        now = time.monotonic()
        if message.startswith(("commitlog:", "sstables:")):
            if now - self._last.get(node, 0.0) < 2.0:
                return
            self._last[node] = now
        who = f"{node}: " if node else ""
        err.print(Text.assemble((f"[{now - self.started:6.1f}s] ", "dim"), who, message))


def print_report(record: ExportRecord) -> None:
    out.print(
        Text.assemble(
            ("Export ", "bold"),
            f"of backup {record.backup_id} ({record.cluster}) to {record.destination or '?'}: ",
            (record.state.value.upper(), "bold green" if not record.error else "bold red"),
        )
    )
    for node in record.nodes:
        mib = 1024 * 1024
        line = (
            f"  {node.name}: {'exported' if node.exported else 'NOT exported'}"
            f" ({node.step.value}); {node.components} components,"
            f" {node.bytes_total / mib:.1f} MiB: {node.files_uploaded} uploaded"
            f" ({node.bytes_uploaded / mib:.1f} MiB), {node.files_skipped} already there;"
            f" {node.commitlog_segments} commit-log segments"
        )
        out.print(line)
        if node.commitlog_note:
            out.print(f"      commit log: {node.commitlog_note}")
        if node.error:
            out.print(render.labelled("      error: ", "red", node.error))
        for clone in node.clones_left:
            out.print(
                render.labelled(
                    "      clone left: ",
                    "yellow",
                    f"{clone.array}:{clone.clone} (a pending cleanup; the next run removes it)",
                )
            )
    out.print(f"  catalog record mirrored to the bucket: {'yes' if record.mirrored else 'no'}")
    for line in record.warnings:
        out.print(render.labelled("  warning: ", "yellow", line))


def _open_catalog(config: CoordinatorConfig, config_file: Path) -> Catalog | Target:
    """The catalog, opened exclusively; or, when the daemon holds it and answers, the daemon."""
    return catalog_or_daemon(config, config_file, hint="wait for the other command to end")


def _cluster_of(config: CoordinatorConfig, catalog: Catalog, backup: str, cluster: str) -> str:
    found = catalog.get_backup(backup).cluster
    if cluster and cluster != found:
        raise ExportRefused(f"backup {backup} is of cluster {found}, not {cluster}")
    return found


async def _export(
    config: CoordinatorConfig, catalog: Catalog, backup: str, options: dict[str, Any]
) -> ExportRecord:
    try:
        cluster = _cluster_of(config, catalog, backup, options["cluster"])
        async with open_export_session(config, cluster, catalog=catalog) as session:
            return await session.export(
                backup,
                options["nodes"],
                progress=_Progress(options["quiet"]),
                parallel_nodes=options["parallel"],
            )
    finally:
        await asyncio.to_thread(catalog.close)


def _purge(
    config: CoordinatorConfig, catalog: Catalog, cluster: str, options: dict[str, Any]
) -> ClusterPurge:
    try:
        return configured_purge(
            config,
            catalog,
            cluster,
            dry_run=options["dry_run"],
            min_age_seconds=options["min_age"],
        )()
    finally:
        catalog.close()


def purge_document(result: ClusterPurge) -> dict[str, Any]:
    return {
        "copies_removed": result.copies_removed,
        "copy_objects_deleted": result.copy_objects_deleted,
        "copies_kept": result.copies_kept,
        "components": jsonable(result.components),
        "key_objects_deleted": result.key_objects_deleted,
    }


def print_purge(purged: ClusterPurge, as_json: bool) -> NoReturn:
    """The purge's document (JSON) or its two lines, then exit 0."""
    if as_json:
        typer.echo(json.dumps({"purge": purge_document(purged)}, indent=2))
    else:
        c = purged.components
        verb = "would delete" if c.dry_run else "deleted"
        out.print(
            f"copies removed (backup gone from the catalog): "
            f"{', '.join(purged.copies_removed) or 'none'}"
            f" ({purged.copy_objects_deleted} objects); copies kept: {purged.copies_kept}"
        )
        out.print(
            f"components: {c.listed} listed, {c.referenced} referenced, {verb} {c.deleted}"
            f" ({c.bytes_deleted} bytes) in {c.delete_requests} requests,"
            f" {c.too_young} too young, {len(c.foreign_keys)} not ours"
        )
        # A dry run leaves the copies it would remove in place, and they keep their keys in use.
        dry = (
            " (a dry run counts only keys no object needs now; the copies it removes may free more)"
        )
        out.print(
            f"key objects of encrypted copies: {verb} {purged.key_objects_deleted}"
            + (dry if c.dry_run and purged.copies_removed else "")
        )
    raise typer.Exit(int(ExitCode.OK))


def _purge_through(target: Target, cluster: str, options: dict[str, Any], as_json: bool) -> None:
    """The purge by the daemon at `target` (PlanPurge for a dry run, else PurgeExports)."""
    from ringsnap.coordinator.cli import export_purge as purge_remote

    if not cluster:
        raise CliError("purge needs --cluster", ExitCode.USAGE, reason="INVALID_ARGUMENT")
    purged = purge_remote.purge(
        target,
        cluster,
        dry_run=options["dry_run"],
        min_age_seconds=options["min_age"],
        as_json=as_json,
    )
    print_purge(purged, as_json)


def export_command(  # noqa: PLR0917 - typer maps parameters to the command line
    backup: str = typer.Argument(..., help="The backup to export, or `purge`."),
    cluster: str = typer.Option("", "--cluster", help="The cluster (required for purge)."),
    nodes: str = typer.Option("", "--nodes", help="Comma-separated nodes (default: all)."),
    parallel: int = typer.Option(2, "--parallel", min=1, help="Nodes exported at once."),
    dry_run: bool = typer.Option(False, "--dry-run", help="purge: list, delete nothing."),
    min_age: float = typer.Option(
        6 * 3600.0,
        "--min-age",
        min=0,
        help="purge: never delete a component younger than this many seconds.",
    ),
    config: ConfigOption = None,
    output: OutputOption = Output.TEXT,
) -> None:
    """Copy a backup to S3 (each node uploads its own files), or purge the bucket.

    `ringsnap export BACKUP [--nodes a,b]`: clones the backup's volumes, mounts them read-only on
    each node, lets the node's agent upload what the bucket does not hold yet (SSTables and the
    commit-log segments captured with the backup), unmounts, deletes the clones, then mirrors the
    backup's catalog record to the bucket. Run it again after a failure: it resumes.

    `ringsnap export purge --cluster C [--dry-run]`: removes the copies of backups no longer in
    the catalog, then every component object no kept copy references (1,000 keys a request).
    Through the daemon while it holds the catalog (a dry run is a viewer's read; a purge holds
    the cluster as an export does).

    Exit codes: 0 done, 4 failed, 3 refused, 130 interrupted.
    """
    as_json = output is Output.JSON
    chosen = tuple(n.strip() for n in nodes.split(",") if n.strip())
    options: dict[str, Any] = {
        "cluster": cluster,
        "nodes": chosen,
        "parallel": parallel,
        "dry_run": dry_run,
        "min_age": min_age,
        "quiet": as_json,
    }
    try:
        if backup == PURGE and config is None and os.environ.get(REMOTE_ENV):
            # An operator on another host: the daemon purges, reached by its remote listener.
            _purge_through(resolve_target(None, None), cluster, options, as_json)
        loaded = load_config(config_path(config))
        opened = _open_catalog(loaded, config_path(config))
        if not isinstance(opened, Catalog):
            if backup == PURGE:
                _purge_through(opened, cluster, options, as_json)
            from ringsnap.coordinator.cli import export_remote as remote

            record = remote.export(opened, backup, chosen, parallel, as_json=as_json)
            if as_json:
                typer.echo(json.dumps({"export": jsonable(record)}, indent=2))
            else:
                print_report(record)
            raise typer.Exit(int(ExitCode.OK))
        catalog = opened
        if backup == PURGE:
            if not cluster:
                catalog.close()
                raise CliError("purge needs --cluster", ExitCode.USAGE, reason="INVALID_ARGUMENT")
            print_purge(_purge(loaded, catalog, cluster, options), as_json)
        record = asyncio.run(_export(loaded, catalog, backup, options))
    except CliError as error:
        fail(error, as_json)
    except ExportRefused as error:
        fail(CliError(str(error), ExitCode.REFUSED, reason="EXPORT_REFUSED"), as_json)
    except ExportFailed as error:
        if error.record is not None and not as_json:
            print_report(error.record)
        fail(CliError(str(error), ExitCode.FAILED, reason="EXPORT_FAILED"), as_json)
    except KeyboardInterrupt:
        err.print("interrupted: run the export again to resume (its record says how far it got)")
        raise typer.Exit(int(ExitCode.INTERRUPTED)) from None
    except RingsnapError as error:
        fail(CliError(str(error), error_exit_code(error)), as_json)
    if as_json:
        typer.echo(json.dumps({"export": jsonable(record)}, indent=2))
    else:
        print_report(record)
    raise typer.Exit(int(ExitCode.OK))
