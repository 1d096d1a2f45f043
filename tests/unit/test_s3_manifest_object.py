"""The manifest object's reader refuses, naming the object, every way its bytes can be wrong
(found by tests/fuzz/test_s3_objects.py: these escaped as EOFError, BadGzipFile,
UnicodeDecodeError or an OverflowError at the download's utime)."""

from __future__ import annotations

import gzip
import io
import json
from typing import Any

import pytest

from ringsnap.agent.s3.backup_manifest import FORMAT, ManifestWriter, read_entries
from ringsnap.agent.s3.layout import Layout
from ringsnap.errors import ValidationError

KEY = "sstables/node1/ks/t/nb-1-big-123/Data.db-10"
ENTRY = {"key": KEY, "root": 0, "size": 10, "mtime_ns": 1, "data_crc32": "123"}


def _valid() -> bytes:
    out = io.BytesIO()
    writer = ManifestWriter(out, backup_id="b1", node="node1")
    writer.add(KEY, 0, 10, 1, "123")
    writer.close()
    return out.getvalue()


def _read(body: bytes) -> list[Any]:
    return list(
        read_entries(
            io.BytesIO(body), Layout(), name="m-key", backup_id="b1", node="node1", roots=1
        )
    )


def _with_entry(**changes: Any) -> bytes:
    lines = [
        {"format": FORMAT, "backup_id": "b1", "node": "node1"},
        ENTRY | changes,
        {"end": True, "components": 1, "bytes": 10},
    ]
    return gzip.compress("".join(json.dumps(line) + "\n" for line in lines).encode(), mtime=0)


def test_the_valid_object_reads() -> None:
    assert [entry.key for entry in _read(_valid())] == [KEY]
    assert [entry.key for entry in _read(_with_entry())] == [KEY]


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (_valid()[:-4], "not a complete gzip stream"),
        (_valid()[:20], "not a complete gzip stream"),
        (b"plain text\n", "not a complete gzip stream"),
        (gzip.compress(b"\xff\xfe\n", mtime=0), "line 1 is not UTF-8"),
        (gzip.compress(b" " * (1024 * 1024), mtime=0), "line 1 is longer than 65536 bytes"),
        (_with_entry(root=False), "line 2 is not a component entry"),
        (_with_entry(size=True), "line 2 is not a component entry"),
        (_with_entry(mtime_ns=2**63), "line 2 is not a component entry"),
        (_with_entry(mtime_ns=-1), "line 2 is not a component entry"),
        (_with_entry(data_crc32="\u0661\u0662\u0663"), "line 2 is not a component entry"),
    ],
    # Named, not derived from the bodies: a manifest's header carries its creation time, and
    # parallel workers must collect the same ids.
    ids=[
        "truncated-end",
        "truncated-start",
        "not-gzip",
        "not-utf8",
        "line-too-long",
        "root-bool",
        "size-bool",
        "mtime-too-large",
        "mtime-negative",
        "crc-not-ascii-digits",
    ],
)
def test_a_broken_object_is_refused_naming_it(body: bytes, why: str) -> None:
    with pytest.raises(ValidationError, match=why) as refused:
        _read(body)
    assert "manifest object 'm-key'" in str(refused.value)


def _commitlog_object(body: bytes) -> list[Any]:
    from ringsnap.agent.s3.commitlog import read_commitlog_object

    return read_commitlog_object(body, Layout(), name="cl-key", backup_id="b1", node="node1")


def test_the_commitlog_object_reader_is_bounded_on_a_gzip_bomb() -> None:
    """Found by reading it after the manifest reader: it decompressed the whole object at once."""
    import tracemalloc

    from ringsnap.agent.s3.commitlog import MAX_COMMITLOG_OBJECT_BYTES

    # It claims 4x the bound; reading it holds at most the bound (twice, while the output grows).
    bomb = gzip.compress(b" " * (4 * MAX_COMMITLOG_OBJECT_BYTES), compresslevel=1, mtime=0)
    tracemalloc.start()
    try:
        with pytest.raises(ValidationError, match=r"larger than .* once decompressed") as refused:
            _commitlog_object(bomb)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "commit-log object 'cl-key'" in str(refused.value)
    assert peak < 3 * MAX_COMMITLOG_OBJECT_BYTES


@pytest.mark.parametrize(
    "body",
    [b"", b"plain", gzip.compress(b"{}\n", mtime=0)[:-3], gzip.compress(b"{}\n", mtime=0) + b"xx"],
    ids=["empty", "not-gzip", "truncated", "trailing-bytes"],
)
def test_a_broken_commitlog_object_is_refused_naming_it(body: bytes) -> None:
    with pytest.raises(ValidationError, match="commit-log object 'cl-key': not gzip'd"):
        _commitlog_object(body)


def test_the_catalog_mirror_manifest_reader_is_bounded_on_a_gzip_bomb() -> None:
    """Its length check ran after iterating the file had inflated the whole line."""
    import tracemalloc

    from botocore.exceptions import ClientError

    from ringsnap.coordinator.export.mirror import MAX_MANIFEST_LINE, read_manifest
    from ringsnap.coordinator.export.mirror_keys import KEY_OBJECT, MirrorKeys

    bomb = gzip.compress(b"0" * (256 * MAX_MANIFEST_LINE), compresslevel=1, mtime=0)

    class Store:  # only the calls read_manifest makes: a mirror in plain text (no key object)
        def get_object(self, **request: Any) -> dict[str, Any]:
            if request["Key"].endswith("/" + KEY_OBJECT):
                raise ClientError({"Error": {"Code": "NoSuchKey"}}, "GetObject")
            return {"Body": io.BytesIO(bomb)}

    tracemalloc.start()
    try:
        with pytest.raises(ValidationError, match="line 1 is longer than") as refused:
            keys = MirrorKeys(Store(), "b", Layout("p/"), ())
            name = "node-0001.jsonl.gz"
            read_manifest(Store(), "b", Layout("p/"), "rs-1", keys, node="n1", name=name)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "p/catalog/rs-1/node-0001.jsonl.gz" in str(refused.value)
    assert peak < 8 * MAX_MANIFEST_LINE
