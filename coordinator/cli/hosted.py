"""The coordinator's service hosted by the `ringsnap` CLI for one command, when no daemon runs.

In an incident the daemon may be down, and a restore must still work. Rather than a second
implementation of each command for that case, the CLI hosts the daemon's own code in its process:
the `Coordinator` of `open_coordinator` (the catalog taken exclusively, as the daemon takes it, so
no daemon nor other command can start meanwhile) and the API's `CoordinatorServer` with its
servicer, on an ephemeral loopback port. The CLI then calls it with the same client, the same calls
and the same rendering as the daemon: one path per command.

What differs from the daemon, on purpose:
- not started: no recovery round, no schedules, no periodic cleanups; it runs what the command asks
  and nothing else (a run interrupted earlier is marked when the catalog opens, as always);
- the API token is made for this run and kept in memory (never written where others could read
  it); the listener takes loopback peers only, as the daemon's local listener does;
- it ends with the command: leaving the `hosted_coordinator` block (the run's end, Ctrl-C, an
  error) stops the coordinator as the daemon's stop does, so a run still going is cancelled and its
  record says where each node stands (`ringsnap restore --resume`). A process killed outright
  leaves the record RUNNING, marked interrupted at the next catalog open, resumable the same way.

The service runs in its own thread and event loop: the CLI's thread blocks in the client's calls
(and in the confirmation prompt) and receives Ctrl-C there.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import structlog

from ringsnap import logs
from ringsnap.coordinator.assembly import load_config
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.cli.client import REMOTE_ENV, Target, resolve_target
from ringsnap.coordinator.cli.local_catalog import config_path, restore_catalog
from ringsnap.coordinator.config import CoordinatorConfig

T = TypeVar("T")

#: The hosted API listens here: loopback, a port the kernel picks.
HOSTED_LISTEN = "127.0.0.1:0"
#: How long starting the hosted service (opening clients, binding the port) may take.
START_TIMEOUT_SECONDS = 60.0


class _Loop:
    """An event loop in a thread of its own, and running coroutines in it from this thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="ringsnap-hosted-coordinator", daemon=True
        )
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self.loop.close()


@contextlib.contextmanager
def _quiet_logs() -> Iterator[None]:
    """The daemon's code logs for a journal; on the operator's terminal, stdout carries the report
    (and JSON for scripts): while the command runs, only errors are logged, to stderr. A process
    that configured its logs already (a test, the sandbox) keeps its own."""
    if structlog.is_configured():
        yield
        return
    logs.configure(json=False, level="error")
    try:
        yield
    finally:
        structlog.reset_defaults()


@contextlib.contextmanager
def hosted_coordinator(
    config: CoordinatorConfig, catalog: Catalog, *, source: str
) -> Iterator[Target]:
    """The daemon's service for `config`, hosted in this process over `catalog` (opened
    exclusively by the caller, handed over: closed at the end); yields the `Target` to call it."""
    # The daemon's modules, imported when a command needs them (`ringsnap --help` stays quick).
    from ringsnap.coordinator.api.listeners import CoordinatorServer
    from ringsnap.coordinator.assembly import open_coordinator

    token = secrets.token_urlsafe(32)
    stack = contextlib.AsyncExitStack()

    async def start() -> int:
        coordinator = await stack.enter_async_context(
            open_coordinator(config, source=source, start=False, catalog=catalog)
        )
        server = CoordinatorServer(
            coordinator, HOSTED_LISTEN, token, "this process (a token made for this run)"
        )
        # Stopped before the coordinator: no call reaches a coordinator that is stopping.
        stack.push_async_callback(server.stop, 0)
        return await server.start()

    loop = _Loop()
    try:
        try:
            port = loop.run(start(), START_TIMEOUT_SECONDS)
        except BaseException:
            loop.run(stack.aclose(), START_TIMEOUT_SECONDS)
            catalog.close()
            raise
        try:
            yield Target(
                f"127.0.0.1:{port}",
                Path(),
                f"this process ({source}; no coordinator daemon answers)",
                token=token,
            )
        finally:
            # As the daemon's stop: a run still going is cancelled and records where it stands.
            loop.run(stack.aclose())
    finally:
        loop.close()


@contextlib.contextmanager
def command_coordinator(config: Path | None) -> Iterator[Target]:
    """The coordinator a restore runs in, called the same way whichever it is: from another host
    ($RINGSNAP_REMOTE, no --config) the remote one over mutual TLS; else the daemon holding the
    config's catalog; else (the catalog free: no daemon runs) the daemon's service hosted here for
    this command. Refused (CliError, CATALOG_LOCKED) when another process that is not an answering
    daemon holds the catalog."""
    if config is None and os.environ.get(REMOTE_ENV):
        yield resolve_target(None, None)
        return
    with _quiet_logs():  # from the catalog's opening on (it logs its migrations)
        config_file = config_path(config)
        loaded = load_config(config_file)
        opened = restore_catalog(loaded, config_file)
        if isinstance(opened, Target):
            yield opened
            return
        with hosted_coordinator(loaded, opened, source=str(config_file)) as target:
            yield target
