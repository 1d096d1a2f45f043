"""`ringsnap-coordinator`: run the coordinator daemon, or check its configuration.

    ringsnap-coordinator serve [--config /etc/ringsnap/coordinator.toml]
    ringsnap-coordinator check-config [--config FILE]
    ringsnap-coordinator catalog rebuild --from s3[://bucket/prefix/] [--merge] [--key-file K]
        [--config FILE]

`serve` logs JSON lines to stdout (journald), speaks sd_notify (READY, WATCHDOG, STOPPING), serves
Prometheus metrics on `metrics_listen` and the API on `listen` (loopback only). SIGTERM or SIGINT
stops it gracefully: the API stops taking work, running backups are cancelled (every frozen node is
thawed and the catalog records why the run failed), then the process exits 0.

Exit codes: 0 ok (also after SIGTERM); 1 the coordinator failed; 75 the catalog is in use by another
coordinator; 78 configuration error (the message names the file and the key).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ringsnap import certs, logs, sdnotify
from ringsnap.config import redacted
from ringsnap.coordinator.agents.node_snapshots import DRIVER as NODE_LOCAL_DRIVER
from ringsnap.coordinator.api.listeners import CoordinatorServer, RemoteListener, loopback_problem
from ringsnap.coordinator.api.token import remove_token, token_path, write_token
from ringsnap.coordinator.assembly import load_config, open_coordinator
from ringsnap.coordinator.cluster_clients import node_local_agent
from ringsnap.coordinator.config import DEFAULT_CONFIG_PATH, CoordinatorConfig
from ringsnap.coordinator.metrics import MetricsServer
from ringsnap.coordinator.pitr.time_canaries import running_time_canaries
from ringsnap.errors import ConfigError, RingsnapError
from ringsnap.plugins.registry import open_driver

log = logs.get_logger("ringsnap.coordinator")

#: In-flight API calls (watchers receiving the final state) get this long after the backups stop.
SHUTDOWN_GRACE_SECONDS = 5.0
_SECRET_MARKERS = ("password", "secret", "token", "api_key", "credential", "private_key")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ringsnap-coordinator",
        description="ringsnap's coordinator: schedules, backups across the ring, retention, the"
        " catalog, the API for the `ringsnap` CLI, Prometheus metrics.",
        epilog="Exit codes: 0 ok (also after SIGTERM); 1 the coordinator failed; 75 the catalog is"
        " in use by another coordinator; 78 configuration error.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = commands.add_parser("serve", help="run the coordinator (under systemd: Type=notify)")
    serve.add_argument("--config", type=Path, default=DEFAULT_CONFIG_PATH, help="coordinator.toml")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    serve.add_argument(
        "--log-format",
        default="json",
        choices=["json", "console"],
        help="json lines for journald (default) or a console format for people",
    )
    check = commands.add_parser(
        "check-config",
        help="validate the configuration and print it with secrets redacted",
        description="Validate coordinator.toml (every key, cross-references, secret files,"
        " array driver settings) and print the effective configuration as JSON, secrets"
        " redacted. Contacts nothing.",
    )
    check.add_argument("--config", type=Path, default=DEFAULT_CONFIG_PATH, help="coordinator.toml")
    catalog = commands.add_parser("catalog", help="catalog maintenance")
    catalog_commands = catalog.add_subparsers(dest="catalog_command", required=True)
    rebuild = catalog_commands.add_parser(
        "rebuild",
        help="rebuild the catalog from the backups' copies on S3 (docs/s3.md)",
        description="Record every backup mirrored to the bucket (its nodes, snapshots,"
        " manifests, schemas and export) in the configured catalog, which must be empty unless"
        " --merge. Backups whose arrays this coordinator does not know are marked as copies only"
        " on S3.",
    )
    rebuild.add_argument(
        "--config", type=Path, default=DEFAULT_CONFIG_PATH, help="coordinator.toml"
    )
    rebuild.add_argument(
        "--from",
        dest="source",
        required=True,
        help="'s3' (the [s3] section) or s3://bucket/prefix/ (with that section's credentials)",
    )
    rebuild.add_argument("--merge", action="store_true", help="add to a catalog that has backups")
    rebuild.add_argument(
        "--key-file",
        default="",
        metavar="PATH",
        help="an encrypted mirror ([s3.encryption]): the age secret key file of one of its"
        " recipients (or `kms KEY [credentials]` lines), or credential:NAME for a systemd"
        " credential; refused without it",
    )
    return parser


# -- serve -----------------------------------------------------------------------------------------


def _check_listen(config: CoordinatorConfig, source: str) -> None:
    problem = loopback_problem(config.coordinator.listen)
    if problem is not None:
        raise ConfigError(source, "coordinator.listen", problem)


@contextlib.contextmanager
def _metrics(config: CoordinatorConfig, registry: Any) -> Iterator[MetricsServer | None]:
    listen = config.coordinator.metrics_listen
    if not listen:
        yield None
        return
    server = MetricsServer(registry, listen)
    try:
        server.start()
    except OSError as exc:
        raise RingsnapError(f"cannot serve metrics on {listen}: {exc.strerror or exc}") from None
    try:
        yield server
    finally:
        server.close()


async def serve(config: CoordinatorConfig, source: str) -> None:
    _check_listen(config, source)
    notifier = sdnotify.Notifier.from_environment()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    listen = config.coordinator.listen
    log.info("coordinator starting", config=source, listen=listen)
    async with open_coordinator(config, source=source) as coordinator:
        with (
            _metrics(config, coordinator.metrics.registry) as metrics,
            running_time_canaries(config),
        ):
            token_file = token_path(config.coordinator.catalog)
            token = write_token(token_file)
            remote = RemoteListener.from_config(config.remote) if config.remote else None
            server = CoordinatorServer(coordinator, listen, token, str(token_file), remote)
            watchdog: asyncio.Task[None] | None = None
            try:
                port = await server.start()
                metrics_at = f"{metrics.host}:{metrics.port}" if metrics is not None else "off"
                notifier.ready(f"API on {listen} (port {port}); metrics {metrics_at}")
                log.info(
                    "coordinator ready",
                    api=listen,
                    port=port,
                    metrics=metrics_at,
                    clusters=sorted(coordinator.clusters),
                    access_file=str(token_file),  # "token" in a key would be redacted
                )
                watchdog = sdnotify.start_keep_alive(notifier)
                await stop.wait()
                log.info("stopping: cancelling running backups; their nodes are thawed")
                notifier.stopping("cancelling running backups and thawing their nodes")
                await server.enter_shutdown()
                await coordinator.stop()
                await server.stop(SHUTDOWN_GRACE_SECONDS)
            finally:
                if watchdog is not None:
                    watchdog.cancel()
                await server.stop(0)
                remove_token(token_file, token)
    log.info("coordinator stopped")


# -- check-config ----------------------------------------------------------------------------------


def _redact(value: Any) -> Any:
    """Defence in depth over `redacted`: driver tables are free-form."""
    if isinstance(value, dict):
        return {
            key: "**********"
            if any(m in key.lower() for m in _SECRET_MARKERS) and not key.endswith("_file")
            else _redact(item)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [_redact(item) for item in value]
    return value


def check_config(path: Path) -> int:
    config = load_config(path)
    _check_listen(config, str(path))
    for name, section in config.arrays.items():
        if section.driver == NODE_LOCAL_DRIVER:
            node_local_agent(config, name, str(path))
            continue
        driver = open_driver(name, section.table(), str(path))  # validates; contacts nothing
        driver.close()
    tls = config.tls
    report = certs.inspect(
        tls.cert_file.read_bytes(),
        tls.key_file.get_secret_value().encode(),
        tls.ca_file.read_bytes(),
        issuer_required=False,  # ca_file checks the agents; agents check this certificate
    )
    if report.errors:
        raise ConfigError(str(path), "tls.cert_file", "; ".join(report.errors))
    for warning in report.warnings:
        print(f"{path}: tls.cert_file {tls.cert_file}: {warning}", file=sys.stderr)
    print(json.dumps(_redact(redacted(config)), indent=2, sort_keys=True))
    nodes = sum(len(c.nodes) for c in config.clusters)
    print(
        f"{path}: valid ({len(config.clusters)} clusters, {nodes} nodes, {len(config.arrays)}"
        f" arrays, {len(config.schedules)} schedules, {len(config.retention)} retention policies)",
        file=sys.stderr,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    arguments = _parser().parse_args(argv)
    try:
        if arguments.command == "check-config":
            logs.configure(json=False, level="warning")
            return check_config(arguments.config)
        if arguments.command == "catalog":
            from ringsnap.coordinator.export.rebuild_cli import rebuild_command

            logs.configure(json=False, level="warning")
            return rebuild_command(
                arguments.config,
                arguments.source,
                merge=arguments.merge,
                key_file=arguments.key_file,
            )
        logs.configure(json=arguments.log_format == "json", level=arguments.log_level)
        config = load_config(arguments.config)
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve(config, str(arguments.config)))
        return 0
    except RingsnapError as exc:
        log.error("coordinator failed", error=str(exc), error_type=type(exc).__name__)
        print(f"ringsnap-coordinator: {exc}", file=sys.stderr)
        return exc.exit_code
    except Exception as exc:
        # The traceback goes to the journal, for a bug report; the operator reads the last line.
        log.exception("coordinator crashed")
        print(f"ringsnap-coordinator: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
