"""The coordinator API's errors: every domain error becomes a gRPC status and a stable reason word
in one table (`ERRORS`; an agent's own answer passes through by `AGENT_STATUSES`), sent in a
`google.rpc.ErrorInfo` of domain `ringsnap.coordinator` so that clients need not parse messages; an
operation that fails carries the same word in `error_reason`. Anything unexpected is INTERNAL and
logged with its traceback; the caller is told where to look, not the traceback."""

from __future__ import annotations

import grpc

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
from ringsnap.coordinator.drill.workflow import DrillRefused
from ringsnap.coordinator.export.model import ExportFailed, ExportRefused
from ringsnap.coordinator.operations import Operation
from ringsnap.coordinator.ports import AgentError
from ringsnap.coordinator.restore.daemon import RestoreNotConfirmed
from ringsnap.coordinator.restore.workflow import RestoreFailed, RestoreRefused
from ringsnap.coordinator.runs.lease import ClusterHeld
from ringsnap.coordinator.service import UnknownClusterError, UnknownPolicyError
from ringsnap.coordinator.table_restore.model import TableRestoreFailed, TableRestoreRefused
from ringsnap.errors import RingsnapError, ValidationError
from ringsnap.logs import get_logger
from ringsnap.plugins.errors import DriverError
from ringsnap.rpcerrors import ErrorStatuses

log = get_logger(__name__)

ERROR_DOMAIN = "ringsnap.coordinator"


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
    (ClusterHeld, grpc.StatusCode.ABORTED, "CLUSTER_BUSY"),
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
