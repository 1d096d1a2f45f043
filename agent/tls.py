"""Mutual TLS for the agent: server credentials that demand a client certificate from our CA, and
an interceptor that lets only allow-listed client identities reach any handler.

The TLS handshake already refuses clients without a certificate or with one from another CA. The
interceptor then compares the certificate's subject common name and subject alternative names with
the allow-list, before the handler runs (grpc's server interceptors get no context, so the check
wraps the handler it returns).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

import grpc
import grpc.aio

from ringsnap import logs

log = logs.get_logger(__name__)


def server_credentials(cert_pem: bytes, key_pem: bytes, ca_pem: bytes) -> grpc.ServerCredentials:
    return grpc.ssl_server_credentials(
        [(key_pem, cert_pem)], root_certificates=ca_pem, require_client_auth=True
    )


def client_identities(context: grpc.aio.ServicerContext[Any, Any]) -> tuple[str, list[str]]:
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


Check = Callable[[grpc.aio.ServicerContext[Any, Any], str], Awaitable[None]]


class AllowListInterceptor(grpc.aio.ServerInterceptor):
    """Refuses every call whose client certificate names no allow-listed identity."""

    def __init__(self, allowed: Iterable[str]) -> None:
        self._allowed = frozenset(allowed)

    async def _check(self, context: grpc.aio.ServicerContext[Any, Any], method: str) -> None:
        security, names = client_identities(context)
        if security != "ssl" or not names:
            log.warning(
                "refused: no client certificate identity", method=method, peer=context.peer()
            )
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "a client certificate with a subject common name or alternative name is required",
            )
        if self._allowed.isdisjoint(names):
            log.warning("refused: client not allowed", method=method, identities=names)
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"client identity {', '.join(names)} is not on this agent's allow-list",
            )

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        return _guarded(handler, self._check, handler_call_details.method)


def _guarded(
    original: grpc.RpcMethodHandler[Any, Any], check: Check, method: str
) -> grpc.RpcMethodHandler[Any, Any]:
    # The grpc stubs type handler behaviours as synchronous; under grpc.aio they are coroutines
    # or async generators.
    handler: Any = original
    kwargs: dict[str, Any] = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary is not None:
        inner_uu = handler.unary_unary

        async def unary_unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            await check(context, method)
            return await inner_uu(request, context)

        return grpc.unary_unary_rpc_method_handler(unary_unary, **kwargs)
    if handler.unary_stream is not None:
        inner_us = handler.unary_stream

        async def unary_stream(
            request: Any, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            await check(context, method)
            result: Any = inner_us(request, context)
            if inspect.isasyncgen(result):
                async for item in result:
                    yield item
            else:  # a handler that writes with context.write() and returns nothing
                await result

        return grpc.unary_stream_rpc_method_handler(unary_stream, **kwargs)
    if handler.stream_unary is not None:
        inner_su = handler.stream_unary

        async def stream_unary(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            await check(context, method)
            return await inner_su(requests, context)

        return grpc.stream_unary_rpc_method_handler(stream_unary, **kwargs)
    inner_ss: Any = handler.stream_stream

    async def stream_stream(
        requests: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        await check(context, method)
        result: Any = inner_ss(requests, context)
        if inspect.isasyncgen(result):
            async for item in result:
                yield item
        else:
            await result

    return grpc.stream_stream_rpc_method_handler(stream_stream, **kwargs)
