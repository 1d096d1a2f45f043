"""Errors to gRPC status codes, for both servers: each passes its own table; the decorator of the
unary handlers and the abort are here, once.

    STATUSES = ErrorStatuses(TABLE, internal="internal error in the agent; see its log")
    unary = STATUSES.unary

    class Servicer(...):
        @unary
        async def Call(self, request, context): ...

A row is (error class, status code) or (error class, status code, reason word); the first row the
error is an instance of wins, so the most specific class goes first. A reason word is a stable name
of the cause (the code's name when the row has none). With `domain`, an abort carries a
`google.rpc.Status` whose `ErrorInfo` holds the reason word and the domain, so that clients need
not parse messages. Anything no row names is INTERNAL: logged with its traceback, the caller told
`internal` ({kind}, if there, is the error's class name) and never the traceback.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NoReturn, TypeVar

import grpc
import grpc.aio
import structlog
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2  # type: ignore[import-untyped]
from grpc_status import rpc_status

from ringsnap import logs

Context = grpc.aio.ServicerContext[Any, Any]
Request = TypeVar("Request")
Response = TypeVar("Response")
Row = tuple[type[BaseException], grpc.StatusCode] | tuple[type[BaseException], grpc.StatusCode, str]
#: Decides before the table for an error whose status depends on more than its class.
Refine = Callable[[BaseException], tuple[grpc.StatusCode, str] | None]

_CODE_NUMBER = {code: code_pb2.Code.Value(code.name) for code in grpc.StatusCode}


class ErrorStatuses:
    def __init__(
        self,
        table: Sequence[Row],
        *,
        internal: str,
        domain: str = "",
        refine: Refine | None = None,
        log: structlog.typing.FilteringBoundLogger | None = None,
    ) -> None:
        self._rows = [(row[0], row[1], row[2] if len(row) == 3 else "") for row in table]
        self.internal = internal
        self.domain = domain
        self._refine = refine
        self._log = log if log is not None else logs.get_logger(__name__)

    def lookup(self, error: BaseException) -> tuple[grpc.StatusCode, str] | None:
        """The status code and reason word of an error, or None when the table has no row for it."""
        if self._refine is not None:
            refined = self._refine(error)
            if refined is not None:
                return refined
        for kind, code, reason in self._rows:
            if isinstance(error, kind):
                return code, reason or code.name
        return None

    def code_for(self, error: BaseException) -> grpc.StatusCode | None:
        found = self.lookup(error)
        return found[0] if found is not None else None

    def classify(self, error: BaseException) -> tuple[grpc.StatusCode, str]:
        """The status code and reason word of an error (INTERNAL for anything unforeseen)."""
        return self.lookup(error) or (grpc.StatusCode.INTERNAL, "INTERNAL")

    def rich_status(self, code: grpc.StatusCode, reason: str, message: str) -> grpc.Status:
        """`code` and `message` with an ErrorInfo of `reason` in this table's domain."""
        detail = any_pb2.Any()
        detail.Pack(error_details_pb2.ErrorInfo(reason=reason, domain=self.domain))
        status: grpc.Status = rpc_status.to_status(
            status_pb2.Status(code=_CODE_NUMBER[code], message=message, details=[detail])
        )
        return status

    async def abort(self, context: Context, error: BaseException, method: str) -> NoReturn:
        """End the call with the status of `error` (logged: refusals briefly, the rest in full)."""
        found = self.lookup(error)
        if found is None:
            self._log.error("internal error", method=method, exc_info=error)
            code, reason = grpc.StatusCode.INTERNAL, "INTERNAL"
            message = self.internal.format(kind=type(error).__name__)
        else:
            code, reason = found
            message = str(error) or type(error).__name__
            # Without a domain (the agent: no reason words), the message is logged as the reason.
            said = {"reason": reason, "error": message} if self.domain else {"reason": message}
            self._log.info("request refused", method=method, code=code.name, **said)
        if not self.domain:
            await context.abort(code, message)
        status = self.rich_status(code, reason, message)
        await context.abort(status.code, status.details, status.trailing_metadata)

    def unary(
        self, handler: Callable[[Any, Request, Context], Awaitable[Response]]
    ) -> Callable[[Any, Request, Context], Awaitable[Response]]:
        """A unary handler whose errors end the call with their status (an abort passes through;
        cancellation is no Exception and passes through too)."""

        @functools.wraps(handler)
        async def wrapper(self_: Any, request: Request, context: Context) -> Response:
            try:
                return await handler(self_, request, context)
            except grpc.aio.AbortError:
                raise
            except Exception as exc:
                await self.abort(context, exc, handler.__name__)

        return wrapper
