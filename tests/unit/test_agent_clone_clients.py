"""The coordinator's clients that mount clones on an agent (the drill host's, a table restore's,
an export's) send one and the same MountClones request, and every drill-host call's gRPC error
becomes an `AgentError` naming the drill host, the address, the RPC and the status. The agent is
the real servicer behind mutual TLS; only its clone mounter and drill host are fakes."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import grpc.aio
import pytest

from ringsnap.agent import errors as agent_errors
from ringsnap.agent.clones import CloneMounter, CloneVolume, MountedClone
from ringsnap.agent.drill.host import DrillHost
from ringsnap.agent.node import NodeAgent
from ringsnap.agent.server import AgentServicer
from ringsnap.agent.tls import server_credentials
from ringsnap.api.v1 import agent_pb2_grpc
from ringsnap.coordinator.agents.connection import ClientTls
from ringsnap.coordinator.agents.drill import GrpcDrillHost
from ringsnap.coordinator.agents.export import GrpcExportNode
from ringsnap.coordinator.agents.table_restore import GrpcTableNode
from ringsnap.coordinator.clone_mounts import CloneToMount
from ringsnap.coordinator.drill.ports import DrillSpec
from ringsnap.coordinator.ports import AgentError
from ringsnap.plugins.testing.pki import TestCA

REFUSAL = "the clone's serial is attached elsewhere"


class _Clones:
    """The agent's clone mounter: records what it was asked; refuses purpose "refused"."""

    def __init__(self) -> None:
        self.mounted: list[tuple[str, list[CloneVolume], bool]] = []
        self.unmounted: list[str] = []

    async def mount(
        self, purpose_id: str, volumes: Sequence[CloneVolume], *, read_only: bool
    ) -> list[MountedClone]:
        if purpose_id == "refused":
            raise agent_errors.Conflict(REFUSAL)
        self.mounted.append((purpose_id, list(volumes), read_only))
        return [
            MountedClone(
                v.role,
                v.array,
                v.volume,
                v.serial,
                v.wwn,
                v.source_mount_point,
                f"/clones/{purpose_id}/{v.role}",
                device=f"/dev/{v.volume}",
            )
            for v in volumes
        ]

    async def unmount(self, purpose_id: str) -> list[str]:
        if purpose_id == "refused":
            raise agent_errors.Conflict(REFUSAL)
        self.unmounted.append(purpose_id)
        return [f"{purpose_id}-data"]


class _Drills:
    """The agent's drill host: every call refuses (the client's error mapping is under test)."""

    async def start_drill(self, request: Any) -> Any:
        raise agent_errors.Conflict(REFUSAL)

    def get(self, drill_id: str) -> Any:
        raise agent_errors.NotFound(f"no drill {drill_id}")

    def manifest(self, drill_id: str) -> Any:
        raise agent_errors.NotFound(f"no drill {drill_id}")

    async def stop(self, drill_id: str) -> Any:
        raise agent_errors.NotFound(f"no drill {drill_id}")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@asynccontextmanager
async def _agent(tmp: Path, clones: _Clones) -> AsyncIterator[tuple[str, ClientTls]]:
    """A real agent servicer on 127.0.0.1 behind mutual TLS; yields its address and the
    coordinator's client TLS."""
    ca = TestCA.create()
    agent_cert = ca.issue("agent-n1", ips=["127.0.0.1"])
    client = ca.issue("ringsnap-coordinator").write(tmp, "coordinator")
    tls = ClientTls.from_files(client.cert, client.key, ca.write_ca(tmp / "ca.crt"))
    servicer = AgentServicer(
        cast(NodeAgent, object()), cast(CloneMounter, clones), cast(DrillHost, _Drills())
    )
    server = grpc.aio.server()
    agent_pb2_grpc.add_AgentServiceServicer_to_server(servicer, server)
    address = f"127.0.0.1:{_free_port()}"
    server.add_secure_port(
        address, server_credentials(agent_cert.cert_pem, agent_cert.key_pem, ca.cert_pem)
    )
    await server.start()
    try:
        yield address, tls
    finally:
        await server.stop(0)


