"""The download's CRC32 of Data.db taken as the file is written (no second read of it), against
moto's in-process S3 filled by the real export: a file received in order is verified from what was
written; ranged GETs (out of order) fall back to reading the file back; either way a corrupt object
is refused by name and nothing reaches a final path."""

from __future__ import annotations

import io
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from ringsnap.agent.s3 import download
from ringsnap.agent.s3.download import DownloadRefused, _PartialFile, download_node
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.sandbox.sstables import table_directory
from tests.support.s3_exported import BUCKET, MIB, export_b1

#: Data.db of generation 1 is above this threshold: downloaded in ranged parts, out of order.
RANGED = S3Settings(
    bucket=BUCKET, multipart_threshold_bytes=5 * MIB, part_size_bytes=5 * MIB, concurrency=4
)


def test_the_crc_is_known_only_for_bytes_written_once_in_order(tmp_path: Path) -> None:
    data = os.urandom(300_000)
    with (tmp_path / "in-order").open("wb") as raw:
        partial = _PartialFile(raw)
        for start in range(0, len(data), 65_536):
            partial.seek(start)
            partial.write(data[start : start + 65_536])
        assert partial.crc32_if_whole(len(data)) == zlib.crc32(data)
        assert partial.crc32_if_whole(len(data) + 1) is None, "a short file has no CRC"

    with (tmp_path / "ranged").open("wb") as raw:
        partial = _PartialFile(raw)
        partial.seek(150_000)
        partial.write(data[150_000:])
        partial.seek(0)
        partial.write(data[:150_000])
        assert partial.crc32_if_whole(len(data)) is None
    assert (tmp_path / "ranged").read_bytes() == data

    with (tmp_path / "retried").open("wb") as raw:
        partial = _PartialFile(raw)
        partial.write(data[:100_000])
        partial.seek(0)  # a retried GET writes its range again from its start
        partial.write(data)
        assert partial.crc32_if_whole(len(data)) is None


@pytest.fixture
def bucket(tmp_path: Path) -> Iterator[Any]:
    """moto's S3 holding backup b1 of node1: Data.db of 12 MiB (generation 1) and 40 KB."""
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        export_b1(client, RANGED, tmp_path / "source")
        yield client


def _reads_of_data_db(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    read_back: list[Path] = []
    original = download._crc32

    def counted(path: Path) -> int:
        read_back.append(path)
        return original(path)

    monkeypatch.setattr(download, "_crc32", counted)
    return read_back


def test_files_received_in_order_are_not_read_back(
    bucket: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    read_back = _reads_of_data_db(monkeypatch)
    destination = tmp_path / "restored"
    settings = S3Settings(bucket=BUCKET)  # 512 MiB threshold: one GET per file
    result = download_node(
        bucket, settings, backup_id="b1", node="node1", destinations=[destination]
    )
    assert result.files_downloaded == 16
    assert read_back == [], "Data.db was verified from what was written"
    source = table_directory(tmp_path / "source")
    for name in ("nb-1-big-Data.db", "nb-2-big-Data.db"):
        assert (table_directory(destination) / name).read_bytes() == (source / name).read_bytes()


def test_ranged_downloads_are_read_back_unless_every_part_came_in_order(
    bucket: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    read_back = _reads_of_data_db(monkeypatch)
    out_of_order: list[str] = []
    problem = download._problem

    def recorded(path: Path, entry: Any, written_crc32: int | None = None) -> str:
        if written_crc32 is None:
            out_of_order.append(path.name)
        return problem(path, entry, written_crc32)

    monkeypatch.setattr(download, "_problem", recorded)
    destination = tmp_path / "restored"
    download_node(bucket, RANGED, backup_id="b1", node="node1", destinations=[destination])
    # Ranged parts usually land out of order (then the file is read back); when the threads
    # happened to write them in order, the CRC taken while writing stands for the whole file.
    data_files = sorted(name for name in out_of_order if "Data.db" in name)
    assert sorted(path.name for path in read_back) == data_files
    source = table_directory(tmp_path / "source")
    for name in ("nb-1-big-Data.db", "nb-2-big-Data.db"):
        assert (table_directory(destination) / name).read_bytes() == (source / name).read_bytes()


@pytest.mark.parametrize("settings", [S3Settings(bucket=BUCKET), RANGED], ids=["one-get", "ranged"])
def test_a_corrupt_data_db_is_refused_by_key_and_never_written(
    bucket: Any, tmp_path: Path, settings: S3Settings
) -> None:
    listing = bucket.list_objects_v2(Bucket=BUCKET, Prefix="sstables/")
    key = next(item["Key"] for item in listing["Contents"] if "nb-1-big" in item["Key"]
               and "/Data.db-" in item["Key"])  # fmt: skip
    body = bytearray(bucket.get_object(Bucket=BUCKET, Key=key)["Body"].read())
    body[7 * MIB] ^= 0xFF  # same size: only the digest can tell
    bucket.put_object(Bucket=BUCKET, Key=key, Body=io.BytesIO(bytes(body)))
    destination = tmp_path / "restored"
    with pytest.raises(DownloadRefused, match=rf"object '{key}' is corrupt \(CRC32 \d+,"):
        download_node(bucket, settings, backup_id="b1", node="node1", destinations=[destination])
    assert not (table_directory(destination) / "nb-1-big-Data.db").exists()
    assert not list(destination.rglob("*.ringsnap-partial"))
