"""Recompute the CRC32 of every SSTable's Data.db and compare it with the Digest.crc32 Cassandra
wrote beside it: a clone that lost or flipped a block fails here, naming the file."""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ringsnap.agent import manifest

_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class DigestResult:
    sstables: int
    bytes_verified: int
    #: One line per mismatch or unreadable file (empty: all good).
    problems: tuple[str, ...]
    #: The manifest walked: the clones as they were before the drill node touched them.
    tables: tuple[manifest.SSTable, ...] = ()


def crc32_of(path: str) -> tuple[int, int]:
    """(CRC32, size) of a file, read in 1 MiB chunks."""
    crc = 0
    size = 0
    with open(path, "rb", buffering=0) as stream:
        while chunk := stream.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
    return crc, size


def verify(
    data_directories: Sequence[str], progress: Callable[[int], None] | None = None
) -> DigestResult:
    """Every live SSTable of `data_directories` (all keyspaces, system ones too) that has a
    Digest.crc32; SSTables without one (none in Cassandra 4/5 data files) are counted, not read."""
    sstables = verified = 0
    problems: list[str] = []
    tables: list[manifest.SSTable] = []
    for batch in manifest.manifest(list(data_directories)):
        tables.extend(batch)
        for table in batch:
            sstables += 1
            data = next((c for c in table.components if c.name == "Data.db"), None)
            if data is None or not table.data_digest_crc32:
                continue
            path = os.path.join(table.data_directory, data.path)
            try:
                crc, size = crc32_of(path)
            except OSError as exc:
                problems.append(f"{path}: cannot be read ({exc.strerror})")
                continue
            verified += size
            if progress is not None:
                progress(verified)
            if f"{crc}" != table.data_digest_crc32.strip():
                problems.append(
                    f"{path}: CRC32 of Data.db is {crc}, Digest.crc32 says"
                    f" {table.data_digest_crc32.strip()}"
                )
    return DigestResult(sstables, verified, tuple(problems), tuple(tables))
