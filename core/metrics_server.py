"""The HTTP exposition of one Prometheus registry on a local address, in a daemon thread: the
coordinator's (`metrics_listen`) and the agent's (`[metrics] listen`)."""

from __future__ import annotations

import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server


def _split(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host.strip("[]"), int(port)


class MetricsServer:
    """The HTTP exposition (`/metrics`, any path) of one registry, in a daemon thread."""

    def __init__(self, registry: CollectorRegistry, listen: str) -> None:
        self._registry = registry
        self._host, self._port = _split(listen)
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("metrics server already started")
        self._server, self._thread = start_http_server(
            self._port, addr=self._host, registry=self._registry
        )

    @property
    def port(self) -> int:
        """The bound port (the one picked by the kernel when configured as 0)."""
        if self._server is None:
            raise RuntimeError("metrics server not started")
        return int(self._server.server_address[1])

    @property
    def host(self) -> str:
        return self._host

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> MetricsServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
