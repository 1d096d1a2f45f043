"""Typed errors of the agent's domain. The gRPC layer maps each kind to one status code, once.

`ringsnap.errors.ValidationError` (a bad name, path or value sent by a client) is the other error a
domain call raises on purpose; everything else is a bug or an operating-system failure.
"""

from __future__ import annotations

from ringsnap.errors import RingsnapError


class DomainError(RingsnapError):
    """Base of the errors a domain call raises for a reason the caller can act on.

    Not the coordinator's `ringsnap.coordinator.ports.AgentError`: that one is what a call to an
    agent came back with (one of these after the trip, or an agent nobody answers for)."""


class Conflict(DomainError):
    """The node is not in a state that allows the request (e.g. a filesystem frozen by another
    operation, an operation that already ended, a directory on a filesystem the agent never freezes)."""


class NotFound(DomainError):
    """The request names something that does not exist (an operation id, a keyspace, a snapshot)."""


class AlreadyExists(DomainError):
    """The request would create something that exists already (a native snapshot tag)."""


class CommandFailed(DomainError):
    """An external command (nodetool, the Cassandra stop/start command) failed; the message holds
    the command and the relevant part of its output."""


class CommandTimeout(DomainError):
    """An external command did not finish in time and was killed."""


class FreezeFailed(DomainError):
    """The kernel refused to freeze or thaw a filesystem for a reason other than its state."""
