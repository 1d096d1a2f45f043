"""`ringsnap restore`: the on-call engineer's command.

Plan, typed confirmation, live progress per node and step, a report with every node's verdict, and
an exit code scripts can use (0 proven, 6 not proven, 3 refused, 4 failed, 130 interrupted).

The restore always runs in the coordinator's code, through its API (`restore_client`): in the
daemon while it runs (it holds the catalog); when no daemon runs (an incident), in the same service
hosted by this process for the one restore, under the same catalog lock (`hosted`); from another
host, in the remote daemon over mutual TLS. The same plan, confirmation, progress, report and exit
codes either way, rendered by the same functions (`restore_report`, `console`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ringsnap.coordinator.cli import restore_client
from ringsnap.coordinator.cli.client import (
    CliError,
    ExitCode,
)
from ringsnap.coordinator.cli.console import (
    Output,
    err,
    error_exit_code,
    fail,
    jsonable,
)
from ringsnap.coordinator.cli.hosted import command_coordinator
from ringsnap.coordinator.cli.local_catalog import (
    OutputOption,
    quiet_cql_driver,
)
from ringsnap.coordinator.cli.restore_report import (
    RestoreOptions,
    exit_code_of,
    print_report,
)
from ringsnap.coordinator.model import RestoreMode, RestoreRecord
from ringsnap.coordinator.restore.s3_keys import NO_KEYS, RestoreKeys
from ringsnap.coordinator.restore.workflow import RestoreFailed, RestoreRefused
from ringsnap.errors import RingsnapError, ValidationError

# -- the command ------------------------------------------------------------------------------------


def _finish(record: RestoreRecord, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps({"restore": jsonable(record)}, indent=2))
    else:
        print_report(record)
    raise typer.Exit(int(exit_code_of(record)))


def restore_command(  # noqa: PLR0917 - typer maps parameters to the command line
    backup: str = typer.Argument(None, help="The backup to restore (see `ringsnap list`)."),
    nodes: str = typer.Option(
        "", "--nodes", help="Comma-separated node names to restore alone (default: the whole ring)."
    ),
    mode: Annotated[
        RestoreMode,
        typer.Option(
            "--mode",
            help="revert: the volumes go back in place; clone: new volumes from the snapshot are"
            " mounted instead and the originals are kept untouched.",
        ),
    ] = RestoreMode.REVERT,
    source: str = typer.Option(
        "",
        "--from",
        metavar="s3",
        help="s3: restore from the backup's copy on S3 (the array is not needed): every node"
        " downloads and verifies its copy before anything is stopped (docs/s3.md).",
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan and change nothing."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask to type the cluster's name."),
    force: bool = typer.Option(
        False,
        "--force",
        help="Restore nodes alone even from a backup older than gc_grace_seconds.",
    ),
    resume: str = typer.Option(
        None,
        "--resume",
        metavar="RESTORE_ID",
        help="Go on with an interrupted or failed restore from each node's last finished step.",
    ),
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            dir_okay=False,
            help="The coordinator's config (default: $RINGSNAP_CONFIG, else"
            " /etc/ringsnap/coordinator.toml). While the coordinator daemon holds the catalog,"
            " restores run in the daemon, at the API address and with the token of this config;"
            " when no daemon runs, this process hosts the coordinator's service for the restore:"
            " it then needs the TLS key, array credentials and the catalog.",
        ),
    ] = None,
    output: OutputOption = Output.TEXT,
    keyspace: str = typer.Option(
        "",
        "--keyspace",
        help="Table-level restore, live (no node stopped): bring this keyspace's tables back from"
        " the backup (see docs/table-restore.md).",
    ),
    tables: list[str] = typer.Option(  # noqa: B008 - typer's way to declare a repeated option
        [], "--table", help="With --keyspace: a table to restore (repeat it; default: all)."
    ),
    as_table: str = typer.Option(
        None, "--as", metavar="K.T2", help="With --keyspace and one --table: restore into K.T2."
    ),
    to: str = typer.Option(
        None,
        "--to",
        metavar="TIME",
        help="Restore the whole ring to this moment (UTC, ms precision, e.g."
        " 2026-11-29T06:40:00.123Z): the newest backup before it, then the shipped commit log"
        " replayed up to it (docs/pitr.md). With --cluster when several are configured.",
    ),
    cluster: str = typer.Option("", "--cluster", help="With --to: the cluster."),
    key_file: str = typer.Option(
        "",
        "--key-file",
        metavar="PATH",
        help="With --from s3, an encrypted copy: the age secret key file (AGE-SECRET-KEY-1...) of"
        " one of its recipients (or `kms KEY [credentials]` lines for KMS recipients), or"
        " credential:NAME for a systemd credential. Sent to each node for its download only;"
        " never stored, so a --resume needs it again (docs/s3.md).",
    ),
    abort: str = typer.Option(
        None,
        "--abort",
        metavar="RESTORE_ID",
        help="Give a failed table restore (tr-...) up: its clones and staging are removed; or a"
        " restore from S3 (rr-...) not installed yet: each node's download is removed and the"
        " nodes it stopped start again.",
    ),
) -> None:
    """Restore a backup from its array snapshots and prove it, node by node.

    Prints the plan (nodes, volumes, snapshots, what is destroyed, expected time), asks you to type
    the cluster's name, stops Cassandra on the target nodes, reverts (or clones) their volumes,
    starts the ring again seeds first, and proves every node with its canaries and its manifest.

    Runs in the coordinator's code, through its API. While the daemon runs (it holds the catalog),
    the restore runs in the daemon instead, through its API; meanwhile the daemon skips the
    cluster's backups, and Ctrl-C stops following, not the restore. When the daemon is down, this
    process hosts the same service for the restore, under the same catalog lock, with the same
    plan, confirmation, progress and report; Ctrl-C then interrupts the restore (resume it).

    Exit codes: 0 proven, 6 not proven, 3 refused, 4 failed (the report says what each node was
    left in), 130 interrupted (resume it).
    """
    as_json = output is Output.JSON
    quiet_cql_driver()
    if to:
        from ringsnap.coordinator.cli.pitr import restore_to_time

        try:
            from_s3 = _mode_with_source(mode, source) is RestoreMode.S3
            # An encrypted base copy opens with these; refused without --from s3.
            to_keys = _keys(key_file, from_s3)
        except CliError as error:
            fail(error, as_json)
        restore_to_time(
            config,
            cluster,
            to,
            dry_run=dry_run,
            yes=yes,
            as_json=as_json,
            from_s3=from_s3,
            keys=to_keys,
        )
        return
    if abort and abort.startswith("rr-"):
        from ringsnap.coordinator.cli.restore_abort import abort_ring_restore

        abort_ring_restore(config, abort, yes, as_json)
    if keyspace or abort or (resume or "").startswith("tr-"):
        _table_restore(
            config,
            backup,
            keyspace,
            tables,
            as_table,
            dry_run,
            yes,
            resume,
            abort,
            as_json,
            source=source,
            key_file=key_file,
        )
    try:
        if bool(backup) == bool(resume):
            raise CliError(
                "name a backup to restore, or --resume RESTORE_ID (not both)",
                ExitCode.USAGE,
                reason="INVALID_ARGUMENT",
            )
        mode = _mode_with_source(mode, source)
        keys = _keys(key_file, mode is RestoreMode.S3 or bool(resume))
        options = RestoreOptions(
            backup_id=backup,
            nodes=tuple(n.strip() for n in nodes.split(",") if n.strip()),
            mode=mode,
            dry_run=dry_run,
            yes=yes,
            force=force,
            resume=resume,
            as_json=as_json,
            keys=keys,
        )
        with command_coordinator(config) as target:
            result = restore_client.restore(target, options)
    except CliError as error:
        fail(error, as_json)
    except RestoreRefused as error:
        fail(CliError(str(error), ExitCode.REFUSED, reason="RESTORE_REFUSED"), as_json)
    except RestoreFailed as error:
        if error.record is not None:
            # What each node was left in, and the exact next step, matter more than the error.
            if as_json:
                typer.echo(json.dumps({"restore": jsonable(error.record)}, indent=2))
                raise typer.Exit(int(ExitCode.FAILED)) from None
            print_report(error.record)
        fail(
            CliError(
                str(error),
                ExitCode.FAILED,
                reason="RESTORE_FAILED",
                hint="see the record: `ringsnap status`; go on with `ringsnap restore --resume ID`",
            ),
            as_json,
            resumable=True,
        )
    except KeyboardInterrupt:
        err.print(
            "interrupted: the restore's record says where each node stands (`ringsnap status`)"
        )
        raise typer.Exit(int(ExitCode.INTERRUPTED)) from None
    except RingsnapError as error:
        fail(CliError(str(error), error_exit_code(error)), as_json)
    if isinstance(result, dict):
        if as_json:
            typer.echo(json.dumps({"plan": result}, indent=2))
        raise typer.Exit(int(ExitCode.REFUSED if result["refusals"] else ExitCode.OK))
    _finish(result, as_json)


def _keys(key_file: str, from_s3: bool) -> RestoreKeys:
    """The keys of `--key-file` (none without it); refused unless the restore reads S3."""
    if not key_file:
        return NO_KEYS
    if not from_s3:
        raise CliError(
            "--key-file opens an encrypted copy on S3: it goes with --from s3 (or --resume)",
            ExitCode.USAGE,
            reason="INVALID_ARGUMENT",
        )
    try:
        return RestoreKeys.of_reference(key_file)
    except ValidationError as exc:
        raise CliError(str(exc), ExitCode.USAGE, reason="INVALID_ARGUMENT") from None


def _mode_with_source(mode: RestoreMode, source: str) -> RestoreMode:
    """`--from s3` is the S3 mode; the array's modes are for restores from snapshots."""
    if source not in ("", "s3"):
        raise CliError(
            f"--from {source!r}: the only other source is s3",
            ExitCode.USAGE,
            reason="INVALID_ARGUMENT",
        )
    if source and mode is RestoreMode.CLONE:
        raise CliError(
            "--mode clone clones array snapshots; a restore --from s3 installs the copy in place",
            ExitCode.USAGE,
            reason="INVALID_ARGUMENT",
        )
    return RestoreMode.S3 if source else mode


