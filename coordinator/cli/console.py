"""What every operator command of `ringsnap` shares on the terminal: the consoles (progress and
errors on stderr, reports on stdout), the output format, domain values as JSON, the typed
confirmation, progress lines, an error's exit, and who runs the command."""

from __future__ import annotations

import dataclasses
import enum
import getpass
import json
import os
import sys
import time
from collections.abc import Collection
from datetime import datetime
from typing import Any, NoReturn, Protocol

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ringsnap.coordinator.cli import render
from ringsnap.coordinator.cli.client import CliError, ExitCode
from ringsnap.errors import ConfigError, RingsnapError

out = Console(highlight=False, soft_wrap=False)
err = Console(stderr=True, highlight=False)
for _console in (out, err):
    if not _console.is_terminal:  # piped or logged: never cut ids and paths to 80 columns
        _console.width = 200


class Output(enum.StrEnum):
    TEXT = "text"
    JSON = "json"


def jsonable(value: Any) -> Any:
    """A domain value (dataclasses, datetimes, enums, sequences) as JSON-ready data."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (tuple, list)):
        return [jsonable(v) for v in value]
    return value


def _interactive() -> bool:
    return sys.stdin.isatty()


def confirm(cluster: str, yes: bool) -> None:
    """The cluster's name, typed; or --yes. Without a terminal and --yes: exit 2."""
    if yes:
        return
    if not _interactive():
        raise CliError(
            "refusing to restore without confirmation: there is no terminal to ask on",
            ExitCode.USAGE,
            reason="CONFIRMATION_REQUIRED",
            hint="review the plan (--dry-run), then run the same command with --yes",
        )
    typed = typer.prompt(
        f"This destroys what the plan lists. Type the cluster's name ({cluster}) to restore",
        default="",
        show_default=False,
        err=True,
    )
    if typed.strip() != cluster:
        raise CliError(
            f"nothing was done: {typed.strip()!r} is not {cluster!r}",
            ExitCode.REFUSED,
            reason="DECLINED",
        )


class ProgressPrinter:
    """One line per node and step as they happen (to stderr; stdout stays for the report)."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.started = time.monotonic()

    def __call__(self, node: str, step: str, message: str) -> None:
        if self.quiet:
            return
        who = f"{node}: " if node else ""
        state = f" {message}" if message else " ..."
        err.print(Text.assemble(self._elapsed(), who, (step, "bold"), state))

    def line(self, text: str) -> None:
        """A progress line the daemon wrote (`restore_daemon.restore_progress_line`), with its step."""
        if self.quiet:
            return
        err.print(Text.assemble(self._elapsed(), text))

    def _elapsed(self) -> tuple[str, str]:
        return f"{render.duration(time.monotonic() - self.started):>9}  ", "dim"


def error_exit_code(error: RingsnapError) -> ExitCode:
    """The table's code for an error of ours: a bad config is a usage error (2), as for every verb."""
    if isinstance(error, ConfigError):
        return ExitCode.USAGE
    known = {int(code) for code in ExitCode}
    return ExitCode(error.exit_code) if error.exit_code in known else ExitCode.ERROR


def fail(error: CliError, as_json: bool, *, resumable: bool = False) -> NoReturn:
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "error": {
                        "message": str(error),
                        "reason": error.reason,
                        "hint": error.hint,
                        "exit_code": int(error.exit_code),
                    }
                },
                indent=2,
            )
        )
    else:
        err.print(render.labelled("error: ", "bold red", str(error)))
        if error.hint:
            err.print(render.labelled("what to do: ", "bold", error.hint))
    raise typer.Exit(int(error.exit_code))


class Reported(Protocol):
    """An operation's record, as the first line of its report shows it."""

    @property
    def id(self) -> str: ...

    @property
    def state(self) -> enum.Enum: ...

    @property
    def started_at(self) -> datetime: ...

    @property
    def finished_at(self) -> datetime | None: ...


def print_title(
    kind: str,
    record: Reported,
    about: str,
    *,
    good: Collection[enum.Enum],
    bad: Collection[enum.Enum],
    error: str = "",
) -> None:
    """The first line of an operation's report, e.g. `Restore rr-1 of backup rs-1 (s3): PROVEN in
    2 min` (the time taken once it finished; the state green when `good`, red when `bad`, yellow
    otherwise), then its `error` if any."""
    style = (
        "bold green"
        if record.state in good
        else "bold red"
        if record.state in bad
        else "bold yellow"
    )
    took = ""
    if record.finished_at is not None:
        took = f" in {render.duration((record.finished_at - record.started_at).total_seconds())}"
    out.print(
        Text.assemble(
            (f"{kind} ", "bold"),
            (record.id, "bold cyan"),
            f" {about}: ",
            (str(record.state.value).upper(), style),
            took,
        )
    )
    if error:
        out.print(render.labelled("error: ", "bold red", error))


def plan_table(*columns: str) -> Table:
    """A plan's table of `columns`. Volumes, mount points and snapshot names are what the operator
    checks: a cell wraps, never is cut."""
    table = Table(box=None, pad_edge=False)
    for column in columns:
        table.add_column(column, overflow="fold")
    return table


def backup_fields(backup_id: str, cluster: str, started_at: datetime) -> dict[str, str]:
    """A plan document's fields naming the backup it is of."""
    return {"backup_id": backup_id, "cluster": cluster, "backup_started_at": started_at.isoformat()}


def operator_name() -> str:
    """Who runs the command, for the catalog (the sudo user behind root, when there is one)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid {os.getuid()}"
    sudo = os.environ.get("SUDO_USER")
    return f"{sudo} (sudo)" if sudo and sudo != user else user
