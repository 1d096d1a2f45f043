"""The servicer's error table: status codes out (one table for every error). Durations: test_wire."""

from __future__ import annotations

import grpc
import pytest

from ringsnap.agent import errors
from ringsnap.agent.server import STATUS_FOR_ERROR, status_for
from ringsnap.errors import ValidationError


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (ValidationError("x"), grpc.StatusCode.INVALID_ARGUMENT),
        (errors.NotFound("x"), grpc.StatusCode.NOT_FOUND),
        (errors.AlreadyExists("x"), grpc.StatusCode.ALREADY_EXISTS),
        (errors.Conflict("x"), grpc.StatusCode.FAILED_PRECONDITION),
        (errors.CommandTimeout("x"), grpc.StatusCode.DEADLINE_EXCEEDED),
        (errors.CommandFailed("x"), grpc.StatusCode.UNAVAILABLE),
        (errors.FreezeFailed("x"), grpc.StatusCode.INTERNAL),
        (KeyError("x"), None),
    ],
)
def test_each_domain_error_has_one_status(error: Exception, code: grpc.StatusCode | None) -> None:
    assert status_for(error) == code


def test_every_agent_error_class_is_mapped() -> None:
    mapped = {kind for kind, _ in STATUS_FOR_ERROR}
    for kind in errors.AgentError.__subclasses__():
        assert kind in mapped, f"{kind.__name__} has no status code"
