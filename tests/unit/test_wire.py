"""Durations and instants on the wire (ringsnap.wire), as the agent, its client and the API use them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from google.protobuf import duration_pb2, timestamp_pb2

from ringsnap.errors import ValidationError
from ringsnap.wire import duration, moment, seconds, seconds_of, timestamp, unix_timestamp


def test_durations_both_ways() -> None:
    assert seconds_of(duration_pb2.Duration(seconds=1, nanos=500_000_000), "lease") == 1.5
    assert seconds_of(duration_pb2.Duration(seconds=-1, nanos=-500_000_000), "lease") == -1.5
    assert duration(0.25).ToNanoseconds() == 250_000_000
    assert unix_timestamp(1_700_000_000.5).ToNanoseconds() == 1_700_000_000_500_000_000


@pytest.mark.parametrize(("whole", "nanos"), [(1, -1), (-1, 1), (0, 1_000_000_000)])
def test_malformed_durations_are_invalid(whole: int, nanos: int) -> None:
    with pytest.raises(ValidationError, match="lease: malformed"):
        seconds_of(duration_pb2.Duration(seconds=whole, nanos=nanos), "lease")


def test_answers_read_back() -> None:
    assert seconds(duration(93.25)) == 93.25
    assert seconds(duration_pb2.Duration(seconds=2, nanos=500_000_000)) == 2.5
    at = datetime(2026, 3, 1, 12, 30, 15, 250_000, tzinfo=UTC)
    assert moment(timestamp(at)) == at and moment(timestamp(at)).tzinfo is UTC
    elsewhere = at.astimezone(timezone(timedelta(hours=2)))
    assert timestamp(elsewhere) == timestamp(at), "an instant, whatever its zone"
    assert moment(timestamp_pb2.Timestamp(seconds=1_700_000_000)) == datetime.fromtimestamp(
        1_700_000_000, UTC
    )
