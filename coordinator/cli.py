"""`ringsnap`: the operator's command line.

Each group of verbs lives in its own module and is attached here; this module only assembles them
and turns a RingsnapError into its message and exit code.
"""

from __future__ import annotations

import sys

import typer

from ringsnap import __version__
from ringsnap.errors import RingsnapError

app = typer.Typer(
    name="ringsnap",
    help="Cluster-consistent array snapshots of Apache Cassandra, with restores that prove themselves.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"ringsnap {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version."
    ),
) -> None:
    """Cluster-consistent array snapshots of Apache Cassandra."""


def _attach_commands() -> None:
    # Imported here so that `ringsnap --help` stays fast and a broken optional part names itself.
    from ringsnap.coordinator import commands, restore_cli
    from ringsnap.coordinator.sandbox.cli import app as sandbox_app

    commands.register(app)
    app.command("restore")(restore_cli.restore_command)
    app.add_typer(sandbox_app, name="sandbox")


def main() -> None:
    _attach_commands()
    try:
        app()
    except RingsnapError as exc:
        typer.secho(f"error: {exc}", fg="red", err=True)
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
