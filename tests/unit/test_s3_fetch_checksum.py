"""The download's GET loop with `checksums = "flexible"`: botocore checks a whole object's
flexible checksum (x-amz-checksum-*) only once its body is read to its end, so the loop must read
past the last byte. Without that, a component verified by its size alone (Index.db, Statistics.db,
...) would pass with any bytes. And a store that ignores Range, met when a whole file's cut body
is resumed, is named without advice that cannot help."""

from __future__ import annotations

import base64
import io
import threading
import zlib
from typing import Any

import pytest
from botocore.httpchecksum import Crc32Checksum, StreamingChecksumBody

from ringsnap.agent.s3.fetch import Fetcher, ObjectCorrupt, Span

DATA = b"an Index.db, verified by its size alone" * 1000


class _Client:
    """get_object answers a body whose flexible checksum is `checksum` (base64 of the CRC32)."""

    def __init__(self, checksum: str) -> None:
        self._checksum = checksum

    def get_object(self, **request: Any) -> dict[str, Any]:
        assert "Range" not in request
        body = StreamingChecksumBody(io.BytesIO(DATA), len(DATA), Crc32Checksum(), self._checksum)
        return {"Body": body, "ContentLength": len(DATA)}


def _crc32_header(data: bytes) -> str:
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def _fetch(checksum: str) -> bytes:
    fetcher = Fetcher(
        _Client(checksum),
        "bucket",
        attempts=3,
        halts=(threading.Event(),),
        on_bytes=lambda _: None,
    )
    out = bytearray()
    fetcher.fetch(Span("k/Index.db", len(DATA), 0, len(DATA)), out.extend)
    return bytes(out)


def test_a_body_matching_its_flexible_checksum_is_taken() -> None:
    assert _fetch(_crc32_header(DATA)) == DATA


def test_a_body_that_does_not_match_its_flexible_checksum_is_corrupt() -> None:
    with pytest.raises(ObjectCorrupt, match="checksum"):
        _fetch(_crc32_header(DATA + b"x"))


class _IgnoresRange:
    """A store that answers every GET whole (200, no Content-Range); the first body is cut."""

    def __init__(self) -> None:
        self.gets = 0

    def get_object(self, **request: Any) -> dict[str, Any]:
        self.gets += 1
        if self.gets == 1:
            return {"Body": _CutBody(DATA[:100]), "ContentLength": len(DATA)}
        return {"Body": io.BytesIO(DATA), "ContentLength": len(DATA)}


class _CutBody(io.BytesIO):
    def read(self, size: int | None = -1) -> bytes:
        data = super().read(size)
        if not data:
            raise ConnectionResetError("reset by peer")
        return data


def test_a_store_that_ignores_range_on_a_resume_is_named_without_useless_advice() -> None:
    # A file below the threshold is one GET already: raising the threshold cannot help.
    fetcher = Fetcher(
        _IgnoresRange(), "bucket", attempts=3, halts=(threading.Event(),), on_bytes=lambda _: None
    )
    with pytest.raises(ValueError, match="ignores Range") as refused:
        fetcher.fetch(Span("k/Index.db", len(DATA), 0, len(DATA)), bytearray().extend)
    assert "multipart_threshold_bytes" not in str(refused.value)
