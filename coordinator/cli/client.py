"""The CLI's side of the coordinator API: where the daemon is, the token, calls, and what a failed
call means for the operator (message, hint, exit code).

The address and the token come from the coordinator's own configuration file: only its
`[coordinator]` table is read, so the CLI needs neither the TLS key nor the array secrets.
"""

from __future__ import annotations

import enum
import os
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, TypeVar

import grpc
from google.rpc import error_details_pb2  # type: ignore[import-untyped]
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status
from pydantic import Field

from ringsnap.api.v1 import coordinator_pb2 as pb
from ringsnap.api.v1 import coordinator_pb2_grpc, types_pb2
from ringsnap.config import TlsFiles, validate
from ringsnap.coordinator.api.token import TOKEN_FILE_ENV, TokenMissingError, read_token, token_path
from ringsnap.coordinator.config import DEFAULT_CONFIG_PATH, CoordinatorSection
from ringsnap.errors import ConfigError, RingsnapError

DEFAULT_ADDRESS = CoordinatorSection().listen
ADDRESS_ENV = "RINGSNAP_COORDINATOR"
#: A remote client file (address, client certificate, key, CA) for operators on other hosts.
REMOTE_ENV = "RINGSNAP_REMOTE"
#: The coordinator config the CLI reads when --config is not given (`ringsnap sandbox up` prints
#: the `export` line for its own).
CONFIG_ENV = "RINGSNAP_CONFIG"
ERROR_DOMAIN = "ringsnap.coordinator"
#: Unary calls; a retention apply deletes array snapshots and may take longer.
CALL_TIMEOUT = 60.0
LONG_CALL_TIMEOUT = 1800.0

T = TypeVar("T")


class ExitCode(enum.IntEnum):
    """What `ringsnap` returns; documented in `ringsnap --help` and the README."""

    OK = 0
    #: An internal error in the coordinator or the CLI (the message says where the details are).
    ERROR = 1
    #: Bad arguments, unknown cluster or policy, unusable --config, API token unreadable or
    #: refused, confirmation needed but no terminal (pass --yes).
    USAGE = 2
    #: Nothing was changed: the backup was refused by its plan (unreachable node or array), the
    #: cluster is busy, the backup is still running, or the confirmation was declined.
    REFUSED = 3
    #: The backup (or deletion) ran and failed; nodes were thawed, nothing was recorded as complete.
    FAILED = 4
    #: The backup is recorded as partial: some nodes were left out, each with its reason.
    PARTIAL = 5
    #: The restore ran to its end but the proof failed for at least one node (see its report).
    NOT_PROVEN = 6
    #: No such backup or operation.
    NOT_FOUND = 66
    #: The coordinator cannot be reached (not running, or another address), or it took a call
    #: and did not answer in time (what was asked may still be running there).
    UNREACHABLE = 69
    #: Interrupted (Ctrl-C) while following an operation; the operation goes on in the coordinator.
    INTERRUPTED = 130


EXIT_CODE_TABLE = (
    (ExitCode.OK, "success"),
    (ExitCode.ERROR, "internal error in the coordinator or the CLI (see the coordinator's log)"),
    (
        ExitCode.USAGE,
        "usage or configuration: bad arguments, unknown cluster or policy, unreadable --config or"
        " API token, confirmation needed without a terminal (pass --yes)",
    ),
    (
        ExitCode.REFUSED,
        "refused, nothing changed: the backup's plan found an unreachable node or array, the"
        " cluster is busy, the backup is still running, or you declined the confirmation",
    ),
    (
        ExitCode.FAILED,
        "the backup or deletion ran and failed (nodes thawed; nothing recorded); a restore"
        " stopped at a failed step (the report says what each node was left in and what to do)",
    ),
    (ExitCode.PARTIAL, "partial backup: recorded, but some nodes were left out (each says why)"),
    (
        ExitCode.NOT_PROVEN,
        "restore: every step ran but the proof failed for at least one node (the report names it)",
    ),
    (ExitCode.NOT_FOUND, "no such backup or operation"),
    (
        ExitCode.UNREACHABLE,
        "the coordinator is not reachable (is ringsnap-coordinator running?), or did not answer in"
        " time: what was asked may still be running there (see ringsnap status before asking"
        " again)",
    ),
    (ExitCode.INTERRUPTED, "interrupted; an operation already started goes on in the coordinator"),
)

