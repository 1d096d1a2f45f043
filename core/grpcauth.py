"""Mutual-TLS building blocks both daemons' gRPC servers share: server credentials that demand a
client certificate from our CA, the caller's identities from its certificate, and a guard that runs
a check before a handler (grpc's server interceptors get no context, so a check that needs the
caller's certificate wraps the handler the interceptor returns).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeAlias

import grpc
import grpc.aio

Context = grpc.aio.ServicerContext[Any, Any]
#: Runs before the handler: (context, full method name, the request or None for a request stream).
#: It aborts the call to refuse it.
Check = Callable[[Context, str, Any], Awaitable[None]]
#: What a server interceptor is handed to find the handler of a call, and what it answers.
#: (Strings: grpc's classes are generic only in its type stubs.)
MethodHandler: TypeAlias = "grpc.RpcMethodHandler[Any, Any] | None"
Continuation: TypeAlias = "Callable[[grpc.HandlerCallDetails], Awaitable[MethodHandler]]"


def server_credentials(cert_pem: bytes, key_pem: bytes, ca_pem: bytes) -> grpc.ServerCredentials:
    return grpc.ssl_server_credentials(
        [(key_pem, cert_pem)], root_certificates=ca_pem, require_client_auth=True
    )


def client_identities(context: Context) -> tuple[str, list[str]]:
    """(TLS state, identities) of the caller: its certificate's common name(s) and SANs."""
    auth = context.auth_context()
    security = b"".join(auth.get("transport_security_type", [])).decode(errors="replace")
    names: list[str] = []
    for key in ("x509_common_name", "x509_subject_alternative_name"):
        for value in auth.get(key, []):
            text = value.decode("utf-8", errors="replace")
            if text and text not in names:
                names.append(text)
    return security, names


class CheckingInterceptor(grpc.aio.ServerInterceptor):
    """Runs the subclass's `check` (which aborts to refuse) before every handler of the server."""

    async def check(self, context: Context, method: str, request: Any) -> None:
        raise NotImplementedError

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> MethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        return guarded(handler, self.check, handler_call_details.method)


def guarded(
    original: grpc.RpcMethodHandler[Any, Any], check: Check, method: str
) -> grpc.RpcMethodHandler[Any, Any]:
    """`original` with `check` run first, for each of the four call shapes."""
    # The grpc stubs type handler behaviours as synchronous; under grpc.aio they are coroutines
    # or async generators.
    handler: Any = original
    kwargs: dict[str, Any] = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary is not None:
        inner_uu = handler.unary_unary

        async def unary_unary(request: Any, context: Context) -> Any:
            await check(context, method, request)
            return await inner_uu(request, context)

        return grpc.unary_unary_rpc_method_handler(unary_unary, **kwargs)
    if handler.unary_stream is not None:
        inner_us = handler.unary_stream

        async def unary_stream(request: Any, context: Context) -> AsyncIterator[Any]:
            await check(context, method, request)
            async for item in _responses(inner_us(request, context)):
                yield item

        return grpc.unary_stream_rpc_method_handler(unary_stream, **kwargs)
    if handler.stream_unary is not None:
        inner_su = handler.stream_unary

        async def stream_unary(requests: Any, context: Context) -> Any:
            await check(context, method, None)
            return await inner_su(requests, context)

        return grpc.stream_unary_rpc_method_handler(stream_unary, **kwargs)
    inner_ss: Any = handler.stream_stream

    async def stream_stream(requests: Any, context: Context) -> AsyncIterator[Any]:
        await check(context, method, None)
        async for item in _responses(inner_ss(requests, context)):
            yield item

    return grpc.stream_stream_rpc_method_handler(stream_stream, **kwargs)


async def _responses(result: Any) -> AsyncIterator[Any]:
    if inspect.isasyncgen(result):
        async for item in result:
            yield item
    else:  # a handler that writes with context.write() and returns nothing
        await result
