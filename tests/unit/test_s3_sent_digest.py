"""An encrypted export encrypts every byte once (`ringsnap.agent.s3.sent_digest`): its PutObject
and UploadPart bodies go without Content-MD5, hashed while sent and checked against the store's
ETag; a body the store did not receive as sent fails the upload naming it, and its object is
deleted so that a rerun uploads it again. Plain bodies keep their Content-MD5. Against moto's S3
with the real export."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyrage
import pytest
from moto import mock_aws

from ringsnap.agent.manifest import manifest
from ringsnap.agent.s3 import sent_digest
from ringsnap.agent.s3.client import make_client
from ringsnap.agent.s3.crypto import envelope
from ringsnap.agent.s3.crypto.envelope import chunk_count
from ringsnap.agent.s3.export import ExportFailed, export_node
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.sandbox.sstables import table_directory, write_sstable

BUCKET = "ringsnap-copies"
MIB = 1024 * 1024


def _settings(tmp_path: Path, *, encrypted: bool) -> S3Settings:
    name_key = tmp_path / "name.key"
    name_key.write_text(os.urandom(32).hex())
    recipient = str(pyrage.x25519.Identity.generate().to_public())
    encryption = {"recipients": [recipient], "name_key_file": str(name_key)}
    return S3Settings.model_validate(
        {
            "bucket": BUCKET,
            "prefix": "copies/",
            # A 6 MiB file goes up in two parts of 5 MiB: UploadPart is covered too.
            "multipart_threshold_bytes": 5 * MIB,
            "part_size_bytes": 5 * MIB,
            **({"encryption": encryption} if encrypted else {}),
        }
    )


@pytest.fixture
def source(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "source"
    table = table_directory(root)
    write_sstable(table, 1, 6 * MIB + 4321)
    write_sstable(table, 2, 300_000)
    with mock_aws():
        yield root


def _client(settings: S3Settings, sent: list[tuple[str, bool]]) -> Any:
    """`make_client`'s client (its hooks), recording each PUT as sent."""
    client = make_client(settings)
    client.create_bucket(Bucket=BUCKET)

    def seen(request: Any, **_: Any) -> None:
        if request.method == "PUT":
            sent.append((request.url, "Content-MD5" in request.headers))

    client.meta.events.register("before-send.s3", seen)
    return client


def test_every_byte_is_encrypted_once_and_sent_without_content_md5(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seals: list[int] = []
    original = envelope.Sealer.seal

    def counted(self: Any, index: int, plain: bytes, last: bool) -> bytes:
        seals.append(len(plain))
        return original(self, index, plain, last)

    monkeypatch.setattr(envelope.Sealer, "seal", counted)
    sent: list[tuple[str, bool]] = []
    settings = _settings(tmp_path, encrypted=True)
    client = _client(settings, sent)
    result = export_node(
        client,
        settings,
        backup_id="b1",
        node="node1",
        data_directories=[source],
        manifest=lambda: manifest([source], cache=None),
    )

    files = [p for p in source.rglob("*") if p.is_file()]
    assert result.files_uploaded == len(files)
    component_bytes = sum(p.stat().st_size for p in files)
    # The components' chunks once each (the manifest object's are sealed by its own stream).
    assert sum(seals) - component_bytes < 2 * MIB, (sum(seals), component_bytes)
    assert sum(seals) >= component_bytes
    components = [url for url, _ in sent if "/sstables/" in url]
    assert components and not any(md5 for url, md5 in sent if "/sstables/" in url)
    assert len(components) >= len(files) + 1  # the big file's two parts


def test_a_body_the_store_did_not_receive_as_sent_fails_and_its_object_is_deleted(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[tuple[str, bool]] = []
    settings = _settings(tmp_path, encrypted=True)
    client = _client(settings, sent)
    monkeypatch.setattr(sent_digest.HashingBody, "hexdigest", lambda self: "0" * 32)

    with pytest.raises(ExportFailed, match="not the MD5 of the bytes sent"):
        export_node(
            client,
            settings,
            backup_id="b1",
            node="node1",
            data_directories=[source],
            manifest=lambda: manifest([source], cache=None),
        )

    # Each PutObject the store answered was deleted; the parts' multipart upload was aborted.
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix="copies/sstables/").get("Contents", [])
    assert not listed, [o["Key"] for o in listed]
    assert any(not md5 for url, md5 in sent if "/sstables/" in url)


def test_a_plain_body_keeps_its_content_md5(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[tuple[str, bool]] = []
    settings = _settings(tmp_path, encrypted=False)
    client = _client(settings, sent)
    export_node(
        client,
        settings,
        backup_id="b1",
        node="node1",
        data_directories=[source],
        manifest=lambda: manifest([source], cache=None),
    )
    assert sent and all(md5 for _, md5 in sent)


def test_a_retry_sends_the_body_again_from_its_start_and_hashes_that() -> None:
    import io

    body = sent_digest.HashingBody(io.BytesIO(b"abcdef"))
    assert body.read(3) == b"abc"
    body.seek(0)
    assert body.read() == b"abcdef" and body.in_order
    import hashlib

    assert body.hexdigest() == hashlib.md5(b"abcdef").hexdigest()
    body.seek(2)
    assert not body.in_order
    assert chunk_count(1) == 1