def _table_restore(  # noqa: PLR0917 - the options of the command line
    config: Path | None,
    backup: str | None,
    keyspace: str,
    tables: list[str],
    as_table: str | None,
    dry_run: bool,
    yes: bool,
    resume: str | None,
    abort: str | None,
    as_json: bool,
    *,
    source: str = "",
    key_file: str = "",
) -> None:
    """`--keyspace` (or a table restore's --resume/--abort): ringsnap.coordinator.table_restore,
    run by the coordinator as a whole-ring restore is (`hosted.command_coordinator`)."""
    from ringsnap.coordinator.cli import table_restore_client as client
    from ringsnap.coordinator.cli.table_restore import TableRestoreOptions, table_restore_main

    try:
        if sum(bool(v) for v in (backup, resume, abort)) != 1 or (backup and not keyspace):
            raise CliError(
                "a table restore needs BACKUP --keyspace K, or --resume ID, or --abort ID",
                ExitCode.USAGE,
                reason="INVALID_ARGUMENT",
            )
        options = TableRestoreOptions(
            backup_id=backup,
            keyspace=keyspace,
            tables=tuple(tables),
            target=as_table,
            dry_run=dry_run,
            yes=yes,
            resume=resume,
            abort=abort,
            as_json=as_json,
            from_s3=_mode_with_source(RestoreMode.REVERT, source) is RestoreMode.S3,
            keys=_keys(key_file, bool(source) or bool(resume)),
        )
        with command_coordinator(config) as target:
            table_restore_main(lambda: client.table_restore(target, options), options)
    except CliError as error:
        fail(error, as_json)
    except KeyboardInterrupt:
        err.print("interrupted: the table restore's record says where each node stands")
        raise typer.Exit(int(ExitCode.INTERRUPTED)) from None
    except RingsnapError as error:
        fail(CliError(str(error), error_exit_code(error)), as_json)
