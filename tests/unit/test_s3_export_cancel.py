"""A cancelled export closes every file it opened before it returns, against moto's in-process S3
at a limited bandwidth (as the ring test and a WAN link run it).

Why it matters: an export reads a clone mounted on the node; a file left open keeps the clone busy
and its unmount (then its deletion on the array) is refused. s3transfer leaves a cancelled part's
file open when closing its reader raises: its bandwidth-limited stream re-raises the cancel before
it closes the file, and a progress callback that raises does the same. Such a file stays open until
the garbage collector breaks the exception's reference cycle, so the collector is held off here.
"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from ringsnap.agent.s3 import commitlog
from ringsnap.agent.s3.commitlog import export_commitlog
from ringsnap.agent.s3.export import ExportCancelled
from ringsnap.agent.s3.progress import Progress
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.sandbox.sstables import table_directory, write_sstable
from tests.support.s3_exported import export_source

BUCKET = "ringsnap-copies"
MIB = 1024 * 1024
#: Multipart parts of 5 MiB, 4 at a time, at 4 MiB/s: a cut lands while parts are in flight.
SETTINGS = S3Settings(
    bucket=BUCKET,
    multipart_threshold_bytes=5 * MIB,
    part_size_bytes=5 * MIB,
    concurrency=4,
    max_bandwidth_bytes=4 * MIB,
)


@pytest.fixture
def client() -> Iterator[Any]:
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        yield s3


@pytest.fixture
def no_collector() -> Iterator[None]:
    """A file kept open by a reference cycle is closed only when the collector runs."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _source(root: Path) -> Path:
    for generation in range(1, 4):
        write_sstable(table_directory(root), generation, 8 * MIB)
    return root


def _open_under(root: Path) -> list[str]:
    """The files under `root` this process holds open (what `lsof +D` would name)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(f"{root}/"):
            found.append(target)
    return found


def _export(client: Any, source: Path, settings: S3Settings = SETTINGS, **kwargs: Any) -> Any:
    return export_source(client, settings, source, **kwargs)


@pytest.mark.usefixtures("no_collector")
def test_a_cancel_mid_upload_closes_every_file_and_a_rerun_uploads_the_rest(
    client: Any, tmp_path: Path
) -> None:
    source = _source(tmp_path / "source")
    cancel = threading.Event()

    def progress(now: Progress) -> None:
        if now.bytes_transferred >= 2 * MIB:
            cancel.set()  # as the RPC does when its caller goes away

    with pytest.raises(ExportCancelled, match="node node1: the export of backup b1 was cancelled"):
        _export(client, source, progress=progress, cancel=cancel)

    assert _open_under(source) == [], "the cancelled export left files of its source open"
    listed = client.list_objects_v2(Bucket=BUCKET).get("Contents", [])
    assert not [o for o in listed if o["Key"].startswith("backups/")], "manifest written"

    done = _export(client, source, SETTINGS.model_copy(update={"max_bandwidth_bytes": None}))
    assert done.files_uploaded == done.components - len(listed)
    assert _open_under(source) == []


class _ReporterFailed(Exception):
    pass


@pytest.mark.usefixtures("no_collector")
def test_a_reporter_that_raises_stops_the_export_with_its_error_and_closes_every_file(
    client: Any, tmp_path: Path
) -> None:
    source = _source(tmp_path / "source")

    def progress(now: Progress) -> None:
        if now.bytes_transferred >= 2 * MIB:
            raise _ReporterFailed("the caller is gone")

    with pytest.raises(_ReporterFailed, match="the caller is gone"):
        _export(client, source, progress=progress)

    assert _open_under(source) == [], "the failed export left files of its source open"


class _SetAfter(threading.Event):
    """An event that reads as set from its `after`-th look on (mid-way through a body's reads)."""

    def __init__(self, after: int) -> None:
        super().__init__()
        self.looks = 0
        self._after = after

    def is_set(self) -> bool:
        self.looks += 1
        return self.looks >= self._after


@pytest.mark.usefixtures("no_collector")
def test_a_cancel_while_a_commit_log_segment_is_sent_stops_it_and_closes_it(
    client: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "commitlog"
    directory.mkdir()
    for number in (1, 2):
        (directory / f"CommitLog-7-{number}.log").write_bytes(os.urandom(3 * MIB))
    reads: list[int] = []
    original = commitlog._Crc32Reader.read

    def counted(self: Any, size: int = -1) -> bytes:
        data = original(self, size)
        reads.append(len(data))
        return data

    monkeypatch.setattr(commitlog._Crc32Reader, "read", counted)
    # The first look is before the first segment; the next ones are the body's reads.
    cancel = _SetAfter(after=3)

    with pytest.raises(ExportCancelled, match="node node1: the export was cancelled"):
        export_commitlog(
            client, SETTINGS, backup_id="b1", node="node1", directory=directory, cancel=cancel
        )

    assert _open_under(directory) == []
    assert sum(reads) < 3 * MIB, "the segment was sent whole after the cancel"
    assert "Contents" not in client.list_objects_v2(Bucket=BUCKET), "something was stored"
