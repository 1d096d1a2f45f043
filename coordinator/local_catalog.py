"""The catalog for a command that runs in this process (restore, drill, export): opened
exclusively, or, when it is locked and the coordinator daemon answers (the daemon holds it), the
daemon to run the command through."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ringsnap.coordinator.catalog import Catalog, CatalogLockedError
from ringsnap.coordinator.client import CliError, ExitCode, Target, answers, resolve_target
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.console import Output

#: The `--config` and `--output` options of such a command.
ConfigOption = Annotated[
    Path | None, typer.Option("--config", "-c", dir_okay=False, help="The coordinator's config.")
]
OutputOption = Annotated[Output, typer.Option("--output", "-o", help="text or json.")]

#: The refusal when the catalog's holder is not an answering daemon.
NOT_THE_DAEMON = "is held by another process that is not an answering coordinator daemon"


def catalog_or_daemon(
    config: CoordinatorConfig, config_file: Path, *, held: str = NOT_THE_DAEMON, hint: str
) -> Catalog | Target:
    """The catalog; or the daemon holding it. Refused (with `held` after the catalog's path and
    `hint`) when another process that is not an answering daemon holds it."""
    try:
        return Catalog(config.coordinator.catalog)
    except CatalogLockedError:
        daemon = answering_daemon(config_file)
        if daemon is not None:
            return daemon
        raise CliError(
            f"the catalog {config.coordinator.catalog} {held}",
            ExitCode.REFUSED,
            reason="CATALOG_LOCKED",
            hint=hint,
        ) from None


def answering_daemon(config_file: Path) -> Target | None:
    """The coordinator of `config_file` if its health service answers, else None."""
    try:
        target = resolve_target(config_file, None)
    except CliError:
        return None
    return target if answers(target) else None
