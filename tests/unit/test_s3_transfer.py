"""Pieces of the S3 transfer engine that need no store: part sizes, progress, the Content-MD5 hook."""

from __future__ import annotations

import base64
import hashlib
import io
from collections.abc import Iterator
from pathlib import Path

import pytest
from botocore.awsrequest import AWSRequest, AWSResponse

from ringsnap.agent.manifest import manifest
from ringsnap.agent.s3.client import _content_md5_only, make_client
from ringsnap.agent.s3.export import ExportFailed, export_node, transfer_config
from ringsnap.agent.s3.progress import Progress, Tracker
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.sandbox.sstables import table_directory, write_sstable

MIB = 1024 * 1024


def test_part_size_grows_when_a_file_would_need_more_than_10000_parts() -> None:
    settings = S3Settings(bucket="ringsnap-copies", part_size_bytes=8 * MIB)
    assert transfer_config(settings, 10 * 1024 * MIB).multipart_chunksize == 8 * MIB
    huge = 200 * 1024 * MIB
    part = transfer_config(settings, huge).multipart_chunksize
    assert part * 10_000 >= huge and part // 2 * 10_000 < huge


def test_progress_rate_and_eta() -> None:
    seen: list[Progress] = []
    tracker = Tracker(4, 400, seen.append, interval=0)
    tracker.skipped(100)
    tracker.transferred(100)
    tracker.file_transferred()
    progress = tracker.snapshot()
    assert (progress.files_done, progress.bytes_done, progress.bytes_transferred) == (2, 200, 100)
    assert progress.rate_bytes_per_second > 0
    assert progress.eta_seconds is not None and progress.eta_seconds > 0
    assert tracker.finish().final
    assert seen and seen[-1].final


def test_flexible_checksum_headers_become_a_content_md5_of_the_stream() -> None:
    body = io.BytesIO(b"0123456789" * 100_000)
    body.seek(10)
    request = AWSRequest(
        method="PUT",
        url="http://127.0.0.1/b/k",
        headers={"x-amz-checksum-crc32": "AAAAAA==", "x-amz-sdk-checksum-algorithm": "CRC32"},
        data=body,
    )
    _content_md5_only(request)
    expected = base64.b64encode(hashlib.md5(body.getvalue()[10:]).digest()).decode()
    assert request.headers["Content-MD5"] == expected
    assert "x-amz-checksum-crc32" not in request.headers
    assert "x-amz-sdk-checksum-algorithm" not in request.headers
    assert body.tell() == 10, "the body is put back where it was"


def test_a_content_md5_already_there_is_kept() -> None:
    request = AWSRequest(
        method="POST", url="http://127.0.0.1/b?delete", headers={"Content-MD5": "given"}, data=b"x"
    )
    _content_md5_only(request)
    assert request.headers["Content-MD5"] == "given"


def test_an_incomplete_sstable_refuses_the_export_before_any_request(tmp_path: Path) -> None:
    directory = table_directory(tmp_path)
    write_sstable(directory, 1, 1000)
    write_sstable(directory, 2, 1000)
    (directory / "nb-2-big-Filter.db").unlink()
    with pytest.raises(
        ExportFailed, match=r"node node1: SSTable shop/orders-\w+ nb-2-big .*Filter"
    ):
        export_node(
            None,  # any request would fail on it: nothing may be sent
            S3Settings(bucket="ringsnap-copies"),
            backup_id="b1",
            node="node1",
            data_directories=[tmp_path],
            manifest=lambda: manifest([tmp_path], cache=None),
        )


class _EmptyBody:
    def stream(self, **_: object) -> Iterator[bytes]:
        yield b""


def _sent_put(settings: S3Settings, body: bytes) -> AWSRequest:
    """The PutObject request the client would send (captured before it leaves the process)."""
    client = make_client(settings)
    sent: list[AWSRequest] = []

    def capture(request: AWSRequest, **_: object) -> AWSResponse:
        sent.append(request)
        return AWSResponse(request.url, 200, {"ETag": '"x"'}, _EmptyBody())

    client.meta.events.register("before-send.s3.PutObject", capture)
    client.put_object(Bucket="ringsnap-copies", Key="k", Body=io.BytesIO(body))
    return sent[0]


def _plain_http(*, sign_payload: bool = False) -> S3Settings:
    return S3Settings(
        bucket="ringsnap-copies", endpoint_url="http://127.0.0.1:9", sign_payload=sign_payload
    )


def test_bodies_are_not_hashed_into_the_signature_over_plain_http(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Content-MD5 is a signed header, so the body stays bound to the signature; a SHA-256 of
    every body would cost both sides a pass over it (and S3Proxy would buffer the body whole)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    body = b"sstable bytes" * 1000
    request = _sent_put(_plain_http(), body)
    assert request.headers["X-Amz-Content-SHA256"] == b"UNSIGNED-PAYLOAD"
    assert request.headers["Content-MD5"] == base64.b64encode(hashlib.md5(body).digest())
    assert b"content-md5" in request.headers["Authorization"], "Content-MD5 is signed"

    signed = _sent_put(_plain_http(sign_payload=True), body)
    assert signed.headers["X-Amz-Content-SHA256"] == hashlib.sha256(body).hexdigest().encode()


def test_files_below_512_mib_go_in_one_request_each() -> None:
    settings = S3Settings(bucket="ringsnap-copies")
    assert transfer_config(settings, 4 * 1024 * MIB).multipart_threshold == 512 * MIB
    with pytest.raises(ValueError, match="multipart_threshold_bytes"):
        S3Settings(bucket="ringsnap-copies", multipart_threshold_bytes=6 * 1024 * MIB)
