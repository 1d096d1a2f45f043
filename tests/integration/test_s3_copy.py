"""The node side of `ringsnap export` against a real S3 server (S3Proxy): the commit-log segments
captured with a backup go up with their CRC32 list and come back verified (a corrupt or hostile one
refused by name), and the agent's ExportToS3 streams progress, refuses a second export of the node
and stops when its caller goes away, the rerun uploading only what is missing.

What the store holds is always read from its own listing. The export through the coordinator on
the real ring is exercised by tests/integration/test_s3_restore.py, which fills the bucket with
`ringsnap export` and restores from it.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ringsnap.agent.config import CassandraSection
from ringsnap.agent.errors import Conflict
from ringsnap.agent.s3.client import S3Client, make_client
from ringsnap.agent.s3.commitlog import CommitlogMissing, download_commitlog, export_commitlog
from ringsnap.agent.s3.download import PARTIAL_SUFFIX, DownloadRefused
from ringsnap.agent.s3.layout import Layout
from ringsnap.agent.s3.rpc import S3Exports
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.api.v1 import agent_pb2
from ringsnap.sandbox.s3proxy import S3Server, running_s3proxy
from ringsnap.sandbox.sstables import table_directory, write_sstable

pytestmark = pytest.mark.integration

MIB = 1024 * 1024
#: The store is reached at a bounded rate, as a WAN link would be.
BANDWIDTH = 2 * MIB


@pytest.fixture(scope="module")
def s3_server() -> Iterator[S3Server]:
    with running_s3proxy() as server:
        yield server


@pytest.fixture(scope="module")
def s3_table(s3_server: S3Server, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    keys = tmp_path_factory.mktemp("s3-keys")
    for name, value in (
        ("access", s3_server.access_key_id),
        ("secret", s3_server.secret_access_key),
    ):
        (keys / name).write_text(value)
        (keys / name).chmod(0o600)
    table = {
        "bucket": f"ringsnap-{uuid.uuid4().hex[:12]}",
        "prefix": "copies/",
        "endpoint_url": s3_server.endpoint_url,
        "access_key_id_file": str(keys / "access"),
        "secret_access_key_file": str(keys / "secret"),
        "max_bandwidth_bytes": BANDWIDTH,
        "multipart_threshold_bytes": 5 * MIB,
        "part_size_bytes": 5 * MIB,
    }
    settings = S3Settings.model_validate(table)
    make_client(settings).create_bucket(Bucket=settings.bucket)
    return table


def _listing(client: S3Client, settings: S3Settings, under: str) -> dict[str, int]:
    return {
        item["Key"]: item["Size"]
        for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=settings.bucket, Prefix=settings.prefix + under
        )
        for item in page.get("Contents", ())
        if not item["Key"].endswith("/")
    }


def test_commit_log_segments_round_trip_verified_and_a_corrupt_one_refused(
    s3_server: S3Server, s3_table: dict[str, Any], tmp_path: Path
) -> None:
    """No ring needed: the segments of a commit-log directory up, their list object, and back."""
    settings = S3Settings.model_validate({**s3_table, "prefix": "segments/"})
    client = make_client(settings)
    source = tmp_path / "commitlog"
    source.mkdir()
    segments = {
        "CommitLog-8-1700000000001.log": os.urandom(3 * MIB + 17),
        "CommitLog-8-1700000000002.log": os.urandom(64 * 1024),
        "CommitLog-8-1700000000002_cdc.idx": b"42\n",
    }
    for name, body in segments.items():
        (source / name).write_bytes(body)
    (source / "not-a-segment.txt").write_bytes(b"ignored")
    exported = export_commitlog(
        client, settings, backup_id="b-1", node="node1", directory=source, progress=None
    )
    assert (exported.segments, exported.segments_uploaded) == (3, 3)
    again = export_commitlog(client, settings, backup_id="b-1", node="node1", directory=source)
    assert again.segments_uploaded == 0, "a rerun uploads only what is missing"
    listed = _listing(client, settings, "commitlog/node1/b-1/")
    assert {k.rsplit("/", 1)[1]: v for k, v in listed.items()} == {
        n: len(b) for n, b in segments.items()
    }

    target = tmp_path / "restored"
    done = download_commitlog(client, settings, "b-1", "node1", target)
    assert done.segments_downloaded == 3
    assert {p.name: p.read_bytes() for p in target.iterdir()} == segments
    kept = download_commitlog(client, settings, "b-1", "node1", target)
    assert kept.segments_kept == 3 and kept.segments_downloaded == 0

    # A segment altered in the bucket (same size) is refused by name and never lands.
    layout = Layout(settings.prefix)
    key = layout.segment_key("node1", "b-1", "CommitLog-8-1700000000002.log")
    path = s3_server.object_path(settings.bucket, key)
    original = path.read_bytes()
    path.write_bytes(bytes(b ^ 0x01 for b in original[:8]) + original[8:])
    fresh = tmp_path / "fresh"
    with pytest.raises(DownloadRefused, match=key):
        download_commitlog(client, settings, "b-1", "node1", fresh)
    assert not (fresh / "CommitLog-8-1700000000002.log").exists()
    assert not [p for p in fresh.iterdir() if p.name.endswith(PARTIAL_SUFFIX)]
    path.write_bytes(original)

    # A hostile list object (a key leaving the node's prefix) is refused naming the list.
    hostile = [
        {"format": "ringsnap-s3-commitlog/1", "backup_id": "b-2", "node": "node1", "created": 0},
        {
            "key": "copies/sstables/../../etc/passwd",
            "segment": "CommitLog-8-1.log",
            "size": 1,
            "crc32": 0,
        },
        {"end": True, "segments": 1, "bytes": 1},
    ]
    list_key = layout.commitlog_manifest_key("b-2", "node1")
    body = gzip.compress("".join(json.dumps(line) + "\n" for line in hostile).encode())
    client.put_object(Bucket=settings.bucket, Key=list_key, Body=body)
    with pytest.raises(DownloadRefused, match=list_key):
        download_commitlog(client, settings, "b-2", "node1", tmp_path / "hostile")
    with pytest.raises(CommitlogMissing, match="no commit-log object"):
        download_commitlog(client, settings, "b-3", "node1", tmp_path / "none")


@dataclass
class _AgentConfig:
    """What S3Exports reads of an agent's configuration."""

    cassandra: CassandraSection
    s3: S3Settings


