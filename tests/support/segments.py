"""Commit-log segments for the shipper's tests, in Cassandra 5.0's layout (header, then sections
opened by sync markers). The layout is checked against a segment Cassandra's own code wrote
(`tests/unit/data/CommitLog-7-*.log.gz`, see test_pitr_segment.py)."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path


def _crc_ints(*values: int) -> int:
    crc = 0
    for value in values:
        crc = zlib.crc32(struct.pack(">I", value & 0xFFFFFFFF), crc)
    return crc


class FakeSegment:
    """A segment file of `size` bytes (zeros, as Cassandra preallocates) that grows by synced
    sections and by bytes appended but not yet synced."""

    def __init__(self, directory: Path, segment_id: int, size: int = 64 * 1024) -> None:
        self.id = segment_id
        self.name = f"CommitLog-7-{segment_id}.log"
        self.path = directory / self.name
        header = self.header(segment_id)
        self.path.write_bytes(header + bytes(size - len(header)))
        self.marker = len(header)

    @staticmethod
    def header(segment_id: int) -> bytes:
        """The header Cassandra writes first: version, id, parameters' length, parameters, CRC32."""
        parameters = b"{}"
        header = struct.pack(">iqH", 7, segment_id, len(parameters)) + parameters
        crc = _crc_ints(7, segment_id & 0xFFFFFFFF, segment_id >> 32, len(parameters))
        return header + struct.pack(">I", zlib.crc32(parameters, crc))

    def sync(self, data: bytes) -> int:
        """Append a synced section holding `data`; returns the synced end."""
        end = self.marker + 8 + len(data)
        marker = struct.pack(
            ">iI", end, _crc_ints(self.id & 0xFFFFFFFF, self.id >> 32, self.marker)
        )
        with open(self.path, "r+b") as raw:
            raw.seek(self.marker)
            raw.write(marker + data)
        self.marker = end
        return end

    def append_unsynced(self, data: bytes) -> None:
        with open(self.path, "r+b") as raw:
            raw.seek(self.marker + 8)
            raw.write(data)
