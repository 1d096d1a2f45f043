"""A node's manifest object for one backup: gzip'd JSON lines, written and read as streams.

    {"format": "ringsnap-s3-manifest/1", "backup_id": ..., "node": ..., "created": ...}
    {"key": ..., "root": 0, "size": ..., "mtime_ns": ..., "data_crc32": "..."}     one per component
    {"end": true, "components": N, "bytes": B}

The closing line makes a truncated object detectable. The file name and place of a component come
from its (validated) key, never from a free-form path in the object; `root` is the index of the
node's data directory it belongs in.
"""

from __future__ import annotations

import gzip
import io
import json
import re
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

from ringsnap.agent.s3.framed_lines import body_records
from ringsnap.agent.s3.layout import ComponentKey, Layout
from ringsnap.errors import ValidationError

FORMAT = "ringsnap-s3-manifest/1"
#: A line holds one component (about 300 bytes); anything far longer is not a manifest's.
MAX_LINE_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class Entry:
    key: str
    parsed: ComponentKey
    root: int
    size_bytes: int
    mtime_ns: int
    #: Digest.crc32 of the SSTable (decimal text, as Cassandra writes it).
    data_crc32: str


class ManifestWriter:
    """Writes entries to a (temporary) binary file as they come; `close()` adds the closing line."""

    def __init__(self, out: IO[bytes], *, backup_id: str, node: str) -> None:
        self._gzip = gzip.GzipFile(fileobj=out, mode="wb", compresslevel=6, mtime=0)
        self._text = io.TextIOWrapper(self._gzip, encoding="utf-8", newline="\n")
        self.components = 0
        self.bytes = 0
        self._line(
            {"format": FORMAT, "backup_id": backup_id, "node": node, "created": int(time.time())}
        )

    def add(self, key: str, root: int, size: int, mtime_ns: int, data_crc32: str) -> None:
        self._line(
            {"key": key, "root": root, "size": size, "mtime_ns": mtime_ns, "data_crc32": data_crc32}
        )
        self.components += 1
        self.bytes += size

    def close(self) -> None:
        self._line({"end": True, "components": self.components, "bytes": self.bytes})
        self._text.flush()
        self._text.detach()
        self._gzip.close()

    def _line(self, record: dict[str, Any]) -> None:
        self._text.write(json.dumps(record, separators=(",", ":")) + "\n")


def read_entries(
    source: IO[bytes],
    layout: Layout,
    *,
    name: str,
    backup_id: str,
    node: str,
    roots: int,
    sealed: bool = False,
) -> Iterator[Entry]:
    """Validate and yield the entries of a manifest object (`name`: its key, for errors).

    Every key is checked against the layout (no traversal), belongs to `node`, and agrees with the
    size recorded beside it; `root` must be one of the `roots` data directories. A missing closing
    line or a count that does not match means a truncated or altered object: refused.
    `sealed`: the object was encrypted (and opened): its keys carry keyed addresses, and only
    those; a plain object's keys carry the digest.
    """

    def refuse(why: str) -> ValidationError:
        return ValidationError(f"manifest object {name!r}: {why}; refused")

    count = total = 0

    def closing_matches(record: dict[str, Any]) -> bool:
        return (record.get("components"), record.get("bytes")) == (count, total)

    with gzip.GzipFile(fileobj=source, mode="rb") as unzipped:
        records = body_records(
            _lines(unzipped, refuse),
            refuse,
            header=(FORMAT, backup_id, node),
            closing_matches=closing_matches,
        )
        for number, record in records:
            entry = _entry(record, layout, node, roots, refuse=refuse, number=number, sealed=sealed)
            count += 1
            total += entry.size_bytes
            yield entry


def _lines(unzipped: gzip.GzipFile, refuse: Any) -> Iterator[tuple[int, str]]:
    """The object's lines, numbered; each read with a bound (a gzip bomb of one endless line
    costs at most `MAX_LINE_BYTES`), and every way the bytes can fail to be gzip'd UTF-8 text
    (not gzip, truncated, corrupt, not UTF-8) is a refusal."""
    number = 0
    while True:
        try:
            raw = unzipped.readline(MAX_LINE_BYTES + 1)
        except (OSError, EOFError, zlib.error) as exc:
            raise refuse(f"not a complete gzip stream after line {number} ({exc})") from None
        if not raw:
            return
        number += 1
        if len(raw) > MAX_LINE_BYTES:
            raise refuse(f"line {number} is longer than {MAX_LINE_BYTES} bytes")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise refuse(f"line {number} is not UTF-8") from None
        yield number, text


def _entry(
    record: dict[str, Any],
    layout: Layout,
    node: str,
    roots: int,
    *,
    refuse: Any,
    number: int,
    sealed: bool,
) -> Entry:
    key, root, size = record.get("key"), record.get("root"), record.get("size")
    mtime, crc = record.get("mtime_ns"), record.get("data_crc32")
    if not (
        isinstance(key, str)
        # bool is an int to isinstance: `"root": false` is no data directory index.
        and type(root) is int
        and type(size) is int
        and type(mtime) is int
        and 0 <= mtime < 2**63  # what os.utime takes
        and isinstance(crc, str)
        and crc.isascii()
        and crc.isdigit()
    ):
        raise refuse(f"line {number} is not a component entry")
    try:
        parsed = layout.parse_component_key(key)
    except ValidationError as exc:
        raise refuse(f"line {number}: {exc}") from None
    if parsed.node != node or parsed.size_bytes != size or not 0 <= root < roots:
        raise refuse(f"line {number}: key {key!r} does not match its node, size or data directory")
    # An encrypted copy's key carries a keyed address instead of the digest (`crypto.names`);
    # its manifest object is authenticated, so the digest recorded beside it is the exporter's.
    keyed = re.search(r"-k[0-9a-f]{32}$", parsed.sstable) is not None
    if keyed != sealed:
        raise refuse(
            f"line {number}: key {key!r} is {'keyed' if keyed else 'plain'} in a"
            f" {'sealed' if sealed else 'plain'} manifest"
        )
    if not keyed and not parsed.sstable.endswith(f"-{crc}"):
        raise refuse(f"line {number}: key {key!r} does not carry the digest {crc}")
    return Entry(key, parsed, root, size, mtime, crc)