#: Reason words of the server's ErrorInfo (and of a failed operation's error_reason).
REASON_EXIT_CODES: dict[str, ExitCode] = {
    "INVALID_ARGUMENT": ExitCode.USAGE,
    "INVALID_PAGE_TOKEN": ExitCode.USAGE,
    "AGENT_INVALID_ARGUMENT": ExitCode.USAGE,
    "UNKNOWN_CLUSTER": ExitCode.USAGE,
    "UNKNOWN_POLICY": ExitCode.USAGE,
    "NOT_SUPPORTED": ExitCode.USAGE,
    "BACKUP_NOT_FOUND": ExitCode.NOT_FOUND,
    "OPERATION_NOT_FOUND": ExitCode.NOT_FOUND,
    "RESTORE_NOT_FOUND": ExitCode.NOT_FOUND,
    "AGENT_NOT_FOUND": ExitCode.NOT_FOUND,
    "CLUSTER_BUSY": ExitCode.REFUSED,
    "BACKUP_REFUSED": ExitCode.REFUSED,
    "BACKUP_STATE": ExitCode.REFUSED,
    "CATALOG_REFUSED": ExitCode.REFUSED,
    "CATALOG_LOCKED": ExitCode.REFUSED,
    "FAILED_PRECONDITION": ExitCode.REFUSED,
    "RESTORE_REFUSED": ExitCode.REFUSED,
    "RESTORE_NOT_CONFIRMED": ExitCode.REFUSED,
    "AGENT_REFUSED": ExitCode.REFUSED,
    "BACKUP_FAILED": ExitCode.FAILED,
    "AGENT_FAILED": ExitCode.FAILED,
    "CANARY_FAILED": ExitCode.FAILED,
    "ARRAY_FAILED": ExitCode.FAILED,
    "RESTORE_FAILED": ExitCode.FAILED,
    "INTERNAL": ExitCode.ERROR,
}

_CODE_EXIT_CODES: dict[grpc.StatusCode, ExitCode] = {
    grpc.StatusCode.INVALID_ARGUMENT: ExitCode.USAGE,
    grpc.StatusCode.UNIMPLEMENTED: ExitCode.USAGE,
    grpc.StatusCode.NOT_FOUND: ExitCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION: ExitCode.REFUSED,
    grpc.StatusCode.ABORTED: ExitCode.REFUSED,
    grpc.StatusCode.UNAVAILABLE: ExitCode.FAILED,
}

START_HINT = (
    "start it with `systemctl start ringsnap-coordinator` (or `ringsnap-coordinator serve --config"
    " /etc/ringsnap/coordinator.toml`), see why it stopped with `journalctl -u"
    " ringsnap-coordinator`, or point --coordinator/--config at the right one"
)


class CliError(RingsnapError):
    """What failed, what to do, and the exit code."""

    def __init__(
        self, message: str, exit_code: ExitCode, *, reason: str = "", hint: str = ""
    ) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.reason = reason
        self.hint = hint


@dataclass(frozen=True)
class RemoteTls:
    """The client certificate, key and CA of an operator calling from another host."""

    cert: bytes
    key: bytes = field(repr=False)  # never in a log or an error
    ca: bytes
    #: Check the coordinator's certificate against this name instead of the address's host.
    server_name: str | None = None


@dataclass(frozen=True)
class Target:
    address: str
    token_file: Path
    #: Where the address came from, for messages.
    source: str
    #: Set for the coordinator's remote (mutual TLS) listener; None for loopback with the token.
    tls: RemoteTls | None = None
    #: The token of a coordinator this process hosts for one command (`cli.hosted`): made for
    #: that run, held in memory, never written; None to read `token_file`.
    token: str | None = field(default=None, repr=False)

    @property
    def hosted(self) -> bool:
        """Whether this process hosts the coordinator it calls (no daemon answered): the run
        then ends with this process, and Ctrl-C interrupts it rather than stops following it."""
        return self.token is not None


