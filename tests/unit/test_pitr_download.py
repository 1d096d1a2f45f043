"""`restore --to T --dry-run`'s download figure: the bytes of shipped commit log the placement will
fetch, said from the bucket before the backup's volume is back, and equal to what the placement
then fetches."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from ringsnap.agent.pitr import place as placing
from ringsnap.agent.pitr.archiving import archive_command
from ringsnap.agent.pitr.keys import MAX_SEQUENCE_STEP, list_segments
from ringsnap.agent.pitr.settings import PitrSettings
from ringsnap.agent.pitr.shipper import CommitlogShipper
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.coordinator.pitr.download import estimate_download
from tests.support.segments import FakeSegment

BUCKET = "pitr-download"
S3 = S3Settings(bucket=BUCKET, prefix="copies/")
#: More than the bucket's LastModified resolution (a second) between the events compared.
APART = 1.2


@pytest.fixture
def client() -> Iterator[Any]:
    with mock_aws():
        made = boto3.client("s3", region_name="us-east-1")
        made.create_bucket(Bucket=BUCKET)
        yield made


def _archive(shipper: CommitlogShipper, segment: FakeSegment) -> None:
    argv = archive_command(shipper.spool).replace("%path", str(segment.path))
    subprocess.run(argv.replace("%name", segment.name).split(" "), check=True)
    segment.path.unlink()


def test_the_download_is_what_the_backup_s_snapshot_lacks_and_the_placement_fetches(
    client: Any, tmp_path: Path
) -> None:
    commitlog = tmp_path / "commitlog"
    commitlog.mkdir()
    settings = PitrSettings(
        enabled=True,
        node="node1",
        spool_directory=tmp_path / "spool",
        properties_file=tmp_path / "conf" / "commitlog_archiving.properties",
        piece_max_bytes=64 * 1024,
        commitlog_sync_period_seconds=0,
    )
    shipper = CommitlogShipper(client, S3, settings, "node1", commitlog)
    shipper.install()
    # Before the backup: segment 100 completed (still in the directory at the snapshot: a copy
    # of it is kept), 101 open.
    done, open_then = FakeSegment(commitlog, 100), FakeSegment(commitlog, 101)
    done.sync(os.urandom(3000))
    open_then.sync(os.urandom(2000))
    shipper.cycle()
    done_copy = done.path.read_bytes()
    _archive(shipper, done)
    shipper.cycle()
    time.sleep(APART)
    backup_started = datetime.now(UTC)
    time.sleep(APART)
    # The snapshot: 100 whole, 101 as synced then.
    snapshot = {done.name: done_copy, open_then.name: open_then.path.read_bytes()}
    # After it: 101 grows and completes, 102 opens; then T; then a process started after T.
    open_then.sync(os.urandom(5000))
    later = FakeSegment(commitlog, 102)
    later.sync(os.urandom(70_000))  # two pieces
    shipper.cycle()
    _archive(shipper, open_then)
    shipper.cycle()
    target = int(time.time() * 1000)
    FakeSegment(commitlog, target + MAX_SEQUENCE_STEP + 1000).sync(os.urandom(900))
    shipper.cycle()

    estimate = estimate_download(client, S3, "node1", target, backup_started)
    states = list_segments(client, BUCKET, shipper.keys)
    assert estimate.segments == (open_then.name, later.name)
    assert estimate.bytes == states[open_then.name].shipped + states[later.name].shipped

    # The restore: the backup's commit-log volume back, the log placed; it fetched exactly that.
    for entry in commitlog.iterdir():
        entry.unlink()
    for name, data in snapshot.items():
        (commitlog / name).write_bytes(data)
    placed = placing.place(
        client, S3, pitr=settings, node="node1", commitlog_directory=commitlog, target_ms=target
    )
    fetched = tuple(s.name for s in placed.segments if s.replaces_local)
    assert fetched == estimate.segments and placed.bytes == estimate.bytes


def test_nothing_shipped_nothing_to_download(client: Any) -> None:
    estimate = estimate_download(client, S3, "node2", int(time.time() * 1000), datetime.now(UTC))
    assert estimate.segments == () and estimate.bytes == 0
