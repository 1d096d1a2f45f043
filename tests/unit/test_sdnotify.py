"""sd_notify over a real Unix datagram socket, the way systemd listens for it (both daemons)."""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ringsnap.sdnotify import Notifier, start_keep_alive, watchdog_interval


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(5)
    yield sock, path
    sock.close()


def test_ready_watchdog_stopping_arrive_as_datagrams(listener: tuple[socket.socket, str]) -> None:
    sock, path = listener
    notifier = Notifier.from_environment({"NOTIFY_SOCKET": path})
    assert notifier.ready("serving on 0.0.0.0:7443")
    assert sock.recv(4096) == b"READY=1\nSTATUS=serving on 0.0.0.0:7443"
    assert notifier.watchdog()
    assert sock.recv(4096) == b"WATCHDOG=1"
    assert notifier.stopping()
    assert sock.recv(4096) == b"STOPPING=1"


def test_abstract_socket_address() -> None:
    name = f"ringsnap-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(5)
        assert Notifier(f"@{name}").ready()
        assert sock.recv(4096) == b"READY=1"


def test_without_systemd_nothing_is_sent() -> None:
    notifier = Notifier.from_environment({})
    assert not notifier.ready() and not notifier.watchdog() and not notifier.stopping()


def test_watchdog_interval_is_half_of_watchdog_usec() -> None:
    assert watchdog_interval({"WATCHDOG_USEC": "20000000"}) == 10.0
    assert (
        watchdog_interval({"WATCHDOG_USEC": "20000000", "WATCHDOG_PID": str(os.getpid())}) == 10.0
    )
    assert watchdog_interval({"WATCHDOG_USEC": "20000000", "WATCHDOG_PID": "1"}, pid=2) is None
    assert watchdog_interval({}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "0"}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "junk"}) is None


def test_keep_alive_pings_until_cancelled(listener: tuple[socket.socket, str]) -> None:
    sock, path = listener
    notifier = Notifier(path)

    async def main() -> None:
        watchdog = start_keep_alive(notifier, {"WATCHDOG_USEC": "20000"})  # every 10 ms
        assert watchdog is not None
        await asyncio.sleep(0.1)
        watchdog.cancel()
        assert start_keep_alive(notifier, {}) is None, "no watchdog, no task"

    asyncio.run(main())
    pings = [sock.recv(4096) for _ in range(3)]
    assert pings == [b"WATCHDOG=1"] * 3
