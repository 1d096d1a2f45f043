"""An agent's answer through the coordinator's API: a refusal (FAILED_PRECONDITION), a bad argument
and something not found pass through with the node named; an agent nobody answers for is
UNAVAILABLE (AGENT_FAILED). The agent is a real servicer behind mutual TLS, its client the real
`GrpcNodeAgent`."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any, cast

import grpc
import grpc.aio
import pytest

from ringsnap.agent import errors as agent_errors
from ringsnap.agent.node import NodeAgent
from ringsnap.agent.server import AgentServicer
from ringsnap.agent.tls import server_credentials
from ringsnap.api.v1 import agent_pb2_grpc
from ringsnap.api.v1 import coordinator_pb2 as pb
from ringsnap.coordinator.agents.connection import ClientTls, GrpcNodeAgent
from ringsnap.coordinator.api.errors import classify
from ringsnap.coordinator.cli.client import REASON_EXIT_CODES, ExitCode
from ringsnap.coordinator.ports import AgentError
from ringsnap.coordinator.restore.plan import RestoreRequest
from ringsnap.errors import ValidationError
from ringsnap.plugins.testing.pki import TestCA
from tests.support.coordinator_rpc import pb_stub, reason_of, rpc_error

from .conftest import Harness


class _Node:
    """The agent's domain side: StopCassandra answers with the error it is given."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def stop_cassandra(self, *, drain: bool) -> Any:
        raise self.error


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _agent_error(tmp: Path, error: Exception | None) -> AgentError:
    """What GrpcNodeAgent raises for node n1 when its agent answers StopCassandra with `error`
    (None: no agent listens at the address)."""
    ca = TestCA.create()
    agent_cert = ca.issue("agent-n1", ips=["127.0.0.1"])
    client = ca.issue("ringsnap-coordinator").write(tmp, "coordinator")
    ca_file = ca.write_ca(tmp / "ca.crt")
    tls = ClientTls.from_files(client.cert, client.key, ca_file)

    async def call() -> AgentError:
        server = grpc.aio.server()
        address = f"127.0.0.1:{_free_port()}"
        if error is not None:
            servicer = AgentServicer(cast(NodeAgent, _Node(error)))
            agent_pb2_grpc.add_AgentServiceServicer_to_server(servicer, server)
            credentials = server_credentials(agent_cert.cert_pem, agent_cert.key_pem, ca.cert_pem)
            server.add_secure_port(address, credentials)
            await server.start()
        agent = GrpcNodeAgent("n1", address, tls, call_timeout=5)
        try:
            with pytest.raises(AgentError) as caught:
                await agent.stop_cassandra(drain=True)
            return caught.value
        finally:
            await agent.close()
            await server.stop(0)

    return asyncio.run(call())


@pytest.mark.parametrize(
    ("error", "code", "reason", "exit_code"),
    [
        (
            agent_errors.Conflict("Cassandra holds /data open"),
            grpc.StatusCode.FAILED_PRECONDITION,
            "AGENT_REFUSED",
            ExitCode.REFUSED,
        ),
        (
            ValidationError("operation id 'x y' is not valid"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "AGENT_INVALID_ARGUMENT",
            ExitCode.USAGE,
        ),
        (
            agent_errors.NotFound("no snapshot rs-1"),
            grpc.StatusCode.NOT_FOUND,
            "AGENT_NOT_FOUND",
            ExitCode.NOT_FOUND,
        ),
        (
            agent_errors.CommandFailed("the stop command exited 1"),
            grpc.StatusCode.UNAVAILABLE,
            "AGENT_FAILED",
            ExitCode.FAILED,
        ),
        (None, grpc.StatusCode.UNAVAILABLE, "AGENT_FAILED", ExitCode.FAILED),
    ],
)
def test_an_agents_answer_reaches_the_api_with_its_status_and_the_node_named(
    harness: Harness,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    error: Exception | None,
    code: grpc.StatusCode,
    reason: str,
    exit_code: ExitCode,
) -> None:
    failed = _agent_error(tmp_path, error)
    assert failed.code == (code.name if error is not None else "UNAVAILABLE")
    assert classify(failed) == (code, reason)
    assert REASON_EXIT_CODES[reason] is exit_code

    async def plan_restore(request: RestoreRequest) -> Any:
        raise failed

    monkeypatch.setattr(harness.coordinator.restores, "plan_restore", plan_restore)
    answer = rpc_error(
        pb_stub(harness.channel()).PlanRestore,
        pb.PlanRestoreRequest(backup_id="rs-20261101-120000-abcd"),
    )
    assert answer.code() == code
    assert reason_of(answer) == reason
    details = answer.details() or ""
    assert details.startswith("node n1 (127.0.0.1:") and "StopCassandra" in details
    if error is not None:
        assert str(error) in details