class RemoteClientFile(TlsFiles):
    """`$RINGSNAP_REMOTE`: how an operator's host reaches a coordinator's `[remote]` listener."""

    address: Annotated[str, Field(min_length=3, pattern=r"^\S+:[0-9]{1,5}$")]
    server_name: str | None = Field(default=None, min_length=1)


def remote_target(path: Path, origin: str) -> Target:
    """The coordinator named by a remote client file (address, client certificate, key, CA)."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        remote = validate(data, RemoteClientFile, source=str(path))
        tls = RemoteTls(
            cert=Path(remote.cert_file).read_bytes(),
            key=remote.key_file.get_secret_value().encode(),
            ca=Path(remote.ca_file).read_bytes(),
            server_name=remote.server_name,
        )
    except ConfigError as exc:
        raise CliError(f"{exc} (from {origin})", ExitCode.USAGE) from None
    except FileNotFoundError:
        raise CliError(f"{path} (from {origin}): file not found", ExitCode.USAGE) from None
    except OSError as exc:
        raise CliError(
            f"{path} (from {origin}): cannot read: {exc.strerror}", ExitCode.USAGE
        ) from None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise CliError(f"{path} (from {origin}): not valid TOML: {exc}", ExitCode.USAGE) from None
    return Target(remote.address, Path(), f"{path} (from {origin})", tls)


def _coordinator_table(path: Path) -> CoordinatorSection:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            str(path), None, "file not found; pass the coordinator's --config"
        ) from None
    except OSError as exc:
        raise ConfigError(str(path), None, f"cannot read: {exc.strerror}") from None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(str(path), None, f"not valid TOML: {exc}") from None
    table = data.get("coordinator", {})
    if not isinstance(table, dict):
        raise ConfigError(str(path), "coordinator", "must be a table")
    try:
        return validate(table, CoordinatorSection, source=str(path))
    except ConfigError as exc:
        raise ConfigError(
            exc.file, f"coordinator.{exc.key}" if exc.key else None, exc.problem
        ) from None


def discover_config(config: Path | None) -> tuple[Path | None, str]:
    """The coordinator config the CLI reads, and where that choice came from: --config, else
    $RINGSNAP_CONFIG, else /etc/ringsnap/coordinator.toml if it exists, else none."""
    if config is not None:
        return config, "--config"
    if os.environ.get(CONFIG_ENV):
        return Path(os.environ[CONFIG_ENV]), f"${CONFIG_ENV}"
    if DEFAULT_CONFIG_PATH.is_file():
        return DEFAULT_CONFIG_PATH, "the default config"
    return None, ""


def resolve_target(config: Path | None, coordinator: str | None) -> Target:
    """The coordinator to call: --coordinator, else $RINGSNAP_COORDINATOR, else the `listen` of
    the config (`discover_config`: --config, $RINGSNAP_CONFIG, /etc/ringsnap/coordinator.toml if
    it exists), else 127.0.0.1:7444. The API token is found next to that config's catalog.

    With $RINGSNAP_REMOTE (an operator on another host), the coordinator's remote listener named
    by that file instead, over mutual TLS with the operator's certificate."""
    if os.environ.get(REMOTE_ENV) and not coordinator:
        return remote_target(Path(os.environ[REMOTE_ENV]), f"${REMOTE_ENV}")
    section = CoordinatorSection()
    source = "the default address"
    path, origin = discover_config(config)
    if path is not None:
        try:
            section = _coordinator_table(path)
        except ConfigError as exc:
            named = f" (from ${CONFIG_ENV})" if origin == f"${CONFIG_ENV}" else ""
            raise CliError(f"{exc}{named}", ExitCode.USAGE) from None
        via = f", from ${CONFIG_ENV}" if origin == f"${CONFIG_ENV}" else ""
        source = f"{path} (coordinator.listen{via})"
    address = section.listen
    if coordinator:
        address, source = coordinator, "--coordinator"
    elif os.environ.get(ADDRESS_ENV):
        address, source = os.environ[ADDRESS_ENV], f"${ADDRESS_ENV}"
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise CliError(
            f"coordinator address {address!r} (from {source}) is not HOST:PORT",
            ExitCode.USAGE,
            hint="e.g. --coordinator 127.0.0.1:7444",
        )
    token_file = Path(os.environ.get(TOKEN_FILE_ENV) or token_path(section.catalog))
    return Target(address, token_file, source)


