"""sd_notify(3) without libsystemd: datagrams to $NOTIFY_SOCKET (READY=1, WATCHDOG=1, STOPPING=1)."""

from __future__ import annotations

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
