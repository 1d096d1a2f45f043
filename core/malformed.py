"""Requests that are not valid protobuf get INVALID_ARGUMENT, for both servers.

grpc.aio answers a request its deserializer cannot parse with UNKNOWN ("Unexpected DecodeError"),
which tells a caller nothing and looks like a server fault. This interceptor parses the request
itself and refuses what does not parse, before any servicer code runs:

    grpc.aio.server(interceptors=[..., MalformedRequestInterceptor()])
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import grpc.aio
from google.protobuf.message import DecodeError

from ringsnap import logs
from ringsnap.grpcauth import Continuation, MethodHandler

log = logs.get_logger(__name__)


class _Malformed:
    """What the guarded deserializer returns for bytes that do not parse."""

    def __init__(self, error: str) -> None:
        self.error = error


def _guarded(deserialize: Callable[[bytes], Any], name: str) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        try:
            return deserialize(data)
        except (DecodeError, ValueError, UnicodeDecodeError) as exc:
            return _Malformed(f"the request is not a valid {name} message ({exc})"[:300])

    return parse


async def _refuse(malformed: _Malformed, context: grpc.aio.ServicerContext[Any, Any]) -> None:
    log.info("request refused", code="INVALID_ARGUMENT", reason=malformed.error)
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, malformed.error)


def _message_name(deserialize: Callable[[bytes], Any]) -> str:
    owner = getattr(deserialize, "__self__", None)
    return getattr(owner, "__name__", "") or "request"


class MalformedRequestInterceptor(grpc.aio.ServerInterceptor):
    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> MethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None or handler.request_streaming:
            return handler
        parse = _guarded(handler.request_deserializer, _message_name(handler.request_deserializer))
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                _unary(handler.unary_unary),
                request_deserializer=parse,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                _stream(handler.unary_stream),
                request_deserializer=parse,
                response_serializer=handler.response_serializer,
            )
        return handler


def _unary(behavior: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
    async def guarded(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        if isinstance(request, _Malformed):
            await _refuse(request, context)
        result = behavior(request, context)
        return await result if inspect.isawaitable(result) else result

    return guarded


def _stream(behavior: Callable[..., Any]) -> Callable[..., AsyncIterator[Any]]:
    async def guarded(
        request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        if isinstance(request, _Malformed):
            await _refuse(request, context)
        result = behavior(request, context)
        if inspect.isasyncgen(result):
            async for item in result:
                yield item
        elif inspect.isawaitable(result):
            await result  # a handler that writes through context.write
        elif result is not None:
            for item in result:
                yield item

    return guarded
