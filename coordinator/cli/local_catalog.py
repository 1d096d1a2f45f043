"""The catalog for a command that needs it (restore and table restore: for the coordinator the CLI
hosts, `hosted`; drill and export: run in this process): opened exclusively, or, when it is locked
and the coordinator daemon answers (the daemon holds it), the daemon to run the command through."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Any

import typer

from ringsnap.coordinator.catalog import Catalog, CatalogLockedError
from ringsnap.coordinator.cli.client import (
    CliError,
    ExitCode,
    Target,
    answers,
    discover_config,
    resolve_target,
)
from ringsnap.coordinator.cli.console import Output
from ringsnap.coordinator.config import DEFAULT_CATALOG_PATH, DEFAULT_CONFIG_PATH, CoordinatorConfig
from ringsnap.errors import RingsnapError

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


#: What reading a config file for its catalog may raise.
UNREADABLE = (RingsnapError, OSError, tomllib.TOMLDecodeError)


def viewer_catalog(config_file: Path) -> tuple[dict[str, Any], Catalog | None]:
    """The config file's TOML document and its catalog opened shared and read-only (None when the
    catalog file does not exist): for status lines that need none of the config's secrets. Raises
    one of `UNREADABLE`."""
    with config_file.open("rb") as handle:
        document = tomllib.load(handle)
    table = document.get("coordinator", {})
    catalog_file = Path(table.get("catalog", DEFAULT_CATALOG_PATH))
    if not catalog_file.exists():
        return document, None
    return document, Catalog(catalog_file, exclusive=False)


def config_path(config: Path | None) -> Path:
    """Where the coordinator's config is (`discover_config`); the system-wide file by default."""
    found, _how = discover_config(config)
    return found or DEFAULT_CONFIG_PATH


def restore_catalog(config: CoordinatorConfig, config_file: Path) -> Catalog | Target:
    """The catalog, opened exclusively; or, when it is locked and the coordinator daemon answers
    (the daemon holds it), the daemon to restore through."""
    return catalog_or_daemon(
        config,
        config_file,
        held="is held by another process, most likely the coordinator daemon (or another restore)",
        hint="another `ringsnap` command may be running a restore, drill or export in its own"
        " process: wait for it to end; or the daemon does not answer: see why with `journalctl"
        " -u ringsnap-coordinator`",
    )


def quiet_cql_driver() -> None:
    """The driver logs every failed reconnection while the ring restarts (on purpose, during a
    restore); the restore says itself when the ring does not come back."""
    import logging

    logging.getLogger("cassandra").setLevel(logging.CRITICAL)
