"""The coordinator's gRPC service: messages to `Coordinator` calls and back, nothing more.

Domain errors become status codes and reason words in one place (`api_errors`); the listeners, who
may call, and the health service are `api_server`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TypeVar

from ringsnap import names
from ringsnap.api.v1 import coordinator_pb2 as pb
from ringsnap.api.v1 import coordinator_pb2_grpc, types_pb2
from ringsnap.coordinator.api import access, control, messages
from ringsnap.coordinator.api import table_restore_messages as table_restore_api
from ringsnap.coordinator.api.drill_messages import drill_id_of, drill_message, drill_request
from ringsnap.coordinator.api.errors import STATUSES, error_reason, unary
from ringsnap.coordinator.api.export_listing import off_array_copies
from ringsnap.coordinator.api.export_messages import export_message, purge_min_age, purge_response
from ringsnap.coordinator.api.table_restore_messages import table_restore_message
from ringsnap.coordinator.export.daemon import start_export
from ringsnap.coordinator.export.purge_daemon import purge_through_daemon
from ringsnap.coordinator.model import RestoreMode
from ringsnap.coordinator.operations import Operation
from ringsnap.coordinator.restore.abort import start_abort
from ringsnap.coordinator.restore.plan import RestoreRequest
from ringsnap.coordinator.restore.s3_keys import restore_keys_of
from ringsnap.coordinator.scheduler import BackupRequest
from ringsnap.coordinator.service import Coordinator
from ringsnap.errors import ValidationError
from ringsnap.logs import get_logger
from ringsnap.rpcerrors import Context

log = get_logger(__name__)

_Record = TypeVar("_Record")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["CoordinatorService"].full_name
#: ListBackups in the FULL view: at most this many backups a page (each holds its whole ring).
FULL_VIEW_PAGE_SIZE = 20
#: ListRestores without a limit.
DEFAULT_RESTORE_LIMIT = 50
_MAX_TRIGGER = 200


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


async def _newest(
    lister: Callable[..., list[_Record]], cluster: str, limit: int, **filters: object
) -> list[_Record]:
    """A catalog listing, newest first: one cluster's or every cluster's (""), at most `limit`
    records (0: the default)."""
    return await asyncio.to_thread(
        lister, cluster or None, limit=limit or DEFAULT_RESTORE_LIMIT, **filters
    )


def _requested_by(value: str) -> str:
    """Who asked, as the audit records it: the request's words (or "api") and the caller."""
    return access.attributed(_printable(value or "api", "requested_by"))


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
    *,
    age_keys: Sequence[str] = (),
) -> RestoreRequest:
    if mode not in _RESTORE_MODES:
        raise ValidationError(f"unknown restore mode {mode}")
    return RestoreRequest(
        backup_id=_backup_id(backup_id),
        nodes=tuple(_printable(_required(n, "nodes[]"), "nodes[]") for n in nodes),
        mode=_RESTORE_MODES[mode],
        force=force,
        requested_by=requested_by,
        keys=restore_keys_of(age_keys),
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
        # Closed with this handler: grpc.aio only cancels a left caller's task, and a watch left
        # open would be fed until the garbage collector finalizes it.
        async with contextlib.aclosing(operation.watch()) as watch:
            async for snapshot in watch:
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
        self._coordinator.refuse_while_exported(backup_id)
        operation = await control.start_delete(self._coordinator, backup_id, reason)
        return self._operation(operation)

    @unary
    async def PlanRestore(self, request: pb.PlanRestoreRequest, context: Context) -> pb.RestorePlan:
        restore = _restore_request(
            request.backup_id,
            request.nodes,
            request.mode,
            request.force,
            "",
            age_keys=request.age_keys,
        )
        plan = await self._coordinator.restores.plan_restore(restore)
        return messages.restore_plan(plan)

    @unary
    async def StartRestore(
        self, request: pb.StartRestoreRequest, context: Context
    ) -> types_pb2.Operation:
        requested_by = _requested_by(request.requested_by)
        confirm = _printable(request.confirm_cluster, "confirm_cluster")
        if request.resume_id:
            operation = await self._coordinator.restores.resume_restore(
                _restore_id(request.resume_id, "resume_id"),
                confirm_cluster=confirm,
                requested_by=requested_by,
                keys=restore_keys_of(request.age_keys),
            )
        else:
            operation = await self._coordinator.restores.start_restore(
                _restore_request(
                    request.backup_id,
                    request.nodes,
                    request.mode,
                    request.force,
                    requested_by,
                    age_keys=request.age_keys,
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
        records = await _newest(
            self._coordinator.catalog.list_restores, request.cluster, request.limit
        )
        return pb.ListRestoresResponse(restores=[messages.restore(r) for r in records])

    @unary
    async def StartDrill(
        self, request: pb.StartRestoreDrillRequest, context: Context
    ) -> types_pb2.Operation:
        requested_by = _requested_by(request.requested_by)
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
        records = await _newest(
            self._coordinator.catalog.list_drills,
            request.cluster,
            request.limit,
            backup_id=request.backup_id or None,
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
        records = await _newest(
            self._coordinator.catalog.list_table_restores, request.cluster, request.limit
        )
        return pb.ListTableRestoresResponse(
            table_restores=[table_restore_message(r) for r in records]
        )

    # -- exports to S3 (ringsnap.coordinator.export) --

    @unary
    async def StartExport(
        self, request: pb.StartExportRequest, context: Context
    ) -> types_pb2.Operation:
        requested_by = _requested_by(request.requested_by)
        operation = await start_export(
            self._coordinator.config,
            self._coordinator.catalog,
            self._coordinator.operations,
            self._coordinator.leases,
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
        records = await _newest(
            self._coordinator.catalog.list_exports, request.cluster, request.limit
        )
        return pb.ListExportsResponse(exports=[export_message(r) for r in records])

    @unary
    async def AbortRestore(
        self, request: pb.AbortRestoreRequest, context: Context
    ) -> types_pb2.Operation:
        requested_by = _requested_by(request.requested_by)
        operation = await start_abort(
            self._coordinator.config,
            self._coordinator.catalog,
            self._coordinator.operations,
            self._coordinator.leases,
            _restore_id(request.restore_id),
            request.confirm_cluster,
            requested_by,
        )
        return self._operation(operation)

    @unary
    async def PlanPurge(
        self, request: pb.PurgeExportsRequest, context: Context
    ) -> pb.PurgeExportsResponse:
        return await self._purge(request, dry_run=True)

    @unary
    async def PurgeExports(
        self, request: pb.PurgeExportsRequest, context: Context
    ) -> pb.PurgeExportsResponse:
        return await self._purge(
            request, dry_run=False, requested_by=_requested_by(request.requested_by)
        )

    async def _purge(
        self, request: pb.PurgeExportsRequest, *, dry_run: bool, requested_by: str = "api"
    ) -> pb.PurgeExportsResponse:
        c = self._coordinator
        result, operation_id = await purge_through_daemon(
            c.config,
            c.catalog,
            c.operations,
            c.leases,
            request.cluster,
            min_age_seconds=purge_min_age(request),
            dry_run=dry_run,
            requested_by=requested_by,
        )
        return purge_response(result, operation_id)

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
        requested_by = _requested_by(request.requested_by)
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