WANTED = [
    ("data", "array-a", "clone_n1_data", "600a0980", "naa.600a0980", "/var/lib/cassandra/data"),
    ("commitlog", "array-a", "clone_n1_cl", "600a0981", "", "/var/lib/cassandra/commitlog"),
]


def test_the_three_clients_send_the_same_mount_clones_request(tmp_path: Path) -> None:
    clones = _Clones()

    async def scenario() -> list[Any]:
        async with _agent(tmp_path, clones) as (address, tls):
            host = GrpcDrillHost(address, tls)
            table = GrpcTableNode("n1", address, tls)
            export = GrpcExportNode("n1", address, tls)
            try:
                return [
                    await host.mount_clones(
                        "dr-1", [CloneToMount(*w) for w in WANTED], read_only=False
                    ),
                    await table.mount_clones(
                        "tr-1", [CloneToMount(*w) for w in WANTED], read_only=True
                    ),
                    await export.mount_clones(
                        "ex-1", [CloneToMount(*w) for w in WANTED], read_only=True
                    ),
                    await host.unmount_clones("dr-1"),
                    await table.unmount_clones("tr-1"),
                ]
            finally:
                for client in (host, table, export):
                    await client.close()

    answers = asyncio.run(scenario())
    expected = [CloneVolume(*w) for w in WANTED]
    assert clones.mounted == [
        ("dr-1", expected, False),
        ("tr-1", expected, True),
        ("ex-1", expected, True),
    ]
    for mounted in answers[:3]:
        assert [(m.role, m.volume, m.device, m.source_mount_point) for m in mounted] == [
            (w[0], w[2], f"/dev/{w[2]}", w[5]) for w in WANTED
        ]
    assert [m.mount_point for m in answers[0]] == ["/clones/dr-1/data", "/clones/dr-1/commitlog"]
    assert list(answers[3]) == ["dr-1-data"] and list(answers[4]) == ["tr-1-data"]
    assert clones.unmounted == ["dr-1", "tr-1"]


SPEC = DrillSpec(
    purpose_id="refused",
    node="n1",
    cluster_name="prod",
    address="10.0.0.1",
    host_id="h1",
    data_directories=("/var/lib/cassandra/data",),
    commitlog_directory="/var/lib/cassandra/commitlog",
    canary_keyspace="ringsnap",
    canary_key="k",
    backup_id="rs-20261101-120000-abcd",
    deadline_seconds=60.0,
)

DRILL_HOST_CALLS: list[tuple[str, str, Callable[[GrpcDrillHost], Awaitable[Any]]]] = [
    ("MountClones", "FAILED_PRECONDITION", lambda h: h.mount_clones("refused", [], read_only=True)),
    ("UnmountClones", "FAILED_PRECONDITION", lambda h: h.unmount_clones("refused")),
    ("StartDrill", "FAILED_PRECONDITION", lambda h: h.start_drill(SPEC)),
    ("GetDrill", "NOT_FOUND", lambda h: h.get_drill("dr-9")),
    ("GetDrillManifest", "NOT_FOUND", lambda h: h.drill_manifest("dr-9")),
    ("StopDrill", "NOT_FOUND", lambda h: h.stop_drill("dr-9")),
]


@pytest.mark.parametrize(
    ("rpc", "code", "call"), DRILL_HOST_CALLS, ids=[c[0] for c in DRILL_HOST_CALLS]
)
def test_a_drill_host_error_names_the_drill_host_the_rpc_and_the_status(
    tmp_path: Path, rpc: str, code: str, call: Callable[[GrpcDrillHost], Awaitable[Any]]
) -> None:
    async def scenario() -> tuple[str, AgentError]:
        async with _agent(tmp_path, _Clones()) as (address, tls):
            host = GrpcDrillHost(address, tls, call_timeout=5)
            try:
                with pytest.raises(AgentError) as caught:
                    await call(host)
                return address, caught.value
            finally:
                await host.close()

    address, error = asyncio.run(scenario())
    assert error.code == code
    assert str(error).startswith(f"drill host ({address}): {rpc}: {code}: ")
