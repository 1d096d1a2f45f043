"""Calling a test coordinator's gRPC API: a refusal's reason, an expected error, an operation
watched to its end."""

from __future__ import annotations

from typing import Any, Protocol

import grpc
import pytest
from google.rpc import error_details_pb2  # type: ignore[import-untyped]
from grpc_status import rpc_status

from ringsnap.api.v1 import coordinator_pb2 as pb
from ringsnap.api.v1 import coordinator_pb2_grpc, types_pb2
from ringsnap.coordinator.api.errors import ERROR_DOMAIN


class Served(Protocol):
    """A test coordinator behind a gRPC server (the coordinator_api harness)."""

    def stub(self) -> coordinator_pb2_grpc.CoordinatorServiceStub: ...


def reason_of(error: grpc.RpcError) -> str:
    status = rpc_status.from_call(error)
    assert status is not None, "every refusal carries a google.rpc.Status"
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            assert info.domain == ERROR_DOMAIN
            return str(info.reason)
    raise AssertionError("no ErrorInfo in the status")


def rpc_error(call: Any, request: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call(request, timeout=10)
    return caught.value


def watch_to_end(served: Served, operation_id: str) -> list[types_pb2.Operation]:
    stream = served.stub().WatchOperation(
        pb.WatchOperationRequest(operation_id=operation_id), timeout=30
    )
    return list(stream)


def pb_stub(channel: grpc.Channel) -> Any:
    return coordinator_pb2_grpc.CoordinatorServiceStub(channel)
