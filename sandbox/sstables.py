"""SSTables in Cassandra's on-disk layout for tests and benchmarks: real TOC.txt, a Data.db of
random bytes and its real CRC32 in Digest.crc32 (as Cassandra writes it), small other components."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

BIG = ("Data.db", "Index.db", "Summary.db", "Filter.db", "Statistics.db", "CompressionInfo.db")
TABLE_ID = "5a1c395e0b3c11f0a7d5c1a2b3c4d5e6"
_CHUNK = 4 * 1024 * 1024


def write_sstable(
    directory: Path, generation: int, data_bytes: int, *, small_bytes: int = 300
) -> list[Path]:
    """Write `nb-<generation>-big-*` in `directory`; returns the component files."""
    directory.mkdir(parents=True, exist_ok=True)
    prefix = f"nb-{generation}-big-"
    crc = 0
    data = directory / f"{prefix}Data.db"
    with data.open("wb") as out:
        left = data_bytes
        while left > 0:
            chunk = os.urandom(min(_CHUNK, left))
            crc = zlib.crc32(chunk, crc)
            out.write(chunk)
            left -= len(chunk)
    files = [data]
    for name in BIG[1:]:
        path = directory / f"{prefix}{name}"
        path.write_bytes(os.urandom(small_bytes + len(name)))
        files.append(path)
    digest = directory / f"{prefix}Digest.crc32"
    digest.write_text(str(crc))
    toc = directory / f"{prefix}TOC.txt"
    toc.write_text("\n".join((*BIG, "Digest.crc32", "TOC.txt")) + "\n")
    return [*files, digest, toc]


def table_directory(root: Path, keyspace: str = "shop", table: str = "orders") -> Path:
    return root / keyspace / f"{table}-{TABLE_ID}"
