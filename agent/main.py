"""`ringsnap-agent`: serve the node agent, or thaw every filesystem a freeze record names.

    ringsnap-agent serve [--config /etc/ringsnap/agent.toml]
    ringsnap-agent thaw-all [--config FILE | --state-dir DIR]
    ringsnap-agent check [--config /etc/ringsnap/agent.toml]

Exit codes: 0 ok; 1 a thaw failed (thaw-all), the node is not ready (check) or the agent failed;
78 configuration error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import tomllib
from pathlib import Path

from ringsnap import logs, sdnotify
from ringsnap.agent import check
from ringsnap.agent.app import AgentServer
from ringsnap.agent.config import (
    DEFAULT_CONFIG_PATH,
    DEFAULT_STATE_DIRECTORY,
    AgentConfig,
    load_config,
)
from ringsnap.agent.freezestate import StateStore, thaw_all
from ringsnap.errors import ConfigError, RingsnapError

log = logs.get_logger("ringsnap.agent")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ringsnap-agent",
        description="ringsnap's per-node agent: flush, freeze under a lease, SSTable manifests, "
        "native snapshots, Cassandra stop/start; reachable only over mutual TLS.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = commands.add_parser("serve", help="run the agent (under systemd: Type=notify)")
    serve.add_argument("--config", type=Path, default=DEFAULT_CONFIG_PATH, help="agent.toml")
    thaw = commands.add_parser(
        "thaw-all",
        help="thaw every filesystem recorded as frozen (ExecStopPost=, or an operator)",
        description="Thaw every filesystem named in a freeze record under the state directory. "
        "Thawing a filesystem that is not frozen is not an error. Safe to run at any time.",
    )
    inspect = commands.add_parser(
        "check",
        help="is this node ready? config, Cassandra, freezable filesystems, TLS certificate",
        description="Validate the config, ask Cassandra who it is, list the filesystems behind "
        "the Cassandra directories and whether each may be frozen, inspect the TLS certificate. "
        "Changes nothing; safe beside a running agent.",
    )
    inspect.add_argument("--config", type=Path, default=DEFAULT_CONFIG_PATH, help="agent.toml")
    source = thaw.add_mutually_exclusive_group()
    source.add_argument("--config", type=Path, help=f"agent.toml (default {DEFAULT_CONFIG_PATH})")
    source.add_argument("--state-dir", type=Path, help="the state directory itself")
    return parser


async def serve(config: AgentConfig) -> None:
    notifier = sdnotify.Notifier.from_environment()
    server = AgentServer(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    port = await server.start()
    notifier.ready(f"serving on {config.server.listen} (port {port})")
    watchdog = sdnotify.start_keep_alive(notifier)
    try:
        await stop.wait()
    finally:
        log.info("stopping: no new requests; thawing whatever is still frozen")
        notifier.stopping("thawing and shutting down")
        if watchdog is not None:
            watchdog.cancel()
        await server.stop()


def _state_directory(arguments: argparse.Namespace) -> Path:
    """Where the freeze records are. Only `freeze.state_directory` is read from the config: thawing
    must work even when the rest of the file is broken (a missing TLS file, say) — that is exactly
    when ExecStopPost= runs it."""
    if arguments.state_dir is not None:
        return Path(arguments.state_dir)
    path = Path(arguments.config or DEFAULT_CONFIG_PATH)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        configured = data.get("freeze", {}).get("state_directory", str(DEFAULT_STATE_DIRECTORY))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, AttributeError) as exc:
        print(
            f"ringsnap-agent: cannot read {path} ({exc}); using {DEFAULT_STATE_DIRECTORY}",
            file=sys.stderr,
        )
        return DEFAULT_STATE_DIRECTORY
    if not isinstance(configured, str) or not configured.startswith("/"):
        raise ConfigError(str(path), "freeze.state_directory", "must be an absolute path")
    return Path(configured)


def thaw_all_command(arguments: argparse.Namespace) -> int:
    store = StateStore(_state_directory(arguments))
    outcomes = thaw_all(store)
    failed = [outcome for outcome in outcomes if outcome.error]
    for outcome in outcomes:
        if outcome.error:
            state = f"FAILED: {outcome.error}"
        else:
            state = "thawed" if outcome.was_frozen else "was not frozen"
        print(f"{outcome.mount_point or '-'}\t{outcome.run_id}\t{state}")
    if not outcomes:
        print(f"no freeze records under {store.directory}")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    arguments = _parser().parse_args(argv)
    try:
        if arguments.command == "thaw-all":
            logs.configure(json=False, level="info")
            return thaw_all_command(arguments)
        config = load_config(arguments.config)
        if arguments.command == "check":
            logs.configure(json=False, level="warning")
            report = asyncio.run(check.check(config))
            print(check.render(report))
            return 0 if report.ok else 1
        logs.configure(json=config.log.json_lines, level=config.log.level)
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve(config))
        return 0
    except ConfigError as exc:
        print(f"ringsnap-agent: {exc}", file=sys.stderr)
        return exc.exit_code
    except RingsnapError as exc:
        print(f"ringsnap-agent: {exc}", file=sys.stderr)
        return exc.exit_code
    except RuntimeError as exc:
        print(f"ringsnap-agent: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