def test_export_rpc_streams_progress_refuses_a_second_and_stops_when_its_caller_leaves(
    s3_table: dict[str, Any], tmp_path: Path
) -> None:
    """The agent's ExportToS3 (its servicer half) over a native snapshot, no ring needed."""
    settings = S3Settings.model_validate(
        {**s3_table, "prefix": "rpc/", "max_bandwidth_bytes": 512 * 1024}
    )
    client = make_client(settings)
    root = tmp_path / "data"
    snapshot = table_directory(root) / "snapshots" / "rs-1"
    for generation in range(1, 5):
        write_sstable(snapshot, generation, MIB)
    config = _AgentConfig(
        CassandraSection.model_validate(
            {"data_directories": [str(root)], "commitlog_directory": str(tmp_path / "cl")}
        ),
        settings,
    )
    exports = S3Exports(lambda: config, lambda: None)  # type: ignore[arg-type,return-value]
    request = agent_pb2.ExportToS3Request(backup_id="rs-1", node="node1", snapshot_tag="rs-1")

    async def cut_then_refused() -> str:
        stream = exports.export(request)
        async for message in stream:
            if message.HasField("progress") and message.progress.bytes_uploaded >= 256 * 1024:
                break
        # Meanwhile a second export of the node is refused, naming the running one.
        with pytest.raises(Conflict, match="backup rs-1"):
            async for _ in exports.export(request):
                pass
        await stream.aclose()  # the caller goes away: the agent stops uploading
        return "cut"

    assert asyncio.run(cut_then_refused()) == "cut"
    cut = _listing(client, settings, "sstables/")
    manifest = Layout(settings.prefix).manifest_key("rs-1", "node1")
    assert cut and manifest not in _listing(client, settings, "backups/"), "exported after a cut?"

    async def rerun() -> list[agent_pb2.ExportToS3Response]:
        return [m async for m in exports.export(request)]

    messages = asyncio.run(rerun())
    result = messages[-1].result
    assert messages[-1].HasField("result") and any(m.HasField("progress") for m in messages)
    stored = _listing(client, settings, "sstables/")
    assert result.components == len(stored) == 4 * 8
    # Only what the cut run had not uploaded went up again.
    assert result.files_uploaded == len(set(stored) - set(cut))
    assert "native snapshot rs-1" in result.commitlog_note
    assert result.commitlog_segments == 0
