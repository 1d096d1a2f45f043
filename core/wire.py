"""Durations and instants as protobuf well-known types (`google.protobuf.Duration`, `Timestamp`),
both ways: the one place the agent, the coordinator's agent client and its API messages convert.

`seconds_of` is for what a client sent (a malformed Duration is the caller's error); `seconds` and
`moment` are for what a server answered.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

from google.protobuf import duration_pb2, timestamp_pb2

from ringsnap.errors import ValidationError


def duration(seconds: float) -> duration_pb2.Duration:
    message = duration_pb2.Duration()
    message.FromNanoseconds(round(seconds * 1e9))
    return message


def seconds(message: duration_pb2.Duration) -> float:
    return message.ToNanoseconds() / 1e9


def seconds_of(message: duration_pb2.Duration, field: str) -> float:
    """A request's Duration as seconds; malformed ones (mixed signs, nanos out of range) are refused
    with a ValidationError naming `field`."""
    whole, nanos = message.seconds, message.nanos
    if not -999_999_999 <= nanos <= 999_999_999 or (whole > 0 > nanos) or (whole < 0 < nanos):
        raise ValidationError(f"{field}: malformed duration ({whole} s, {nanos} ns)")
    value = whole + nanos / 1e9
    if not math.isfinite(value):
        raise ValidationError(f"{field}: duration out of range")
    return value


def timestamp(moment: datetime) -> timestamp_pb2.Timestamp:
    message = timestamp_pb2.Timestamp()
    message.FromDatetime(moment.astimezone(UTC))
    return message


def unix_timestamp(unix_seconds: float) -> timestamp_pb2.Timestamp:
    """The Timestamp of seconds since the epoch (`time.time()`)."""
    return timestamp(datetime.fromtimestamp(unix_seconds, UTC))


def moment(message: timestamp_pb2.Timestamp) -> datetime:
    """A Timestamp as an aware datetime in UTC."""
    return message.ToDatetime(tzinfo=UTC)
