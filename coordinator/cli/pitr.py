"""`ringsnap restore --to TIME` (a restore to a time, docs/pitr.md) and the point-in-time lines of
`ringsnap status`. Both run in this process from the coordinator's config: the window needs the
bucket's keys, the restore the agents, arrays and catalog (as `ringsnap restore`)."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime
from pathlib import Path

import typer

from ringsnap.agent.s3.client import make_client
from ringsnap.coordinator.assembly import load_config
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.cli.client import CliError
from ringsnap.coordinator.cli.console import (
    ProgressPrinter,
    confirm,
    err,
    error_exit_code,
    fail,
    operator_name,
)
from ringsnap.coordinator.cli.local_catalog import config_path
from ringsnap.coordinator.cli.restore_report import exit_code_of, print_report
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.pitr.download import DownloadEstimate, estimate_download
from ringsnap.coordinator.pitr.window import status_lines
from ringsnap.coordinator.restore.pitr import parse_time
from ringsnap.coordinator.restore.pitr_session import plan_point_in_time, run_point_in_time
from ringsnap.coordinator.restore.s3_keys import NO_KEYS, RestoreKeys
from ringsnap.errors import RingsnapError


def pitr_status_lines(config: Path | None, cluster: str | None = None) -> list[str]:
    """The recoverable windows (`cluster`'s only, when given), read here from the config's
    bucket and catalog."""
    try:
        loaded = load_config(config_path(config))
        with Catalog(loaded.coordinator.catalog, exclusive=False) as catalog:
            return status_lines(loaded, catalog, cluster)
    except Exception as exc:
        return [f"(point-in-time window cannot be read: {exc})"]


def _downloads(
    config: CoordinatorConfig, nodes: list[str], target_ms: int, plan_started: datetime
) -> dict[str, DownloadEstimate]:
    """Per node, what the restore will fetch from the bucket (ringsnap.coordinator.pitr.download);
    nothing without the coordinator's `[s3]`."""
    if config.s3 is None:
        return {}
    client = make_client(config.s3)
    return {n: estimate_download(client, config.s3, n, target_ms, plan_started) for n in nodes}


def restore_to_time(
    config: Path | None,
    cluster: str,
    when: str,
    *,
    dry_run: bool,
    yes: bool,
    as_json: bool,
    from_s3: bool = False,
    keys: RestoreKeys = NO_KEYS,
) -> None:
    """Plan (the base backup, each node's segments and bytes), confirm, run, report. `keys`:
    `--key-file`'s, for a base copy on S3 that is encrypted."""
    try:
        loaded = load_config(config_path(config))
        target_ms = parse_time(when)
        names = [c.name for c in loaded.clusters]
        if not cluster:
            if len(names) != 1:
                raise RingsnapError(f"several clusters are configured ({names}): give --cluster")
            cluster = names[0]
        plan = asyncio.run(plan_point_in_time(loaded, cluster, target_ms))
        downloads = _downloads(loaded, sorted(plan.placements), target_ms, plan.base.started_at)
        document = {
            "base_backup": plan.base.id,
            "target_ms": target_ms,
            "nodes": {
                n: {
                    "segments": [s.name for s in p.segments],
                    "bytes": sum(s.bytes for s in p.segments),
                    "restore_point": p.restore_point,
                    **(
                        {
                            "download_bytes": downloads[n].bytes,
                            "download_segments": list(downloads[n].segments),
                        }
                        if n in downloads
                        else {}
                    ),
                }
                for n, p in plan.placements.items()
            },
            "refusals": list(plan.refusals),
        }
        if as_json:
            typer.echo(json.dumps(document, indent=2))
        else:
            typer.echo(f"restore cluster {cluster} to {when} (UTC): base backup {plan.base.id}")
            for node, placement in sorted(plan.placements.items()):
                total = sum(s.bytes for s in placement.segments)
                typer.echo(
                    f"  {node}: {len(placement.segments)} shipped segment(s), {total} bytes,"
                    f" replayed up to {placement.restore_point} GMT"
                )
                if node in downloads:
                    fetch = downloads[node]
                    typer.echo(
                        f"    downloads at most {fetch.bytes} bytes of commit log from the bucket"
                        f" ({len(fetch.segments)} segment(s) the backup's snapshot lacks)"
                    )
            if downloads:
                everything = sum(d.bytes for d in downloads.values())
                typer.echo(f"  in all: at most {everything} bytes of commit log to download")
            for refusal in plan.refusals:
                err.print(f"refused: {refusal}")
        if plan.refusals:
            raise typer.Exit(3)
        if dry_run:
            return
        confirm(cluster, yes)
        record = asyncio.run(
            run_point_in_time(
                loaded,
                cluster,
                target_ms,
                operator_name(),
                ProgressPrinter(quiet=as_json),
                from_s3=from_s3,
                keys=keys,
            )
        )
    except RingsnapError as exc:
        hint = "`ringsnap status` shows the window a time must lie in"
        fail(CliError(str(exc), error_exit_code(exc), hint=hint), as_json)
    print_report(record)
    raise typer.Exit(int(exit_code_of(record)))
