"""Regression: bytes that are not a valid request message are refused with INVALID_ARGUMENT naming
the message type (grpc.aio alone answers UNKNOWN "Unexpected DecodeError"), by the real agent
server behind mTLS, for a unary and a streaming RPC; the agent serves on."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from ringsnap.api.v1 import agent_pb2
from tests.fuzz.agent_rig import AgentRig, running_agent
from tests.fuzz.protofuzz import call, rpcs

RPCS = {rpc.name: rpc for rpc in rpcs(agent_pb2.DESCRIPTOR.services_by_name["AgentService"])}


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentRig]:
    with running_agent(tmp_path_factory.mktemp("malformed")) as running:
        yield running


@pytest.mark.parametrize(
    ("name", "message"),
    [("FreezeFilesystems", "FreezeFilesystemsRequest"), ("GetManifest", "GetManifestRequest")],
)
def test_bytes_that_are_no_request_are_invalid_argument(
    rig: AgentRig, name: str, message: str
) -> None:
    answer = call(rig.channel, RPCS[name], b"\x0a\xff\xff\xff\xff\x0f", timeout=10)
    assert answer.code is grpc.StatusCode.INVALID_ARGUMENT
    assert answer.details.startswith(f"the request is not a valid {message} message")
    assert rig.recorder.take() == ([], [])
    assert rig.healthy()