def open_channel(target: Target) -> grpc.Channel:
    """A channel to `target`: mutual TLS for a remote listener, else loopback with the token."""
    if target.tls is not None:
        tls = target.tls
        options = [("grpc.ssl_target_name_override", tls.server_name)] if tls.server_name else []
        credentials = grpc.ssl_channel_credentials(
            root_certificates=tls.ca, private_key=tls.key, certificate_chain=tls.cert
        )
        return grpc.secure_channel(target.address, credentials, options=options)
    token = target.token if target.token is not None else _token(target)
    local = grpc.composite_channel_credentials(
        grpc.local_channel_credentials(grpc.LocalConnectionType.LOCAL_TCP),
        grpc.access_token_call_credentials(token),
    )
    return grpc.secure_channel(target.address, local)


def _reason(error: grpc.RpcError) -> str:
    call: Any = error
    try:
        status = rpc_status.from_call(call)
    except ValueError:
        return ""
    if status is None:
        return ""
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Is(info.DESCRIPTOR) and detail.Unpack(info) and info.domain == ERROR_DOMAIN:
            return str(info.reason)
    return ""


def reason_exit_code(reason: str, fallback: ExitCode = ExitCode.ERROR) -> ExitCode:
    return REASON_EXIT_CODES.get(reason, fallback)


