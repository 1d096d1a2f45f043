"""`ringsnap`: the operator's command line.

Each group of verbs lives in its own module and is attached here; this module only assembles them
and turns a RingsnapError into its message and exit code.
"""

from __future__ import annotations

import importlib.metadata
import re
import sys
from collections.abc import Callable
from importlib.metadata import EntryPoint

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


#: The entry-point group of verbs that parts behind an extra add to `ringsnap` (the test bed
#: declares `sandbox` in pyproject.toml): each names a typer app, attached under its name. The
#: product never imports them itself, so the CLI depends on no test code.
VERB_GROUP = "ringsnap.cli"


def missing_requirements(entry: EntryPoint) -> list[str]:
    """The distributions that the extras an entry point declares (`module:app [extra]`) need and
    that are not installed: while any is missing, its verbs are not attached."""
    if not entry.extras or entry.dist is None:
        return []
    missing = []
    for requirement in entry.dist.requires or ():
        spec, _, marker = requirement.partition(";")
        extras = set(re.findall(r"extra\s*==\s*['\"]([^'\"]+)['\"]", marker))
        if not extras & set(entry.extras):
            continue
        name = re.match(r"[A-Za-z0-9._-]+", spec.strip())
        if name is None:
            continue
        try:
            importlib.metadata.distribution(name.group(0))
        except importlib.metadata.PackageNotFoundError:
            missing.append(name.group(0))
    return missing


def _needs_extra(entry: EntryPoint, missing: list[str]) -> Callable[[], None]:
    distribution = entry.dist.name if entry.dist is not None else "ringsnap"
    install = f"pip install '{distribution}[{','.join(entry.extras)}]'"

    def needs_extra() -> None:
        typer.secho(
            f"the {entry.name} is not installed: {install} (it brings {' and '.join(missing)})",
            fg="red",
            err=True,
        )
        raise typer.Exit(2)

    needs_extra.__doc__ = f"Needs the `{','.join(entry.extras)}` extra ({install})."
    return needs_extra


def _attach_entry_points() -> None:
    for entry in sorted(importlib.metadata.entry_points(group=VERB_GROUP), key=lambda e: e.name):
        missing = missing_requirements(entry)
        if missing:
            app.command(
                entry.name,
                context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
            )(_needs_extra(entry, missing))
        else:
            app.add_typer(entry.load(), name=entry.name)


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
    _attach_entry_points()


def main() -> None:
    _attach_commands()
    try:
        app()
    except RingsnapError as exc:
        typer.secho(f"error: {exc}", fg="red", err=True)
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
