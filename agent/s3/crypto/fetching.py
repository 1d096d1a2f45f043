"""The download's GETs of an encrypted object: parts of whole chunks, opened as they arrive.

A file is fetched in parts as a plain one is (one GET below the multipart threshold, parts of
about `part_size_bytes` above it), but each part is a run of whole chunks, so every GET's bytes
open on their own and its plaintext goes to its offset with its CRC32 taken in order (the file's
CRC32 is joined from its parts', as for a plain file). The first part's GET starts at byte 0 and
reads the header in line; any other part first reads the 56-byte header with a small ranged GET
of its own (a part is at least 5 MiB, so that GET costs little) to learn the object's key id and
salt. A body cut in the middle is resumed by the fetcher as for a plain object: the chunk writer
sees each byte once, in order.
"""

from __future__ import annotations

from collections.abc import Callable

from ringsnap.agent.s3.crypto.envelope import (
    CHUNK_SIZE,
    HEADER_SIZE,
    ChunkSpan,
    Header,
    chunk_count,
    chunk_span,
    cipher_size,
)
from ringsnap.agent.s3.crypto.sealing import HeaderFirst, Unsealing
from ringsnap.agent.s3.crypto.streams import DecryptingWriter
from ringsnap.agent.s3.fetch import Fetcher, ObjectCorrupt, Span


def sealed_parts(plain_size: int, threshold: int, part_size: int) -> list[ChunkSpan]:
    """The parts of an encrypted object of `plain_size` plaintext bytes, in whole chunks."""
    count = chunk_count(plain_size)
    per = count if plain_size < threshold else max(1, part_size // CHUNK_SIZE)
    return [
        chunk_span(
            first * CHUNK_SIZE, min(per * CHUNK_SIZE, plain_size - first * CHUNK_SIZE), plain_size
        )
        for first in range(0, count, per)
    ]


def fetch_sealed_part(  # noqa: PLR0917 - one call site, the download's
    fetcher: Fetcher,
    keys: Unsealing,
    key: str,
    plain_size: int,
    part: ChunkSpan,
    write: Callable[[bytes], object],
) -> None:
    """The chunks of `part` of object `key`, opened, their plaintext in order into `write`."""
    total = cipher_size(plain_size)
    opened: HeaderFirst | DecryptingWriter
    if part.first == 0:
        opened = HeaderFirst(keys, key, plain_size, write, count=part.count)
        fetcher.fetch(Span(key, total, 0, HEADER_SIZE + part.cipher_length), opened.write)
    else:
        head = bytearray()
        fetcher.fetch(Span(key, total, 0, HEADER_SIZE), head.extend)
        opener = keys.opener(Header.parse(head, key), key, plain_size)
        opened = DecryptingWriter(opener, part.first, part.count, write)
        fetcher.fetch(Span(key, total, part.cipher_start, part.cipher_length), opened.write)
    if not opened.complete:
        raise ObjectCorrupt(f"its chunks {part.first}+{part.count} did not all arrive")
