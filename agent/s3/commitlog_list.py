"""The commit-log list object of a node's backup: its format, written and read whole (it is small).

    {"format": "ringsnap-s3-commitlog/1", "backup_id": ..., "node": ..., "created": ...}
    {"key": ..., "segment": "CommitLog-7-1732...log", "size": ..., "crc32": ...}   one per segment
    {"end": true, "segments": N, "bytes": B}

gzip'd JSON lines; see `commitlog` for what it lists and when it is written.
"""

from __future__ import annotations

import gzip
import io
import json
import time
import zlib
from dataclasses import dataclass
from typing import Any

from ringsnap.agent.s3.framed_lines import body_records
from ringsnap.agent.s3.layout import Layout
from ringsnap.errors import ValidationError

FORMAT = "ringsnap-s3-commitlog/1"
#: PutObject's limit; Cassandra's segments are 32 MiB by default (commitlog_segment_size).
MAX_SEGMENT_BYTES = 5 * 1024**3


@dataclass(frozen=True)
class Segment:
    key: str
    name: str
    size_bytes: int
    crc32: int


def commitlog_object(backup_id: str, node: str, segments: list[Segment]) -> bytes:
    lines = [{"format": FORMAT, "backup_id": backup_id, "node": node, "created": int(time.time())}]
    lines += [
        {"key": s.key, "segment": s.name, "size": s.size_bytes, "crc32": s.crc32} for s in segments
    ]
    lines.append(
        {"end": True, "segments": len(segments), "bytes": sum(s.size_bytes for s in segments)}
    )
    text = "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines)
    return gzip.compress(text.encode(), compresslevel=6, mtime=0)


#: A segment is one line of about 200 bytes: far more than any node's list.
MAX_COMMITLOG_OBJECT_BYTES = 64 * 1024 * 1024


def read_commitlog_object(
    data: bytes, layout: Layout, *, name: str, backup_id: str, node: str
) -> list[Segment]:
    """Validate a whole list object (`name`: its key, for errors); refuses naming the key."""

    def refuse(why: str) -> ValidationError:
        return ValidationError(f"commit-log object {name!r}: {why}; refused")

    try:
        # Bounded: a few hundred bytes of gzip can claim gigabytes (a gzip bomb).
        inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        inflated = inflater.decompress(data, MAX_COMMITLOG_OBJECT_BYTES + 1)
        complete = inflater.eof and not inflater.unused_data
        text = inflated.decode("utf-8") if complete else ""
    except (UnicodeDecodeError, zlib.error):
        raise refuse("not gzip'd UTF-8 text") from None
    if len(inflated) > MAX_COMMITLOG_OBJECT_BYTES:
        raise refuse(f"larger than {MAX_COMMITLOG_OBJECT_BYTES} bytes once decompressed")
    if not complete:
        raise refuse("not gzip'd UTF-8 text (truncated or followed by other bytes)")
    segments: list[Segment] = []

    def closing_matches(record: dict[str, Any]) -> bool:
        expected = (len(segments), sum(s.size_bytes for s in segments))
        return (record.get("segments"), record.get("bytes")) == expected

    records = body_records(
        enumerate(io.StringIO(text), start=1),
        refuse,
        header=(FORMAT, backup_id, node),
        closing_matches=closing_matches,
    )
    for number, record in records:
        segments.append(
            _segment(record, layout, backup_id=backup_id, node=node, refuse=refuse, number=number)
        )
    if len({s.name for s in segments}) != len(segments):
        raise refuse("a segment is listed twice")
    return segments


def _segment(
    record: dict[str, Any], layout: Layout, *, backup_id: str, node: str, refuse: Any, number: int
) -> Segment:
    key, name, size, crc = (record.get(k) for k in ("key", "segment", "size", "crc32"))
    if not (
        isinstance(key, str)
        and isinstance(name, str)
        and isinstance(size, int)
        and not isinstance(size, bool)
        and 0 <= size <= MAX_SEGMENT_BYTES
        and isinstance(crc, int)
        and not isinstance(crc, bool)
        and 0 <= crc < 2**32
    ):
        raise refuse(f"line {number} is not a segment entry")
    try:
        parsed = layout.parse_segment_key(key, node=node, backup=backup_id)
    except ValidationError as exc:
        raise refuse(f"line {number}: {exc}") from None
    if parsed != name:
        raise refuse(f"line {number}: key {key!r} does not name segment {name!r}")
    return Segment(key, name, size, crc)
