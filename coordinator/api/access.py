"""Who may call the coordinator API, and the record of who changed what.

Two ways in: the `ringsnap` CLI on the coordinator's own host (loopback, with the API token that
only root and the coordinator's group can read), and operators on other hosts (a bastion) over
mutual TLS, each client certificate identity allow-listed with one role:

- `viewer`: reads (list, show, status, operations) and plans (restore, drill and retention plans);
- `operator`: everything, including what changes clusters or the catalog (backup, restore, drill,
  delete, retention applied).

A method's role comes from its name: reads and plans are `Get*`, `List*`, `Watch*` and `Plan*`
(except a retention plan with `apply` set); every other method needs `operator`, so a method added
later is an operator's until it is named as a read. Every call that needs `operator` is logged with
its caller, and a remote caller's identity is what restores and drills record as requested by.
"""

from __future__ import annotations

import contextvars
import enum
from collections.abc import Mapping
from typing import Any

import grpc
import grpc.aio

from ringsnap import logs
from ringsnap.grpcauth import CheckingInterceptor, Context, client_identities

log = logs.get_logger(__name__)

HEALTH_PREFIX = "/grpc.health.v1.Health/"
_READ_PREFIXES = ("Get", "List", "Watch", "Plan")

#: The certificate identity of the remote caller of the current call (unset for local calls).
remote_caller: contextvars.ContextVar[str] = contextvars.ContextVar("remote_caller")


class Role(enum.StrEnum):
    VIEWER = "viewer"
    OPERATOR = "operator"

    def allows(self, needed: Role) -> bool:
        return self is Role.OPERATOR or needed is Role.VIEWER


def required_role(method: str, request: Any) -> Role:
    """The role `method` ("/package.Service/Name") needs for `request`."""
    if method.startswith(HEALTH_PREFIX):
        return Role.VIEWER
    name = method.rpartition("/")[2]
    if name == "PlanRetention" and getattr(request, "apply", False):
        return Role.OPERATOR
    return Role.VIEWER if name.startswith(_READ_PREFIXES) else Role.OPERATOR


def log_call(method: str, request: Any, caller: str) -> None:
    """Every call that needs `operator` leaves a line naming its caller."""
    if required_role(method, request) is Role.OPERATOR:
        log.info("api call", method=method.rpartition("/")[2], caller=caller)


def attributed(claimed: str) -> str:
    """Who a record names as its requester: a remote caller's certificate identity (it cannot
    claim another name), else what the local CLI said (its operator's login)."""
    identity = remote_caller.get("")
    return f"{identity} (remote)" if identity else claimed


class RemoteAccessInterceptor(CheckingInterceptor):
    """The remote listener's gate: an allow-listed certificate identity with the method's role."""

    def __init__(self, clients: Mapping[str, Role]) -> None:
        self._clients = dict(clients)

    def _role_of(self, names: list[str]) -> tuple[str, Role] | None:
        """The caller's allow-listed identity with the strongest role among its names."""
        listed = [(name, self._clients[name]) for name in names if name in self._clients]
        listed.sort(key=lambda item: item[1] is not Role.OPERATOR)
        return listed[0] if listed else None

    async def check(self, context: Context, method: str, request: Any) -> None:
        security, names = client_identities(context)
        if security != "ssl" or not names:
            log.warning("refused: no client certificate identity", method=method)
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "a client certificate with a subject common name or alternative name is required",
            )
        found = self._role_of(names)
        if found is None:
            log.warning("refused: client not allowed", method=method, identities=names)
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"client identity {', '.join(names)} is not allowed on this coordinator; add it"
                " to [[coordinator.remote.clients]] with a role",
            )
            return
        identity, role = found
        needed = required_role(method, request)
        if not role.allows(needed):
            log.warning("refused: missing role", method=method, caller=identity, role=role.value)
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"{identity} has the role {role.value}; {method.rpartition('/')[2]} needs"
                f" {needed.value}",
            )
        remote_caller.set(identity)
        log_call(method, request, identity)
