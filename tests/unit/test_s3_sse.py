"""The store's own encryption settings reach every call that needs them, whatever module makes it:
the real export (s3transfer's PutObject and multipart), the commit log's PutObject, the download's
GETs, against moto's in-process S3 (and KMS). SSE-C, which moto accepts without checking, is
proven on the requests as sent: its key (and key MD5) on every PUT, part, GET and HEAD, on no
listing, and never in botocore's debug output."""

from __future__ import annotations

import base64
import hashlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws
from pydantic import ValidationError

from ringsnap.agent.manifest import manifest
from ringsnap.agent.s3.client import make_client
from ringsnap.agent.s3.commitlog import export_commitlog
from ringsnap.agent.s3.download import download_node
from ringsnap.agent.s3.export import export_node
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.sandbox.sstables import table_directory, write_sstable

BUCKET = "ringsnap-copies"
MIB = 1024 * 1024


@pytest.fixture
def source(tmp_path: Path) -> Path:
    root = tmp_path / "source"
    write_sstable(table_directory(root), 1, 6 * MIB)  # above the 5 MiB threshold: multipart
    write_sstable(table_directory(root), 2, 1000)
    return root


@pytest.fixture
def aws() -> Iterator[None]:
    with mock_aws():
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket=BUCKET)
        yield


def _settings(**sse: Any) -> S3Settings:
    return S3Settings.model_validate(
        {
            "bucket": BUCKET,
            "multipart_threshold_bytes": 5 * MIB,
            "part_size_bytes": 5 * MIB,
            **sse,
        }
    )


def _export(settings: S3Settings, source: Path, tmp_path: Path) -> Any:
    client = make_client(settings)
    export_node(
        client,
        settings,
        backup_id="b1",
        node="node1",
        data_directories=[source],
        manifest=lambda: manifest([source], cache=None),
    )
    segments = tmp_path / "commitlog"
    segments.mkdir(exist_ok=True)
    (segments / "CommitLog-7-1.log").write_bytes(b"segment" * 1000)
    export_commitlog(client, settings, backup_id="b1", node="node1", directory=segments)
    return client


def _heads(client: Any) -> dict[str, dict[str, Any]]:
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=BUCKET)["Contents"]]
    return {key: client.head_object(Bucket=BUCKET, Key=key) for key in keys}


@pytest.mark.usefixtures("aws")
def test_sse_s3_on_every_object(source: Path, tmp_path: Path) -> None:
    client = _export(_settings(server_side_encryption="AES256"), source, tmp_path)
    heads = _heads(client)
    assert len(heads) == 19  # 16 components, the manifest, a segment and its list
    assert {h.get("ServerSideEncryption") for h in heads.values()} == {"AES256"}


@pytest.mark.usefixtures("aws")
def test_sse_kms_with_a_key_id_on_every_object(source: Path, tmp_path: Path) -> None:
    key = boto3.client("kms", region_name="us-east-1").create_key()["KeyMetadata"]["Arn"]
    settings = _settings(server_side_encryption="aws:kms", sse_kms_key_id=key)
    heads = _heads(_export(settings, source, tmp_path))
    assert {h.get("ServerSideEncryption") for h in heads.values()} == {"aws:kms"}
    assert {h.get("SSEKMSKeyId") for h in heads.values()} == {key}


@pytest.mark.usefixtures("aws")
def test_sse_c_key_on_every_call_that_reads_or_writes_an_object(
    source: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    key = os.urandom(32)
    key_file = tmp_path / "sse-c.key"
    key_file.write_text(key.hex())
    settings = _settings(server_side_encryption="customer", sse_customer_key_file=str(key_file))
    sent: list[tuple[str, dict[str, str]]] = []

    def record(request: Any, operation_name: str, **_: Any) -> None:
        sent.append((operation_name, dict(request.headers)))

    client = make_client(settings)
    client.meta.events.register("request-created.s3", record)
    with caplog.at_level(logging.DEBUG, logger="botocore"):
        export_node(
            client,
            settings,
            backup_id="b1",
            node="node1",
            data_directories=[source],
            manifest=lambda: manifest([source], cache=None),
        )
        download_node(client, settings, backup_id="b1", node="node1", destinations=[tmp_path / "d"])
    md5 = base64.b64encode(hashlib.md5(key).digest()).decode()
    needs = {"PutObject", "CreateMultipartUpload", "UploadPart", "GetObject", "HeadObject"}
    seen = {name for name, _ in sent}
    assert {"PutObject", "CreateMultipartUpload", "UploadPart", "GetObject"} <= seen
    for name, headers in sent:
        carries = headers.get("x-amz-server-side-encryption-customer-key-MD5") == md5
        assert carries == (name in needs), name
    assert base64.b64encode(key).decode() not in caplog.text


@pytest.mark.parametrize(
    ("table", "why"),
    [
        ({"sse_kms_key_id": "alias/x"}, "sse_kms_key_id goes with"),
        ({"server_side_encryption": "AES256", "sse_kms_key_id": "alias/x"}, "goes with"),
        ({"server_side_encryption": "customer"}, "sse_customer_key_file goes with"),
        ({"server_side_encryption": "aws:kms:dsse"}, "server_side_encryption"),
    ],
)
def test_sse_settings_that_do_not_go_together_are_refused(table: dict[str, str], why: str) -> None:
    with pytest.raises(ValidationError, match=why):
        _settings(**table)


def test_an_sse_c_key_that_is_not_64_hex_digits_is_refused(tmp_path: Path) -> None:
    key_file = tmp_path / "k"
    key_file.write_text("not hex")
    with pytest.raises(ValidationError, match="64 hex digits"):
        _settings(server_side_encryption="customer", sse_customer_key_file=str(key_file))
