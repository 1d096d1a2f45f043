"""Faults of the bucket for the point-in-time ring test: the test's S3Proxy made unreachable
(its container frozen with `docker pause`: connections are still accepted by the kernel and requests
wait in its buffers unanswered, as behind a black-holed port), and how many bytes one process has
in flight towards it (read from the kernel's socket queues with `ss`), to kill an agent while it is
uploading a commit-log piece rather than between two requests."""

from __future__ import annotations

import contextlib
import subprocess
import urllib.request
from collections.abc import Iterator

from ringsnap.sandbox.s3proxy import S3Server


def s3proxy_container(server: S3Server) -> object:
    """The container of `server` (others may run beside it: each has its own directory)."""
    import docker

    root = str(server.data_dir.parent)
    client = docker.from_env()
    for container in client.containers.list(filters={"label": "ringsnap.role=s3proxy"}):
        if any(root in str(arg) for arg in container.attrs.get("Args", ())):
            return container
    raise AssertionError(f"no running S3Proxy container serves {root}")


class Outage:
    """S3Proxy frozen (`begin`) and thawed (`end`); a block thaws it whatever happens inside."""

    def __init__(self, server: S3Server) -> None:
        self._container = s3proxy_container(server)
        self.paused = False

    def begin(self) -> None:
        self._container.pause()  # type: ignore[attr-defined]
        self.paused = True

    def end(self) -> None:
        if self.paused:
            self._container.unpause()  # type: ignore[attr-defined]
            self.paused = False

    @contextlib.contextmanager
    def thawed_at_exit(self) -> Iterator[Outage]:
        try:
            yield self
        finally:
            self.end()


def _port_of(address: str) -> int:
    try:
        return int(address.rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return -1


def bytes_in_flight(pid: int, server: S3Server) -> int:
    """Bytes `pid` sent to the server and not yet read by it: the process's own send queues plus
    the server's receive queues of the same connections."""
    port = _port_of(server.endpoint_url)
    lines = subprocess.run(
        ["ss", "-tnpH"], check=True, capture_output=True, text=True
    ).stdout.splitlines()
    client_ports: set[int] = set()
    total = 0
    rows = [line.split() for line in lines]
    for row in rows:
        if len(row) >= 6 and _port_of(row[4]) == port and f"pid={pid}," in row[5]:
            client_ports.add(_port_of(row[3]))
            total += int(row[2])
    for row in rows:
        if len(row) >= 5 and _port_of(row[3]) == port and _port_of(row[4]) in client_ports:
            total += int(row[1])
    return total


def scrape(address: str, metric: str) -> float:
    """One sample of `metric` (no labels) from a Prometheus endpoint."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    for line in text.splitlines():
        if line.startswith(f"{metric} "):
            return float(line.split()[1])
    raise AssertionError(f"{metric} not served at {address}")
