"""A call the coordinator took but did not answer in time is not "cannot reach the coordinator":
the CLI says it may still be running there (a purge, a backup) and points at `ringsnap status`,
so that the operator does not simply ask again. Against a real gRPC server that answers late."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from ringsnap.api.v1 import coordinator_pb2 as pb
from ringsnap.coordinator.cli.client import CliError, Coordinator, ExitCode, Target


@pytest.fixture
def slow_server() -> Iterator[str]:
    release = threading.Event()

    def late(request: bytes, context: grpc.ServicerContext) -> bytes:
        release.wait(10)
        return b""

    class Late(grpc.GenericRpcHandler):
        def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[Any, Any]:
            return grpc.unary_unary_rpc_method_handler(late)

    server = grpc.server(futures.ThreadPoolExecutor(2), handlers=[Late()])
    port = server.add_secure_port(
        "127.0.0.1:0", grpc.local_server_credentials(grpc.LocalConnectionType.LOCAL_TCP)
    )
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        release.set()
        server.stop(None)


def test_a_late_answer_says_the_call_may_still_run_there(slow_server: str, tmp_path: Path) -> None:
    token = tmp_path / "api-token"
    token.write_text("a-token-of-the-test\n")
    target = Target(address=slow_server, token_file=token, source="--coordinator")

    with Coordinator(target) as client, pytest.raises(CliError) as raised:
        client.call(client.stub.PurgeExports, pb.PurgeExportsRequest(cluster="prod"), 0.5)

    error = raised.value
    assert error.exit_code == ExitCode.UNREACHABLE
    assert f"the coordinator at {slow_server} did not answer within 0.5 s" in str(error)
    assert "may still be running there" in str(error)
    assert "cannot reach" not in str(error)
    assert "ringsnap status" in error.hint