class Coordinator:
    """Blocking calls to one coordinator; every failure becomes a CliError."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self._channel = open_channel(target)
        self.stub = coordinator_pb2_grpc.CoordinatorServiceStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Coordinator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, method: Callable[..., T], request: Any, timeout: float = CALL_TIMEOUT) -> T:
        try:
            return method(request, timeout=timeout)
        except grpc.RpcError as error:
            call: Any = error
            if call.code() is grpc.StatusCode.DEADLINE_EXCEEDED and not _reason(error):
                raise self._no_answer(timeout) from None
            raise self.translate(error) from None

    def _no_answer(self, timeout: float) -> CliError:
        """Connected, asked, and no answer in time: unlike an unreachable daemon, what was asked
        (a purge, a backup) may still be running there, and asking again may repeat it."""
        return CliError(
            f"the coordinator at {self.target.address} did not answer within {timeout:g} s; what"
            " was asked may still be running there",
            ExitCode.UNREACHABLE,
            reason="UNREACHABLE",
            hint="`ringsnap status` shows what the coordinator runs: wait for it to end before"
            " asking again",
        )

    def stream(self, method: Callable[..., Any], request: Any) -> Iterator[Any]:
        try:
            yield from method(request)
        except grpc.RpcError as error:
            raise self.translate(error) from None

    def translate(self, error: grpc.RpcError) -> CliError:
        call: Any = error
        code: grpc.StatusCode = call.code()
        details = call.details() or code.name
        reason = _reason(error)
        if reason:
            return CliError(details, reason_exit_code(reason), reason=reason)
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return CliError(
                f"cannot reach the coordinator at {self.target.address} (from"
                f" {self.target.source}): {details}",
                ExitCode.UNREACHABLE,
                reason="UNREACHABLE",
                hint=START_HINT,
            )
        if self.target.tls is not None and code in (
            grpc.StatusCode.UNAUTHENTICATED,
            grpc.StatusCode.PERMISSION_DENIED,
        ):
            return CliError(
                f"the coordinator at {self.target.address} refused this client: {details}",
                ExitCode.USAGE,
                reason=code.name,
                hint=f"the client certificate comes from {self.target.source}; the coordinator's"
                " [remote] clients list gives each identity its role",
            )
        if code is grpc.StatusCode.UNAUTHENTICATED:
            return CliError(
                f"the coordinator at {self.target.address} refused the API token read from"
                f" {self.target.token_file}: {details}",
                ExitCode.USAGE,
                reason="UNAUTHENTICATED",
                hint="the token changes at every coordinator start; pass the --config the"
                " coordinator runs with",
            )
        return CliError(details, _CODE_EXIT_CODES.get(code, ExitCode.ERROR), reason=code.name)

    # -- the calls -----------------------------------------------------------------------------

    def start_backup(self, cluster: str, trigger: str, policy: str) -> types_pb2.Operation:
        request = pb.StartBackupRequest(cluster=cluster, trigger=trigger, policy=policy)
        return self.call(self.stub.StartBackup, request)

    def watch(self, operation_id: str) -> Iterator[types_pb2.Operation]:
        request = pb.WatchOperationRequest(operation_id=operation_id)
        return self.stream(self.stub.WatchOperation, request)

    def get_backup(self, backup_id: str) -> pb.Backup:
        return self.call(self.stub.GetBackup, pb.GetBackupRequest(backup_id=backup_id))

    def list_backups(self, cluster: str, page_size: int, page_token: str) -> pb.ListBackupsResponse:
        request = pb.ListBackupsRequest(
            cluster=cluster,
            page_size=page_size,
            page_token=page_token,
            view=pb.BACKUP_VIEW_BASIC,
        )
        return self.call(self.stub.ListBackups, request)

    def delete_backup(self, backup_id: str, reason: str) -> types_pb2.Operation:
        request = pb.DeleteBackupRequest(backup_id=backup_id, reason=reason)
        return self.call(self.stub.DeleteBackup, request)

    def status(self) -> pb.Status:
        return self.call(self.stub.GetStatus, pb.GetStatusRequest())

    def plan_retention(self, cluster: str, policy: str, *, apply: bool) -> pb.PlanRetentionResponse:
        request = pb.PlanRetentionRequest(cluster=cluster, policy=policy, apply=apply)
        return self.call(
            self.stub.PlanRetention, request, LONG_CALL_TIMEOUT if apply else CALL_TIMEOUT
        )


def _token(target: Target) -> str:
    try:
        return read_token(target.token_file)
    except TokenMissingError as exc:
        if not _answers(target.address):
            raise CliError(
                f"the coordinator is not running at {target.address} (from {target.source}):"
                f" nothing answers there, and {exc}",
                ExitCode.UNREACHABLE,
                reason="UNREACHABLE",
                hint=START_HINT,
            ) from None
        raise CliError(
            f"a coordinator answers at {target.address} (from {target.source}), but {exc}",
            ExitCode.USAGE,
            reason="TOKEN_UNREADABLE",
            hint="pass the --config that coordinator runs with (its catalog directory holds the"
            f" token), or set ${TOKEN_FILE_ENV}",
        ) from None
    except RingsnapError as exc:
        raise CliError(str(exc), ExitCode.USAGE, reason="TOKEN_UNREADABLE") from None


def answers(target: Target, timeout: float = 3.0) -> bool:
    """Whether a coordinator's health service answers at `target` (no token needed)."""
    if target.tls is None:
        return _answers(target.address, timeout)
    with open_channel(target) as channel:
        return _healthy(channel, timeout)


def _answers(address: str, timeout: float = 3.0) -> bool:
    """Whether the health service answers at `address` (it needs no token)."""
    credentials = grpc.local_channel_credentials(grpc.LocalConnectionType.LOCAL_TCP)
    with grpc.secure_channel(address, credentials) as channel:
        return _healthy(channel, timeout)


def _healthy(channel: grpc.Channel, timeout: float) -> bool:
    try:
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout)
    except grpc.RpcError:
        return False
    return True
