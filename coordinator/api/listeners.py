"""The coordinator API served: the loopback listener for the `ringsnap` CLI on this host (gRPC
local credentials refuse any other peer; a bearer token that only root and the coordinator's group
can read, `apitoken`), the remote listener for operators on other hosts (mutual TLS, allow-listed
identities with roles, `access`), the standard health service (answers without a token, for
probes), and starting and stopping them."""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from ringsnap.api.v1 import coordinator_pb2_grpc
from ringsnap.coordinator.api import access
from ringsnap.coordinator.api.servicer import SERVICE_NAME, CoordinatorServicer
from ringsnap.coordinator.config import RemoteSection
from ringsnap.coordinator.service import Coordinator
from ringsnap.errors import RingsnapError, ValidationError
from ringsnap.grpcauth import Continuation, MethodHandler, guarded, server_credentials
from ringsnap.logs import get_logger
from ringsnap.malformed import MalformedRequestInterceptor
from ringsnap.rpcerrors import Context

log = get_logger(__name__)

HEALTH_METHODS = "/grpc.health.v1.Health/"


def loopback_problem(listen: str) -> str | None:
    """Why `listen` (HOST:PORT) is not a loopback address, or None if it is."""
    host = listen.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return None
    try:
        if ipaddress.ip_address(host).is_loopback:
            return None
    except ValueError:
        pass
    return (
        f"{listen} is not a loopback address: this listener serves the `ringsnap` CLI on this"
        " host only; use 127.0.0.1:PORT or [::1]:PORT, and [remote] (mutual TLS, an allow-list"
        " of client identities with roles) for operators on other hosts"
    )


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Refuses every call but health checks unless it carries `authorization: Bearer <token>`."""

    def __init__(self, token: str, where: str) -> None:
        self._expected = f"Bearer {token}".encode()
        self._where = where

    def _authorized(self, metadata: Any) -> bool:
        for key, value in metadata or ():
            if key == "authorization":
                presented = value.encode() if isinstance(value, str) else bytes(value)
                return hmac.compare_digest(presented, self._expected)
        return False

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> MethodHandler:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith(HEALTH_METHODS):
            return handler
        if self._authorized(handler_call_details.invocation_metadata):
            return guarded(handler, _log_local_call, method)
        log.warning("refused: missing or wrong API token", method=method)
        return _denied(
            handler,
            f"missing or wrong API token; `ringsnap` reads it from {self._where}, readable by"
            " root and the coordinator's group (ringsnap)",
        )


async def _log_local_call(_context: Context, method: str, request: Any) -> None:
    access.log_call(method, request, "local (API token)")


def _denied(
    original: grpc.RpcMethodHandler[Any, Any], message: str
) -> grpc.RpcMethodHandler[Any, Any]:
    # The stubs type handler behaviours as synchronous; under grpc.aio they are coroutines.
    handler: Any = original
    kwargs: dict[str, Any] = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }

    async def deny(request: Any, context: Context) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def deny_stream(request: Any, context: Context) -> AsyncIterator[Any]:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        yield None  # never reached; makes this an async generator

    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(deny_stream, **kwargs)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(deny, **kwargs)
    if handler.stream_stream is not None:
        return grpc.stream_stream_rpc_method_handler(deny_stream, **kwargs)
    return grpc.unary_unary_rpc_method_handler(deny, **kwargs)


@dataclass(frozen=True)
class RemoteListener:
    """The mutual-TLS listener for operators on other hosts: address, PEMs and allow-list."""

    listen: str
    cert: bytes
    key: bytes = field(repr=False)  # never in a log or an error
    ca: bytes
    clients: Mapping[str, access.Role]

    @classmethod
    def from_config(cls, section: RemoteSection) -> RemoteListener:
        return cls(
            listen=section.listen,
            cert=Path(section.cert_file).read_bytes(),
            key=section.key_file.get_secret_value().encode(),
            ca=Path(section.ca_file).read_bytes(),
            clients={client.identity: client.role for client in section.clients},
        )


class CoordinatorServer:
    """The API of a started `Coordinator` on `listen` (loopback), with the health service.

    server = CoordinatorServer(coordinator, "127.0.0.1:7444", token, token_file)
    port = await server.start()
    ...
    await server.stop(grace=5)   # health says NOT_SERVING first; in-flight calls get `grace`
    """

    def __init__(
        self,
        coordinator: Coordinator,
        listen: str,
        token: str,
        where: str,
        remote: RemoteListener | None = None,
    ) -> None:
        problem = loopback_problem(listen)
        if problem is not None:
            raise ValidationError(problem)
        self.coordinator = coordinator
        self.listen = listen
        self.remote = remote
        self.health = HealthServicer()
        self.port: int | None = None
        self.remote_port: int | None = None
        self._token = token
        self._where = where
        self._servers: list[grpc.aio.Server] = []

    async def start(self) -> int:
        servicer = CoordinatorServicer(self.coordinator)
        try:
            self.port = await self._serve(
                servicer,
                TokenInterceptor(self._token, self._where),
                self.listen,
                grpc.local_server_credentials(grpc.LocalConnectionType.LOCAL_TCP),
            )
            if self.remote is not None:
                self.remote_port = await self._serve(
                    servicer,
                    access.RemoteAccessInterceptor(self.remote.clients),
                    self.remote.listen,
                    server_credentials(self.remote.cert, self.remote.key, self.remote.ca),
                )
        except BaseException:
            await self.stop(grace=0)
            raise
        for service in ("", SERVICE_NAME):
            await self.health.set(service, health_pb2.HealthCheckResponse.SERVING)
        log.info(
            "coordinator API serving",
            listen=self.listen,
            port=self.port,
            remote=self.remote.listen if self.remote is not None else "off",
            remote_port=self.remote_port,
        )
        return self.port

    async def _serve(
        self,
        servicer: CoordinatorServicer,
        interceptor: grpc.aio.ServerInterceptor,
        listen: str,
        credentials: grpc.ServerCredentials,
    ) -> int:
        server = grpc.aio.server(
            interceptors=[interceptor, MalformedRequestInterceptor()],
            options=[
                ("grpc.max_receive_message_length", 1024 * 1024),
                ("grpc.so_reuseport", 0),
            ],
        )
        coordinator_pb2_grpc.add_CoordinatorServiceServicer_to_server(servicer, server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        try:
            port = server.add_secure_port(listen, credentials)
        except RuntimeError as exc:
            raise RingsnapError(f"cannot listen on {listen}: {exc}") from None
        if port == 0:
            raise RingsnapError(f"cannot listen on {listen} (address in use?)")
        await server.start()
        self._servers.append(server)
        return port

    async def enter_shutdown(self) -> None:
        """Tell health checks the service is going away (before the coordinator stops)."""
        await self.health.enter_graceful_shutdown()

    async def stop(self, grace: float = 5.0) -> None:
        await self.enter_shutdown()
        servers, self._servers = self._servers, []
        if servers:
            await asyncio.gather(*(server.stop(grace) for server in servers))
            log.info("coordinator API stopped")
