"""sd_notify(3) without libsystemd: datagrams to $NOTIFY_SOCKET (READY=1, WATCHDOG=1, STOPPING=1),
and the watchdog pings of both daemons (Type=notify, WatchdogSec=).

    notifier = Notifier.from_environment()
    notifier.ready("serving on ...")
    watchdog = start_keep_alive(notifier)      # None when systemd set no watchdog
    ...
    notifier.stopping("...")
    if watchdog is not None:
        watchdog.cancel()
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Mapping


class Notifier:
    """Sends state changes to systemd; does nothing when not started by systemd with Type=notify."""

    def __init__(self, address: str | None) -> None:
        if address and address.startswith("@"):
            address = "\0" + address[1:]  # abstract socket namespace
        self.address = address or None

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> Notifier:
        return cls(environ.get("NOTIFY_SOCKET"))

    def send(self, *assignments: str) -> bool:
        if self.address is None:
            return False
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(self.address)
            sock.sendall("\n".join(assignments).encode())
        return True

    def ready(self, status: str = "") -> bool:
        return self.send("READY=1", *([f"STATUS={status}"] if status else []))

    def watchdog(self) -> bool:
        return self.send("WATCHDOG=1")

    def stopping(self, status: str = "") -> bool:
        return self.send("STOPPING=1", *([f"STATUS={status}"] if status else []))


def watchdog_interval(
    environ: Mapping[str, str] = os.environ, pid: int | None = None
) -> float | None:
    """Seconds between WATCHDOG=1 pings (half of WATCHDOG_USEC), or None when there is no watchdog
    for this process."""
    usec = environ.get("WATCHDOG_USEC", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    owner = environ.get("WATCHDOG_PID", "")
    if owner and owner != str(os.getpid() if pid is None else pid):
        return None
    return int(usec) / 2 / 1_000_000


async def keep_alive(notifier: Notifier, interval: float) -> None:
    """WATCHDOG=1 every `interval` seconds, until cancelled.

    The pings come from the event loop that does the daemon's work (the agent's lease watchdogs,
    the coordinator's backups): if that loop stalls, systemd kills the daemon. A killed agent's
    ExecStopPost= thaws; a killed coordinator is restarted, and the agents' leases thaw whatever
    it had frozen."""
    while True:
        notifier.watchdog()
        await asyncio.sleep(interval)


def start_keep_alive(
    notifier: Notifier, environ: Mapping[str, str] = os.environ
) -> asyncio.Task[None] | None:
    """`keep_alive` as a task of the running loop, or None when this process has no watchdog."""
    interval = watchdog_interval(environ)
    if interval is None:
        return None
    return asyncio.create_task(keep_alive(notifier, interval))
