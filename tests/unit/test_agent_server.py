"""The servicer's translations: durations in, status codes out (one table for every error)."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import duration_pb2

from ringsnap.agent import errors
from ringsnap.agent.server import STATUS_FOR_ERROR, duration, seconds_of, status_for, timestamp
from ringsnap.errors import ValidationError


def test_durations_both_ways() -> None:
    assert seconds_of(duration_pb2.Duration(seconds=1, nanos=500_000_000), "lease") == 1.5
    assert seconds_of(duration_pb2.Duration(seconds=-1, nanos=-500_000_000), "lease") == -1.5
    assert duration(0.25).ToNanoseconds() == 250_000_000
    assert timestamp(1_700_000_000.5).ToNanoseconds() == 1_700_000_000_500_000_000


@pytest.mark.parametrize(("seconds", "nanos"), [(1, -1), (-1, 1), (0, 1_000_000_000)])
def test_malformed_durations_are_invalid(seconds: int, nanos: int) -> None:
    with pytest.raises(ValidationError, match="lease: malformed"):
        seconds_of(duration_pb2.Duration(seconds=seconds, nanos=nanos), "lease")


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
