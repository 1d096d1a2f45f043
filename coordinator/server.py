"""The coordinator's gRPC service: messages to `Coordinator` calls and back, nothing more.

Domain errors become status codes in one place (`ERRORS`; an agent's own answer passes through by
`AGENT_STATUSES`), each with a stable reason word in a `google.rpc.ErrorInfo` (domain
`ringsnap.coordinator`) so that clients need not parse messages; an operation that fails carries
the same word in `error_reason`. Anything unexpected is INTERNAL and
logged with its traceback; the caller is told where to look, not the traceback.

Access: loopback only (gRPC local credentials refuse any other peer, whatever the bind address)
and a bearer token that only root and the coordinator's group can read (`apitoken`). The standard
health service (`grpc.health.v1.Health`) answers without a token, for probes.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from ringsnap import names
from ringsnap.api.v1 import coordinator_pb2 as pb
from ringsnap.api.v1 import coordinator_pb2_grpc, types_pb2
from ringsnap.coordinator import access, control, messages
from ringsnap.coordinator.agents import AgentError
from ringsnap.coordinator.backup import BackupFailed, BackupRefused
from ringsnap.coordinator.canary import CanaryError
from ringsnap.coordinator.catalog import (
    BackupNotFoundError,
    BackupStateError,
    CatalogError,
    CatalogLockedError,
    InvalidPageTokenError,
    OperationNotFoundError,
    RestoreNotFoundError,
)
from ringsnap.coordinator.catalog.drills import DrillNotFoundError
from ringsnap.coordinator.catalog.exports import ExportNotFoundError
from ringsnap.coordinator.config import RemoteSection
from ringsnap.coordinator.drill.wire import drill_id_of, drill_message, drill_request
from ringsnap.coordinator.drill.workflow import DrillRefused
from ringsnap.coordinator.export.api import export_message
from ringsnap.coordinator.export.daemon import start_export
from ringsnap.coordinator.export.listing import off_array_copies
from ringsnap.coordinator.export.model import ExportFailed, ExportRefused
from ringsnap.coordinator.export.purge_daemon import purge_through_daemon
from ringsnap.coordinator.model import RestoreMode
from ringsnap.coordinator.operations import Operation
from ringsnap.coordinator.restore import RestoreFailed, RestoreRefused
from ringsnap.coordinator.restore_abort import start_abort
from ringsnap.coordinator.restore_daemon import RestoreNotConfirmed
from ringsnap.coordinator.restore_plan import RestoreRequest
from ringsnap.coordinator.scheduler import BackupRequest, ClusterBusyError
from ringsnap.coordinator.service import Coordinator, UnknownClusterError, UnknownPolicyError
from ringsnap.coordinator.table_restore import api as table_restore_api
from ringsnap.coordinator.table_restore.api import table_restore_message
from ringsnap.coordinator.table_restore.model import TableRestoreFailed, TableRestoreRefused
from ringsnap.errors import RingsnapError, ValidationError
from ringsnap.grpcauth import guarded, server_credentials
from ringsnap.logs import get_logger
from ringsnap.malformed import MalformedRequestInterceptor
from ringsnap.plugins.errors import DriverError
from ringsnap.rpcerrors import Context, ErrorStatuses

log = get_logger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["CoordinatorService"].full_name
ERROR_DOMAIN = "ringsnap.coordinator"
HEALTH_METHODS = "/grpc.health.v1.Health/"
#: ListBackups in the FULL view: at most this many backups a page (each holds its whole ring).
FULL_VIEW_PAGE_SIZE = 20
#: ListRestores without a limit.
DEFAULT_RESTORE_LIMIT = 50
_MAX_TRIGGER = 200


class NotSupportedError(RingsnapError):
    """The API has the call or field, the coordinator does not do it (yet)."""


#: The one place where errors become status codes and reasons (most specific class first).
ERRORS: tuple[tuple[type[BaseException], grpc.StatusCode, str], ...] = (
    (ValidationError, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT"),
    (InvalidPageTokenError, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PAGE_TOKEN"),
    (BackupNotFoundError, grpc.StatusCode.NOT_FOUND, "BACKUP_NOT_FOUND"),
    (OperationNotFoundError, grpc.StatusCode.NOT_FOUND, "OPERATION_NOT_FOUND"),
    (RestoreNotFoundError, grpc.StatusCode.NOT_FOUND, "RESTORE_NOT_FOUND"),
    (DrillNotFoundError, grpc.StatusCode.NOT_FOUND, "DRILL_NOT_FOUND"),
    (UnknownClusterError, grpc.StatusCode.NOT_FOUND, "UNKNOWN_CLUSTER"),
    (UnknownPolicyError, grpc.StatusCode.NOT_FOUND, "UNKNOWN_POLICY"),
    (ClusterBusyError, grpc.StatusCode.ABORTED, "CLUSTER_BUSY"),
    (BackupRefused, grpc.StatusCode.FAILED_PRECONDITION, "BACKUP_REFUSED"),
    (BackupStateError, grpc.StatusCode.FAILED_PRECONDITION, "BACKUP_STATE"),
    (BackupFailed, grpc.StatusCode.UNAVAILABLE, "BACKUP_FAILED"),
    (RestoreNotConfirmed, grpc.StatusCode.FAILED_PRECONDITION, "RESTORE_NOT_CONFIRMED"),
    (RestoreRefused, grpc.StatusCode.FAILED_PRECONDITION, "RESTORE_REFUSED"),
    (RestoreFailed, grpc.StatusCode.UNAVAILABLE, "RESTORE_FAILED"),
    (DrillRefused, grpc.StatusCode.FAILED_PRECONDITION, "DRILL_REFUSED"),
    (TableRestoreRefused, grpc.StatusCode.FAILED_PRECONDITION, "RESTORE_REFUSED"),
    (TableRestoreFailed, grpc.StatusCode.UNAVAILABLE, "RESTORE_FAILED"),
    (ExportNotFoundError, grpc.StatusCode.NOT_FOUND, "EXPORT_NOT_FOUND"),
    (ExportRefused, grpc.StatusCode.FAILED_PRECONDITION, "EXPORT_REFUSED"),
    (ExportFailed, grpc.StatusCode.UNAVAILABLE, "EXPORT_FAILED"),
    (AgentError, grpc.StatusCode.UNAVAILABLE, "AGENT_FAILED"),
    (CanaryError, grpc.StatusCode.UNAVAILABLE, "CANARY_FAILED"),
    (DriverError, grpc.StatusCode.UNAVAILABLE, "ARRAY_FAILED"),
    (CatalogLockedError, grpc.StatusCode.UNAVAILABLE, "CATALOG_LOCKED"),
    (NotSupportedError, grpc.StatusCode.UNIMPLEMENTED, "NOT_SUPPORTED"),
    (CatalogError, grpc.StatusCode.FAILED_PRECONDITION, "CATALOG_REFUSED"),
    # Every other error of ours says what to do: the caller's request cannot be served as is.
    (RingsnapError, grpc.StatusCode.FAILED_PRECONDITION, "FAILED_PRECONDITION"),
)
#: An agent's answer about the request passes through, by `AgentError.code` (its message names the
#: node and the call); anything else from an agent (unreachable, a command or hook that failed, a
#: timeout) is AGENT_FAILED above.
AGENT_STATUSES: dict[str, tuple[grpc.StatusCode, str]] = {
    "FAILED_PRECONDITION": (grpc.StatusCode.FAILED_PRECONDITION, "AGENT_REFUSED"),
    "INVALID_ARGUMENT": (grpc.StatusCode.INVALID_ARGUMENT, "AGENT_INVALID_ARGUMENT"),
    "NOT_FOUND": (grpc.StatusCode.NOT_FOUND, "AGENT_NOT_FOUND"),
}


def _agent_status(error: BaseException) -> tuple[grpc.StatusCode, str] | None:
    return AGENT_STATUSES.get(error.code) if isinstance(error, AgentError) else None


STATUSES = ErrorStatuses(
    ERRORS,
    internal="internal error in the coordinator ({kind}); its log has the details"
    " (journalctl -u ringsnap-coordinator)",
    domain=ERROR_DOMAIN,
    refine=_agent_status,
    log=log,
)
classify = STATUSES.classify
unary = STATUSES.unary


def error_reason(operation: Operation) -> str:
    return classify(operation.error)[1] if operation.error is not None else ""


def _required(value: str, field: str) -> str:
    if not value:
        raise ValidationError(f"{field} is required")
    return value


def _backup_id(value: str) -> str:
    return names.backup_id(_required(value, "backup_id"))


def _restore_id(value: str, field: str = "restore_id") -> str:
    return names.snapshot_tag(_required(value, field), what=field)


def _printable(value: str, field: str) -> str:
    if len(value) > _MAX_TRIGGER or not value.isprintable():
        raise ValidationError(f"{field} must be printable and at most {_MAX_TRIGGER} characters")
    return value


_RESTORE_MODES = {
    pb.RESTORE_MODE_UNSPECIFIED: RestoreMode.REVERT,
    pb.RESTORE_MODE_REVERT: RestoreMode.REVERT,
    pb.RESTORE_MODE_CLONE: RestoreMode.CLONE,
    pb.RESTORE_MODE_S3: RestoreMode.S3,
}


def _restore_request(
    backup_id: str,
    nodes: Sequence[str],
    mode: pb.RestoreMode.ValueType,
    force: bool,
    requested_by: str,
) -> RestoreRequest:
    if mode not in _RESTORE_MODES:
        raise ValidationError(f"unknown restore mode {mode}")
    return RestoreRequest(
        backup_id=_backup_id(backup_id),
        nodes=tuple(_printable(_required(n, "nodes[]"), "nodes[]") for n in nodes),
        mode=_RESTORE_MODES[mode],
        force=force,
        requested_by=requested_by,
    )


class CoordinatorServicer(coordinator_pb2_grpc.CoordinatorServiceServicer):
    def __init__(self, coordinator: Coordinator) -> None:
        self._coordinator = coordinator

    def _operation(self, operation: Operation) -> types_pb2.Operation:
        return messages.operation(operation.current, error_reason(operation))

    @unary
    async def StartBackup(
        self, request: pb.StartBackupRequest, context: Context
    ) -> types_pb2.Operation:
        if request.quiesce_mode != pb.QUIESCE_MODE_UNSPECIFIED or request.allow_partial:
            raise NotSupportedError(
                "the quiesce mode and partial backups are set per cluster in the coordinator's"
                " configuration (clusters.N.quiesce, clusters.N.allow_partial), not per request"
            )
        trigger = request.trigger or "api"
        if len(trigger) > _MAX_TRIGGER or not trigger.isprintable():
            raise ValidationError(
                f"trigger must be printable and at most {_MAX_TRIGGER} characters"
            )
        operation = self._coordinator.start_backup(
            BackupRequest(
                cluster=_required(request.cluster, "cluster"),
                trigger=trigger,
                policy=request.policy,
            )
        )
        log.info(
            "backup requested",
            cluster=request.cluster,
            trigger=trigger,
            backup_id=operation.current.backup_id,
            operation_id=operation.current.operation_id,
        )
        return self._operation(operation)

    @unary
    async def GetOperation(
        self, request: pb.GetOperationRequest, context: Context
    ) -> types_pb2.Operation:
        return self._operation(control.find_operation(self._coordinator, request.operation_id))

    async def WatchOperation(
        self, request: pb.WatchOperationRequest, context: Context
    ) -> AsyncIterator[types_pb2.Operation]:
        try:
            operation = control.find_operation(self._coordinator, request.operation_id)
        except Exception as exc:
            await STATUSES.abort(context, exc, "WatchOperation")
        async for snapshot in operation.watch():
            yield messages.operation(snapshot, error_reason(operation))

    @unary
    async def ListBackups(
        self, request: pb.ListBackupsRequest, context: Context
    ) -> pb.ListBackupsResponse:
        full = request.view == pb.BACKUP_VIEW_FULL
        page_size = request.page_size
        if full:
            page_size = min(page_size or FULL_VIEW_PAGE_SIZE, FULL_VIEW_PAGE_SIZE)
        page = await asyncio.to_thread(
            self._coordinator.catalog.list_backups,
            request.cluster or None,
            page_size=page_size,
            page_token=request.page_token,
        )
        response = pb.ListBackupsResponse(
            backups=[messages.backup(b, full=full) for b in page.backups],
            next_page_token=page.next_page_token,
        )
        await off_array_copies(self._coordinator.catalog, response.backups)
        return response

    @unary
    async def GetBackup(self, request: pb.GetBackupRequest, context: Context) -> pb.Backup:
        backup_id = _backup_id(request.backup_id)
        backup = await asyncio.to_thread(self._coordinator.catalog.get_backup, backup_id)
        message = messages.backup(backup)
        await off_array_copies(self._coordinator.catalog, [message])
        return message

    @unary
    async def DeleteBackup(
        self, request: pb.DeleteBackupRequest, context: Context
    ) -> types_pb2.Operation:
        reason = request.reason.strip() or "deleted through the coordinator API"
        backup_id = _backup_id(request.backup_id)
        self._coordinator.restores.refuse_while_restored(backup_id)
        operation = await control.start_delete(self._coordinator, backup_id, reason)
        return self._operation(operation)

    @unary
    async def PlanRestore(self, request: pb.PlanRestoreRequest, context: Context) -> pb.RestorePlan:
        restore = _restore_request(
            request.backup_id, request.nodes, request.mode, request.force, ""
        )
        plan = await self._coordinator.restores.plan_restore(restore)
        return messages.restore_plan(plan)

    @unary
    async def StartRestore(
        self, request: pb.StartRestoreRequest, context: Context
    ) -> types_pb2.Operation:
        requested_by = access.attributed(_printable(request.requested_by or "api", "requested_by"))
        confirm = _printable(request.confirm_cluster, "confirm_cluster")
        if request.resume_id:
            operation = await self._coordinator.restores.resume_restore(
                _restore_id(request.resume_id, "resume_id"),
                confirm_cluster=confirm,
                requested_by=requested_by,
            )
        else:
            operation = await self._coordinator.restores.start_restore(
                _restore_request(
                    request.backup_id, request.nodes, request.mode, request.force, requested_by
                ),
                confirm_cluster=confirm,
                restore_id=_restore_id(request.restore_id) if request.restore_id else "",
            )
        log.info(
            "restore requested",
            backup_id=request.backup_id,
            resume_id=request.resume_id,
            requested_by=requested_by,
            operation_id=operation.current.operation_id,
        )
        return self._operation(operation)

    @unary
    async def GetRestore(self, request: pb.GetRestoreRequest, context: Context) -> pb.Restore:
        restore_id = _restore_id(request.restore_id)
        record = await asyncio.to_thread(self._coordinator.catalog.get_restore, restore_id)
        return messages.restore(record)

    @unary
    async def ListRestores(
        self, request: pb.ListRestoresRequest, context: Context
    ) -> pb.ListRestoresResponse:
        records = await asyncio.to_thread(
            self._coordinator.catalog.list_restores,
            request.cluster or None,
            limit=request.limit or DEFAULT_RESTORE_LIMIT,
        )
        return pb.ListRestoresResponse(restores=[messages.restore(r) for r in records])

    @unary
    async def StartDrill(
        self, request: pb.StartRestoreDrillRequest, context: Context
    ) -> types_pb2.Operation:
        requested_by = access.attributed(_printable(request.requested_by or "api", "requested_by"))
        operation = await self._coordinator.start_drill(
            drill_request(request, requested_by), drill_id=request.drill_id
        )
        log.info(
            "drill requested",
            cluster=request.cluster,
            backup_id=request.backup_id,
            requested_by=requested_by,
            operation_id=operation.current.operation_id,
        )
        return self._operation(operation)

    @unary
    async def GetDrill(
        self, request: pb.GetRestoreDrillRequest, context: Context
    ) -> pb.RestoreDrill:
        drill_id = drill_id_of(request.drill_id)
        record = await asyncio.to_thread(self._coordinator.catalog.get_drill, drill_id)
        return drill_message(record)

    @unary
    async def ListDrills(
        self, request: pb.ListRestoreDrillsRequest, context: Context
    ) -> pb.ListRestoreDrillsResponse:
        if request.limit < 0:  # int32 here (uint32 in the other lists)
            raise ValidationError(
                f"limit {request.limit} is negative: give 0 (the default) or more"
            )
        records = await asyncio.to_thread(
            self._coordinator.catalog.list_drills,
            request.cluster or None,
            backup_id=request.backup_id or None,
            limit=request.limit or DEFAULT_RESTORE_LIMIT,
        )
        return pb.ListRestoreDrillsResponse(drills=[drill_message(r) for r in records])

    @unary
    async def GetTableRestore(
        self, request: pb.GetTableRestoreRequest, context: Context
    ) -> pb.TableRestore:
        restore_id = _restore_id(request.table_restore_id, "table_restore_id")
        record = await asyncio.to_thread(self._coordinator.catalog.get_table_restore, restore_id)
        return table_restore_message(record)

    @unary
    async def ListTableRestores(
        self, request: pb.ListTableRestoresRequest, context: Context
    ) -> pb.ListTableRestoresResponse:
        records = await asyncio.to_thread(
            self._coordinator.catalog.list_table_restores,
            request.cluster or None,
            limit=request.limit or DEFAULT_RESTORE_LIMIT,
        )
        return pb.ListTableRestoresResponse(
            table_restores=[table_restore_message(r) for r in records]
        )

    # -- exports to S3 (ringsnap.coordinator.export) --

    @unary
    async def StartExport(
        self, request: pb.StartExportRequest, context: Context
    ) -> types_pb2.Operation:
        requested_by = access.attributed(_printable(request.requested_by or "api", "requested_by"))
        operation = await start_export(
            self._coordinator.config,
            self._coordinator.catalog,
            self._coordinator.operations,
            self._coordinator.scheduler.guard,
            _backup_id(request.backup_id),
            tuple(request.nodes),
            request.parallel_nodes,
            requested_by,
        )
        return self._operation(operation)

    @unary
    async def GetExport(self, request: pb.GetExportRequest, context: Context) -> pb.Export:
        record = await asyncio.to_thread(
            self._coordinator.catalog.get_export, _backup_id(request.backup_id)
        )
        return export_message(record)

    @unary
    async def ListExports(
        self, request: pb.ListExportsRequest, context: Context
    ) -> pb.ListExportsResponse:
        records = await asyncio.to_thread(
            self._coordinator.catalog.list_exports,
            request.cluster or None,
            limit=request.limit or DEFAULT_RESTORE_LIMIT,
        )
        return pb.ListExportsResponse(exports=[export_message(r) for r in records])

    @unary
    async def AbortRestore(
        self, request: pb.AbortRestoreRequest, context: Context
    ) -> types_pb2.Operation:
        requested_by = access.attributed(_printable(request.requested_by or "api", "requested_by"))
        operation = await start_abort(
            self._coordinator.config,
            self._coordinator.catalog,
            self._coordinator.operations,
            self._coordinator.scheduler.guard,
            _restore_id(request.restore_id),
            request.confirm_cluster,
            requested_by,
        )
        return self._operation(operation)

    @unary
    async def PlanPurge(
        self, request: pb.PurgeExportsRequest, context: Context
    ) -> pb.PurgeExportsResponse:
        c = self._coordinator
        return await purge_through_daemon(
            c.config, c.catalog, c.operations, c.scheduler.guard, request, dry_run=True
        )

    @unary
    async def PurgeExports(
        self, request: pb.PurgeExportsRequest, context: Context
    ) -> pb.PurgeExportsResponse:
        requested_by = access.attributed(_printable(request.requested_by or "api", "requested_by"))
        c = self._coordinator
        return await purge_through_daemon(
            c.config,
            c.catalog,
            c.operations,
            c.scheduler.guard,
            request,
            dry_run=False,
            requested_by=requested_by,
        )

    @unary
    async def PlanTableRestore(
        self, request: pb.PlanTableRestoreRequest, context: Context
    ) -> pb.TableRestorePlan:
        plan, document = await self._coordinator.plan_table_restore(
            table_restore_api.request_of(request, "")
        )
        return table_restore_api.plan_message(plan.record, plan.refusals, document)

    @unary
    async def StartTableRestore(
        self, request: pb.StartTableRestoreRequest, context: Context
    ) -> types_pb2.Operation:
        requested_by = access.attributed(_printable(request.requested_by or "api", "requested_by"))
        operation = await self._coordinator.start_table_restore(
            table_restore_api.start_of(request, requested_by)
        )
        log.info(
            "table restore requested",
            backup_id=request.backup_id,
            resume_id=request.resume_id,
            abort_id=request.abort_id,
            requested_by=requested_by,
            operation_id=operation.current.operation_id,
        )
        return self._operation(operation)

    @unary
    async def PlanRetention(
        self, request: pb.PlanRetentionRequest, context: Context
    ) -> pb.PlanRetentionResponse:
        cluster = _required(request.cluster, "cluster")
        policy = _required(request.policy, "policy")
        if request.apply:
            self._coordinator.restores.refuse_while_restoring(cluster)
            log.info("retention apply requested", cluster=cluster, policy=policy)
            plan = await self._coordinator.apply_retention(cluster, policy)
        else:
            plan = await self._coordinator.plan_retention(cluster, policy)
        return messages.retention_plan(plan, applied=request.apply)

    @unary
    async def GetStatus(self, request: pb.GetStatusRequest, context: Context) -> pb.Status:
        return messages.status(await control.coordinator_status(self._coordinator))


# -- access ----------------------------------------------------------------------------------------


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
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
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


# -- the server ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RemoteListener:
    """The mutual-TLS listener for operators on other hosts: address, PEMs and allow-list."""

    listen: str
    cert: bytes
    key: bytes
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
