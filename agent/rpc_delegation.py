"""RPCs the servicer hands whole to a component (`TableImportRpcs`, `S3RestoreRpcs`, ...): one
line per RPC instead of one method each.

    GetStagingSpace = delegated(lambda servicer: servicer._table_imports.get_staging_space)

The descriptor takes the RPC's name from the attribute it is assigned to (for the log of a refused
or failed call) and gives the servicer a handler of the generated base method's signature, so mypy
checks the component's request and response types against the proto's. Errors end the call with
their mapped status, as `ErrorStatuses.unary` does; a stream is closed when its caller goes away
(that is what stops a download or an export).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Generic, Protocol, TypeVar

import grpc.aio

from ringsnap.rpcerrors import Context, ErrorStatuses

Owner = TypeVar("Owner")
Component = TypeVar("Component")
Request = TypeVar("Request")
Response = TypeVar("Response")
_Request_contra = TypeVar("_Request_contra", contravariant=True)
_Response_co = TypeVar("_Response_co", covariant=True)


class UnaryHandler(Protocol[_Request_contra, _Response_co]):
    def __call__(self, request: _Request_contra, context: Context) -> Awaitable[_Response_co]: ...


class StreamHandler(Protocol[_Request_contra, _Response_co]):
    def __call__(
        self, request: _Request_contra, context: Context
    ) -> AsyncIterator[_Response_co]: ...


class _Delegation(Generic[Component]):
    """What both kinds hold: the component's method for a servicer, the error table, and the
    RPC's name (the attribute's)."""

    def __init__(self, component: Component, statuses: ErrorStatuses) -> None:
        self._component = component
        self._statuses = statuses
        self.rpc = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.rpc = name


class Delegated(
    _Delegation[Callable[[Owner], Callable[[Request], Awaitable[Response]]]],
    Generic[Owner, Request, Response],
):
    """A unary RPC answered by `component(servicer)(request)`."""

    def __get__(
        self, servicer: Owner, owner: type | None = None
    ) -> UnaryHandler[Request, Response]:
        component, statuses, rpc = self._component, self._statuses, self.rpc

        async def call(request: Request, context: Context) -> Response:
            try:
                return await component(servicer)(request)
            except grpc.aio.AbortError:
                raise
            except Exception as exc:
                await statuses.abort(context, exc, rpc)

        call.__name__ = rpc
        return call


class DelegatedStream(
    _Delegation[Callable[[Owner], Callable[[Request], AsyncGenerator[Response, None]]]],
    Generic[Owner, Request, Response],
):
    """A server-streaming RPC answered by the messages of `component(servicer)(request)`."""

    def __get__(
        self, servicer: Owner, owner: type | None = None
    ) -> StreamHandler[Request, Response]:
        component, statuses, rpc = self._component, self._statuses, self.rpc

        async def call(request: Request, context: Context) -> AsyncIterator[Response]:
            try:
                # aclosing: a caller that goes away closes the component's stream, which stops it.
                async with contextlib.aclosing(component(servicer)(request)) as stream:
                    async for message in stream:
                        yield message
            except (asyncio.CancelledError, grpc.aio.AbortError):
                raise
            except Exception as exc:
                await statuses.abort(context, exc, rpc)

        call.__name__ = rpc
        return call
