"""Retention of the shipped commit log (moto's S3): segments completed before the oldest retained
backup began go with their pieces and hole records; open ones and those completed later stay."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import boto3
import pytest
from moto import mock_aws

from ringsnap.agent.pitr.keys import Piece, PitrKeys, list_segments
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.coordinator.pitr.retention import purge_shipped_log

S3 = S3Settings(bucket="retention-test", prefix="p/")
KEYS = PitrKeys(S3.prefix, "n1")


@pytest.fixture
def client() -> Iterator[Any]:
    with mock_aws():
        made = boto3.client("s3", region_name="us-east-1")
        made.create_bucket(Bucket=S3.bucket)
        yield made


def _segment(client: Any, name: str, *, complete: bool) -> None:
    for piece in (Piece(0, 10, 1), Piece(10, 20, 2)):
        client.put_object(Bucket=S3.bucket, Key=KEYS.piece(name, piece), Body=b"x" * 10)
    if complete:
        client.put_object(Bucket=S3.bucket, Key=KEYS.complete(name, 20), Body=b"")


def test_segments_completed_before_the_oldest_backup_go(client: Any) -> None:
    _segment(client, "CommitLog-7-1.log", complete=True)
    client.put_object(Bucket=S3.bucket, Key=KEYS.hole("CommitLog-7-1.log"), Body=b"{}")
    _segment(client, "CommitLog-7-2.log", complete=False)  # open when the backup began
    time.sleep(1.1)
    oldest_backup = datetime.now(UTC)
    time.sleep(1.1)
    _segment(client, "CommitLog-7-2.log", complete=True)
    _segment(client, "CommitLog-7-3.log", complete=False)
    other = PitrKeys(S3.prefix, "n2")
    client.put_object(Bucket=S3.bucket, Key=other.complete("CommitLog-7-1.log", 0), Body=b"")

    removed = purge_shipped_log(client, S3, ["n1"], oldest_backup)

    assert removed == 4  # two pieces, the marker, the hole record
    assert set(list_segments(client, S3.bucket, KEYS)) == {"CommitLog-7-2.log", "CommitLog-7-3.log"}
    listed = client.list_objects_v2(Bucket=S3.bucket, Prefix=KEYS.holes).get("Contents", [])
    assert listed == []
    assert list_segments(client, S3.bucket, other), "another node is not touched"
    assert purge_shipped_log(client, S3, ["n1"], oldest_backup) == 0
    _segment(client, "CommitLog-7-0.log", complete=True)  # no hole record: none counted
    time.sleep(1.1)
    # Segments 0 and 2 completed before this newer start (3 objects each); 3 is still open.
    assert purge_shipped_log(client, S3, ["n1"], datetime.now(UTC)) == 6
    assert set(list_segments(client, S3.bucket, KEYS)) == {"CommitLog-7-3.log"}
