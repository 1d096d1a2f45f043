"""What every `ringsnap` verb that talks to the daemon shares: the connection options
(`--config`, `--coordinator`, `--output`, `--yes`), one command's session (its client, its output
format, a failure as a message and an exit code, never a traceback), and following an operation
to its end with live progress."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import click
import typer
from rich.console import RenderableType
from rich.live import Live
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

from ringsnap.api.v1 import types_pb2
from ringsnap.coordinator.cli import render
from ringsnap.coordinator.cli.client import CliError, Coordinator, ExitCode, resolve_target
from ringsnap.coordinator.cli.console import Output, err, fail, out

CONFIG = typer.Option(
    None,
    "--config",
    "-c",
    help="The coordinator's configuration file: its \\[coordinator] table gives the API address and"
    " where the API token is. Default: $RINGSNAP_CONFIG, else /etc/ringsnap/coordinator.toml if it"
    " exists.",
    dir_okay=False,
)
COORDINATOR = typer.Option(
    None,
    "--coordinator",
    help="HOST:PORT of the coordinator API (default: \\[coordinator] listen of --config, else"
    " 127.0.0.1:7444; or $RINGSNAP_COORDINATOR).",
    metavar="HOST:PORT",
)
OUTPUT = typer.Option(Output.TEXT, "--output", "-o", help="text for people, json for scripts.")
YES = typer.Option(
    False, "--yes", "-y", help="Do not ask for confirmation (needed without a terminal)."
)


@dataclass
class Session:
    """One command's connection settings and output format."""

    config: Path | None
    coordinator: str | None
    output: Output
    _client: Coordinator | None = field(default=None, init=False)

    @property
    def json(self) -> bool:
        return self.output is Output.JSON

    def client(self) -> Coordinator:
        if self._client is None:
            self._client = Coordinator(resolve_target(self.config, self.coordinator))
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def emit(self, document: dict[str, Any]) -> None:
        typer.echo(json.dumps(document, indent=2, sort_keys=False))

    def fail(self, error: CliError) -> NoReturn:
        fail(error, self.json)


@contextlib.contextmanager
def session(config: Path | None, coordinator: str | None, output: Output) -> Iterator[Session]:
    """Run a command body: CliError -> message + exit code; Ctrl-C -> 130; never a traceback."""
    current = Session(config, coordinator, output)
    for console in (out, err):
        if not console.is_terminal:  # piped or captured: never truncate ids to 80 columns
            console.width = 200
    try:
        yield current
    except CliError as error:
        current.fail(error)
    except KeyboardInterrupt:
        err.print("interrupted")
        raise typer.Exit(int(ExitCode.INTERRUPTED)) from None
    except (typer.Exit, typer.Abort, click.exceptions.Exit, click.ClickException, click.Abort):
        raise
    except Exception as exc:  # a bug: say so in one line, never with a traceback
        current.fail(
            CliError(
                f"internal error in ringsnap: {type(exc).__name__}: {exc}",
                ExitCode.ERROR,
                reason="INTERNAL",
                hint="report it with the command line; nothing else was attempted",
            )
        )
    finally:
        current.close()


class _ProgressView:
    """The live line: spinner, what runs, its phase, the time since it started."""

    def __init__(self, title: str, started: float) -> None:
        self.title = title
        self.phase = "starting"
        self.message = ""
        self._started = started
        self._spinner = Spinner("dots", style="cyan")

    def __rich__(self) -> RenderableType:
        grid = Table.grid(padding=(0, 1))
        line = Text(f"{self.title} ", no_wrap=True, overflow="ellipsis")
        line.append(self.phase, style="bold")
        line.append(f"  {render.duration(time.monotonic() - self._started)}", style="dim")
        if self.message:
            line.append(f"  {self.message}", style="dim")
        grid.add_row(self._spinner, line)
        return grid


def follow(session: Session, operation: types_pb2.Operation, title: str) -> types_pb2.Operation:
    """Watch `operation` to its end; in text mode, show the phase and the time as they change."""
    final = operation
    client = session.client()
    started = time.monotonic()
    if session.json or not err.is_terminal:
        for update in client.watch(operation.operation_id):
            if not session.json and update.phase and update.phase != final.phase:
                err.print(f"{render.duration(time.monotonic() - started):>9}  {update.phase}")
            final = update
        return final
    view = _ProgressView(title, started)
    with Live(view, console=err, refresh_per_second=8, transient=True):
        for update in client.watch(operation.operation_id):
            if update.phase and update.phase != view.phase:
                elapsed = render.duration(time.monotonic() - started)
                err.print(render.labelled(f"{elapsed:>9}  ", "dim", update.phase))
                view.phase = update.phase
            view.message = update.message
            final = update
    return final
