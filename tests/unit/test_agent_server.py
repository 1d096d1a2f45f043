"""The servicer's error table: status codes out (one table for every error). Durations: test_wire."""

from __future__ import annotations

import asyncio
import importlib
import pkgutil
from typing import cast

import grpc
import grpc.aio
import pytest

from ringsnap.agent import errors
from ringsnap.agent.node import NodeAgent, NodeInfo
from ringsnap.agent.server import STATUS_FOR_ERROR, AgentServicer, status_for
from ringsnap.api.v1 import agent_pb2, agent_pb2_grpc
from ringsnap.errors import ValidationError


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (ValidationError("x"), grpc.StatusCode.INVALID_ARGUMENT),
        (errors.NotFound("x"), grpc.StatusCode.NOT_FOUND),
        (errors.AlreadyExists("x"), grpc.StatusCode.ALREADY_EXISTS),
        (errors.Conflict("x"), grpc.StatusCode.FAILED_PRECONDITION),
        (errors.CommandTimeout("x"), grpc.StatusCode.DEADLINE_EXCEEDED),
        (errors.CommandFailed("x"), grpc.StatusCode.UNAVAILABLE),
        (errors.FreezeFailed("x"), grpc.StatusCode.INTERNAL),
        (KeyError("x"), None),
    ],
)
def test_each_domain_error_has_one_status(error: Exception, code: grpc.StatusCode | None) -> None:
    assert status_for(error) == code


def test_every_agent_error_class_is_mapped() -> None:
    # Every module of the agent imported: the check must not depend on what earlier tests loaded.
    import ringsnap.agent

    for module in pkgutil.walk_packages(ringsnap.agent.__path__, "ringsnap.agent."):
        if not module.name.endswith("__main__"):
            importlib.import_module(module.name)
    mapped = {kind for kind, _ in STATUS_FOR_ERROR}
    for kind in errors.DomainError.__subclasses__():
        assert kind in mapped, f"{kind.__name__} has no status code"


class _RefusingAgent:
    """Answers GetNodeInfo with the error it is given."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def node_info(self) -> NodeInfo:
        raise self.error


async def _call_node_info(error: Exception) -> grpc.aio.AioRpcError:
    server = grpc.aio.server()
    agent = cast(NodeAgent, _RefusingAgent(error))
    agent_pb2_grpc.add_AgentServiceServicer_to_server(AgentServicer(agent), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = agent_pb2_grpc.AgentServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.GetNodeInfo(agent_pb2.GetNodeInfoRequest(), timeout=10)
            return caught.value
    finally:
        await server.stop(0)


def test_a_refusal_ends_the_call_with_its_code_and_message_and_no_error_details() -> None:
    refused = asyncio.run(_call_node_info(errors.Conflict("Cassandra is running")))
    assert refused.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert refused.details() == "Cassandra is running"
    assert not any(key == "grpc-status-details-bin" for key, _ in refused.trailing_metadata() or ())


def test_an_unforeseen_error_is_internal_and_names_no_detail() -> None:
    failed = asyncio.run(_call_node_info(KeyError("secret path")))
    assert failed.code() is grpc.StatusCode.INTERNAL
    assert failed.details() == "internal error in the agent; see its log"
