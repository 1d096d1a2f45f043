"""How far a commit-log segment holds data Cassandra has synced: read its header and walk its sync
markers (Cassandra 5.0's format, `CommitLogDescriptor.writeHeader` / `CommitLogSegment.writeSyncMarker`).

    header: version (int) | id (long) | parameters length (short) | parameters (UTF-8) | CRC32 (int)
    then sections, each opened by an 8-byte marker: next marker's offset (int) | CRC32 (int)

A marker's CRC32 covers the segment id (low 4 bytes, then high, each big-endian) and the marker's own
file offset. Cassandra writes a section's marker only once the section is synced, and leaves the
next marker's bytes zero until then; replay stops cleanly where a marker is missing or its place is
past the file's end. So the bytes up to the end of the last section with a valid marker are a
segment replay accepts, whatever was appended after them: that prefix is what the shipper sends.
Reads are a few bytes per section (bounded memory, whatever the segment's size).
"""

from __future__ import annotations

import re
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

MARKER_BYTES = 8
#: `CommitLog-<version>-<id>.log` (no CDC index files: they are not segments).
SEGMENT_FILE = re.compile(r"CommitLog-(?P<version>[0-9]{1,3})-(?P<id>[0-9]{1,20})\.log")
#: Cassandra's parameters (compression, encryption) are a small JSON map.
_MAX_PARAMETERS = 64 * 1024


class SegmentUnreadable(Exception):
    """The file is not a commit-log segment ringsnap can read (header or name wrong)."""


@dataclass(frozen=True, order=True)
class SegmentName:
    id: int
    version: int
    name: str

    @classmethod
    def parse(cls, name: str) -> SegmentName | None:
        match = SEGMENT_FILE.fullmatch(name)
        if match is None:
            return None
        return cls(int(match["id"]), int(match["version"]), name)


def _crc_ints(*values: int) -> int:
    crc = 0
    for value in values:
        crc = zlib.crc32(struct.pack(">I", value & 0xFFFFFFFF), crc)
    return crc


def header_end(raw: BinaryIO, segment_id: int) -> int | None:
    """The header's length (where the first sync marker is); None while the header is still being
    written; raises SegmentUnreadable for a header that is wrong.

    Cassandra writes a new segment's header field by field (version, id, parameters' length,
    parameters, CRC32), and on a cold JVM the parameters' JSON can take it milliseconds: a read in
    between sees the fields so far and zeros after them. So a header whose CRC32 slot and first
    marker slot are still zero (or that the file ends inside) is one being written: no section can
    have been synced after it, nothing is lost, and the next read finds it whole. Replay itself
    accepts nothing from a file whose header does not verify."""
    head = raw.read(14)
    if len(head) < 14:
        return None
    version, found_id, length = struct.unpack(">iqH", head)
    if length > _MAX_PARAMETERS:
        raise SegmentUnreadable(f"header parameters of {length} bytes")
    parameters = raw.read(length)
    stored = raw.read(4)
    if len(parameters) < length or len(stored) < 4:
        return None
    crc = _crc_ints(version, found_id & 0xFFFFFFFF, found_id >> 32, length)
    crc = zlib.crc32(parameters, crc)
    if crc != struct.unpack(">I", stored)[0]:
        if not (stored + raw.read(MARKER_BYTES)).strip(b"\x00"):
            return None
        raise SegmentUnreadable("header CRC32 does not match")
    if found_id != segment_id:
        raise SegmentUnreadable(f"header id {found_id} is not the name's {segment_id}")
    return 14 + int(length) + 4


def synced_end(path: Path, segment_id: int) -> int:
    """Bytes of `path` that replay accepts: the end of its last section with a valid sync marker
    (0 while the header itself is not yet written whole, e.g. a segment just allocated)."""
    with open(path, "rb") as raw:
        size = raw.seek(0, 2)
        raw.seek(0)
        if not raw.read(14).strip(b"\x00"):
            return 0  # allocated, its header not yet there
        raw.seek(0)
        found = header_end(raw, segment_id)
        if found is None:
            return 0
        offset = found
        end = 0
        while offset <= size - MARKER_BYTES:
            raw.seek(offset)
            nxt, crc = struct.unpack(">iI", raw.read(MARKER_BYTES))
            expected = _crc_ints(segment_id & 0xFFFFFFFF, segment_id >> 32, offset)
            if crc != expected or nxt <= offset or nxt > size:
                break
            end = offset = nxt
        return end
