"""The RPCs the agent's servicer hands whole to a component (`ringsnap.agent.rpc_delegation`),
through a real gRPC server on loopback: the component's answer comes back, its refusals end the call
with their mapped status, a stream's messages arrive in order, and a caller that goes away closes
the component's stream (that is what stops a download or an export)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar, cast

import grpc
import grpc.aio
import pytest

from ringsnap.agent import errors
from ringsnap.agent.node import NodeAgent
from ringsnap.agent.s3.download import DownloadRefused
from ringsnap.agent.server import AgentServicer
from ringsnap.api.v1 import agent_pb2, agent_pb2_grpc

T = TypeVar("T")


class _TableImports:
    """A `TableImportRpcs` that answers GetStagingSpace with what it is given."""

    def __init__(self, answer: agent_pb2.StagingSpace | Exception) -> None:
        self.answer = answer
        self.requests: list[agent_pb2.GetStagingSpaceRequest] = []

    async def get_staging_space(
        self, request: agent_pb2.GetStagingSpaceRequest
    ) -> agent_pb2.StagingSpace:
        self.requests.append(request)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


class _S3Restores:
    """An `S3RestoreRpcs` whose download streams `results`, then raises `error` or waits for ever."""

    def __init__(self, results: int, error: Exception | None = None, *, hang: bool = False) -> None:
        self.results = results
        self.error = error
        self.hang = hang
        self.closed = asyncio.Event()

    async def download(
        self, request: agent_pb2.DownloadFromS3Request
    ) -> AsyncGenerator[agent_pb2.DownloadFromS3Response, None]:
        try:
            for done in range(1, self.results + 1):
                yield agent_pb2.DownloadFromS3Response(
                    progress=agent_pb2.S3DownloadProgress(files_done=done)
                )
            if self.error is not None:
                raise self.error
            if self.hang:
                await asyncio.Event().wait()
        finally:
            self.closed.set()


@asynccontextmanager
async def _serving(
    setup: Callable[[AgentServicer], None],
) -> AsyncIterator[agent_pb2_grpc.AgentServiceAsyncStub]:
    servicer = AgentServicer(cast(NodeAgent, object()))
    setup(servicer)
    server = grpc.aio.server()
    agent_pb2_grpc.add_AgentServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield agent_pb2_grpc.AgentServiceStub(channel)
    finally:
        await server.stop(0)


def _run(coroutine: Awaitable[T]) -> T:
    async def main() -> T:
        return await coroutine

    return asyncio.run(main())


def _use(**components: Any) -> Callable[[AgentServicer], None]:
    def setup(servicer: AgentServicer) -> None:
        for name, component in components.items():
            setattr(servicer, name, component)

    return setup


def test_a_delegated_call_answers_with_the_components_response() -> None:
    imports = _TableImports(agent_pb2.StagingSpace(free_bytes=123))

    async def call() -> agent_pb2.StagingSpace:
        async with _serving(_use(_table_imports=imports)) as stub:
            request = agent_pb2.GetStagingSpaceRequest(run_id="tr-1")
            return await stub.GetStagingSpace(request, timeout=10)

    answer = _run(call())
    assert answer.free_bytes == 123
    assert [r.run_id for r in imports.requests] == ["tr-1"]


def test_a_components_refusal_ends_the_delegated_call_with_its_status_and_words() -> None:
    imports = _TableImports(errors.Conflict("the staging is busy"))

    async def call() -> grpc.aio.AioRpcError:
        async with _serving(_use(_table_imports=imports)) as stub:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.GetStagingSpace(agent_pb2.GetStagingSpaceRequest(), timeout=10)
            return caught.value

    refused = _run(call())
    assert refused.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert refused.details() == "the staging is busy"


def test_an_unforeseen_error_of_a_component_is_internal_and_names_no_detail() -> None:
    imports = _TableImports(KeyError("secret detail"))

    async def call() -> grpc.aio.AioRpcError:
        async with _serving(_use(_table_imports=imports)) as stub:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.GetStagingSpace(agent_pb2.GetStagingSpaceRequest(), timeout=10)
            return caught.value

    failed = _run(call())
    assert failed.code() is grpc.StatusCode.INTERNAL
    assert "secret detail" not in (failed.details() or "")


def test_a_delegated_stream_delivers_every_message_then_the_components_error_status() -> None:
    restores = _S3Restores(2, DownloadRefused("node1: nb-1-big-Data.db: CRC32 differs"))

    async def call() -> tuple[list[int], grpc.aio.AioRpcError]:
        async with _serving(_use(_s3_restores=restores)) as stub:
            received: list[int] = []
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                async for message in stub.DownloadFromS3(
                    agent_pb2.DownloadFromS3Request(run_id="rr-1"), timeout=10
                ):
                    received.append(message.progress.files_done)
            return received, caught.value

    received, refused = _run(call())
    assert received == [1, 2]
    assert refused.code() is grpc.StatusCode.DATA_LOSS
    assert "CRC32 differs" in (refused.details() or "")


def test_a_caller_that_goes_away_closes_the_components_stream() -> None:
    restores = _S3Restores(1, hang=True)

    async def call() -> bool:
        async with _serving(_use(_s3_restores=restores)) as stub:
            stream = stub.DownloadFromS3(agent_pb2.DownloadFromS3Request(run_id="rr-1"))
            first = await stream.read()
            assert isinstance(first, agent_pb2.DownloadFromS3Response)
            assert not restores.closed.is_set()
            stream.cancel()
            # Bounded only so that a regression fails instead of hanging the suite.
            await asyncio.wait_for(restores.closed.wait(), timeout=30)
            return restores.closed.is_set()

    assert _run(call())
