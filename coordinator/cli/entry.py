"""`ringsnap`: the operator's command line.

Each group of verbs lives in its own module and is attached here; this module only assembles them
and turns a RingsnapError into its message and exit code.
"""

from __future__ import annotations

import importlib.util
import sys

import typer

from ringsnap import package_version
from ringsnap.errors import RingsnapError

app = typer.Typer(
    name="ringsnap",
    help="Cluster-consistent array snapshots of Apache Cassandra, with restores that prove themselves.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"ringsnap {package_version()}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version."
    ),
) -> None:
    """Cluster-consistent array snapshots of Apache Cassandra."""


#: What the `sandbox` extra installs; without it the sandbox's verbs are not attached.
SANDBOX_REQUIREMENTS = ("testcontainers", "docker")


def sandbox_installed() -> bool:
    return all(importlib.util.find_spec(name) is not None for name in SANDBOX_REQUIREMENTS)


def _sandbox_missing() -> None:
    """The local test bed: needs the `sandbox` extra (pip install 'ringsnap[sandbox]')."""
    typer.secho(
        "the sandbox is not installed: pip install 'ringsnap[sandbox]' (it brings testcontainers"
        " and docker)",
        fg="red",
        err=True,
    )
    raise typer.Exit(2)


def _attach_commands() -> None:
    # Imported here so that `ringsnap --help` stays fast and a broken optional part names itself.
    from ringsnap.coordinator.cli import commands
    from ringsnap.coordinator.cli import drill as drill_cli
    from ringsnap.coordinator.cli import export as export_cli
    from ringsnap.coordinator.cli import restore as restore_cli

    commands.register(app)
    app.command("restore")(restore_cli.restore_command)
    app.command("drill")(drill_cli.drill_command)
    app.command("export")(export_cli.export_command)
    if sandbox_installed():
        from ringsnap.sandbox.cli import app as sandbox_app

        app.add_typer(sandbox_app, name="sandbox")
    else:
        app.command(
            "sandbox",
            context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
        )(_sandbox_missing)


def main() -> None:
    _attach_commands()
    try:
        app()
    except RingsnapError as exc:
        typer.secho(f"error: {exc}", fg="red", err=True)
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
