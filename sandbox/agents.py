"""An agent in a background thread, its configuration, and mTLS channels to it — for tests.

    pki = TestPki.create(tmp_path / "pki")                   # CA, agent cert, coordinator cert
    config = agent_config(pki, data_directories=[...], commitlog_directory=...,
                          state_directory=tmp_path / "state", nodetool=[...])
    with BackgroundAgent(config) as agent:                   # serving on 127.0.0.1:<port>
        channel = pki.channel(agent.address)                 # as "ringsnap-coordinator"
                                                             # (pki.aio_channel for grpc.aio)
        stub = agent_pb2_grpc.AgentServiceStub(channel)

`write_config(path, ...)` writes the same settings as TOML for an agent run as a process
(`ringsnap-agent serve --config path`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import grpc
import grpc.aio

from ringsnap.agent.app import AgentServer
from ringsnap.agent.config import AgentConfig
from ringsnap.config import validate
from ringsnap.plugins.lvm.runner import CommandRunner
from ringsnap.plugins.testing.pki import IssuedCert, TestCA, TlsPaths

T = TypeVar("T")
COORDINATOR_IDENTITY = "ringsnap-coordinator"


@dataclass(frozen=True)
class TestPki:
    """A CA, an agent certificate (valid for localhost and 127.0.0.1) and a client certificate."""

    __test__ = False

    directory: Path
    ca: TestCA
    ca_file: Path
    agent: TlsPaths
    client: IssuedCert

    @classmethod
    def create(cls, directory: Path, client_identity: str = COORDINATOR_IDENTITY) -> TestPki:
        ca = TestCA.create()
        ca_file = ca.write_ca(directory / "ca.crt")
        agent = ca.issue("ringsnap-agent", dns=["localhost"], ips=["127.0.0.1"]).write(
            directory, "agent"
        )
        return cls(directory, ca, ca_file, agent, ca.issue(client_identity))

    def channel(
        self, address: str, client: IssuedCert | None = None, *, ca_pem: bytes | None = None
    ) -> grpc.Channel:
        """A blocking channel presenting `client` (default: the coordinator's certificate)."""
        return secure_channel(address, ca_pem or self.ca.cert_pem, client or self.client)

    def aio_channel(self, address: str, client: IssuedCert | None = None) -> grpc.aio.Channel:
        """The same for grpc.aio callers (the coordinator)."""
        chosen = client or self.client
        credentials = grpc.ssl_channel_credentials(
            root_certificates=self.ca.cert_pem,
            private_key=chosen.key_pem,
            certificate_chain=chosen.cert_pem,
        )
        return grpc.aio.secure_channel(address, credentials)


def secure_channel(address: str, ca_pem: bytes, client: IssuedCert | None) -> grpc.Channel:
    """A blocking gRPC channel over TLS; `client=None` presents no client certificate."""
    credentials = grpc.ssl_channel_credentials(
        root_certificates=ca_pem,
        private_key=client.key_pem if client else None,
        certificate_chain=client.cert_pem if client else None,
    )
    return grpc.secure_channel(address, credentials)


def config_data(
    pki: TestPki,
    *,
    data_directories: Sequence[Path],
    commitlog_directory: Path,
    state_directory: Path,
    nodetool: Sequence[str] = ("false",),
    allowed_clients: Sequence[str] = (COORDINATOR_IDENTITY,),
    listen: str = "127.0.0.1:0",
    freeze: Mapping[str, Any] | None = None,
    cassandra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The settings of a test agent as plain data (what agent.toml would hold)."""
    return {
        "server": {"listen": listen, "allowed_clients": list(allowed_clients)},
        "tls": {
            "cert_file": str(pki.agent.cert),
            "key_file": str(pki.agent.key),
            "ca_file": str(pki.ca_file),
        },
        "cassandra": {
            "data_directories": [str(path) for path in data_directories],
            "commitlog_directory": str(commitlog_directory),
            "nodetool": list(nodetool),
            **(cassandra or {}),
        },
        "freeze": {"state_directory": str(state_directory), **(freeze or {})},
        # Restore records of this agent only (the default, /var/lib/ringsnap/agent, is per host).
        "volumes": {"state_directory": str(state_directory / "volumes")},
        "log": {"json": False, "level": "info"},
    }


def agent_config(pki: TestPki, **settings: Any) -> AgentConfig:
    """An AgentConfig for tests; keyword arguments as in `config_data`."""
    return validate(config_data(pki, **settings), AgentConfig, source="<test agent config>")


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


def write_config(path: Path, data: Mapping[str, Mapping[str, Any]]) -> Path:
    """Write `config_data(...)` as an agent.toml (tables of scalars and lists only)."""
    lines: list[str] = []
    for table, values in data.items():
        lines.append(f"[{table}]")
        lines += [f"{key} = {_toml_value(value)}" for key, value in values.items()]
        lines.append("")
    path.write_text("\n".join(lines))
    return path


class BackgroundAgent:
    """Runs an `AgentServer` on its own event loop in a daemon thread."""

    def __init__(self, config: AgentConfig, *, lvm_runner: CommandRunner | None = None) -> None:
        """`lvm_runner`: the lvm2 the agent's `[lvm]` runs (the emulator on hosts without
        device-mapper); default the real commands."""
        self.config = config
        self.server = AgentServer(config, lvm_runner=lvm_runner)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    @property
    def port(self) -> int:
        assert self.server.port is not None, "agent not started"
        return self.server.port

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def call(self, coroutine: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        """Run `coroutine` on the agent's loop (e.g. `agent.server.agent.freeze(...)`)."""
        future: Future[T] = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        return future.result(timeout)

    def start(self) -> BackgroundAgent:
        self._thread.start()
        try:
            self.call(self.server.start())
        except BaseException:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            raise
        return self

    def stop(self) -> None:
        try:
            self.call(self.server.stop(grace=1.0))
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            if not self._thread.is_alive():
                self._loop.close()

    def __enter__(self) -> BackgroundAgent:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
