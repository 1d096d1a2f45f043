"""Encryption and decryption as streams: a seekable reader for uploads, a chunk writer for GETs.

`EncryptingReader` is what an upload reads instead of the file: the encrypted object, produced one
chunk at a time from `pread`s of the file (no file position shared with anyone, one chunk held).
A seek (botocore rewinds a body to hash or resend it, s3transfer reads parts at offsets) seals the
chunk there again: AES-GCM is deterministic for a key, nonce and plaintext, so the bytes are the
same. That holds only while the file does not change under the reader (the same nonce over other
plaintext would leak both): export reads snapshots and clones, and the reader refuses a file
whose size changed.

`DecryptingWriter` takes the encrypted bytes of a span of whole chunks in order, in pieces of any
size (a GET's reads, resumed after a cut), opens each chunk once it is complete and hands the
plaintext on: the download's CRC32 and `pwrite` see plaintext only.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import IO, BinaryIO

from ringsnap.agent.s3.crypto.envelope import (
    CHUNK_SIZE,
    CIPHER_CHUNK,
    HEADER_SIZE,
    TAG_SIZE,
    EnvelopeError,
    Header,
    ObjectTampered,
    Opener,
    RunKeyOf,
    Sealer,
    chunk_count,
    cipher_size,
    open_chunk,
    opener_parts,
)


class EncryptingReader:
    """The encrypted object of `plain_size` bytes of `source` (an open file), read-only."""

    def __init__(self, source: BinaryIO, plain_size: int, sealer: Sealer) -> None:
        self._source = source
        self._fd = source.fileno()
        self._plain_size = plain_size
        self._sealer = sealer
        self._chunks = chunk_count(plain_size)
        self.size = cipher_size(plain_size)
        self._position = 0
        self._cached: tuple[int, bytes] | None = None  # (chunk index, sealed bytes)
        self.name = getattr(source, "name", "?")

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._position, os.SEEK_END: self.size}[whence]
        if base + offset < 0:
            raise ValueError(f"negative position {base + offset}")
        self._position = base + offset
        return self._position

    def _sealed(self, index: int) -> bytes:
        if self._cached is not None and self._cached[0] == index:
            return self._cached[1]
        start = index * CHUNK_SIZE
        length = min(CHUNK_SIZE, self._plain_size - start)
        plain = os.pread(self._fd, length, start)
        if len(plain) != length or os.fstat(self._fd).st_size != self._plain_size:
            raise OSError(
                f"{self.name} changed while it was encrypted (expected {self._plain_size} bytes);"
                " export from a snapshot, not from live files"
            )
        sealed = self._sealer.seal(index, plain, index == self._chunks - 1)
        self._cached = (index, sealed)
        return sealed

    def read(self, size: int | None = -1) -> bytes:
        """Up to `size` bytes from the position; each byte copied once (views of the header and
        of the sealed chunks, joined)."""
        position = self._position
        end = self.size if size is None or size < 0 else min(self.size, position + size)
        pieces: list[memoryview] = []
        while position < end:
            if position < HEADER_SIZE:
                source, offset = memoryview(self._sealer.header_bytes), position
            else:
                index, offset = divmod(position - HEADER_SIZE, CIPHER_CHUNK)
                source = memoryview(self._sealed(index))
            piece = source[offset : offset + end - position]
            pieces.append(piece)
            position += len(piece)
        self._position = position
        return pieces[0].tobytes() if len(pieces) == 1 else b"".join(pieces)

    def close(self) -> None:
        self._source.close()

    @property
    def closed(self) -> bool:
        return self._source.closed

    def __enter__(self) -> EncryptingReader:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class DecryptingWriter:
    """Opens chunks `first` .. `first + count - 1` from their encrypted bytes, in order, and
    writes their plaintext to `sink`. The header is not part of what it is given."""

    def __init__(
        self, opener: Opener, first: int, count: int, sink: Callable[[bytes], object]
    ) -> None:
        if first < 0 or count < 1 or first + count > opener.chunks:
            raise EnvelopeError(
                f"object {opener.name!r}: chunks {first}+{count} of {opener.chunks}"
            )
        self._opener = opener
        self._next = first
        self._end = first + count
        self._sink = sink
        self._buffer = bytearray()

    def write(self, data: bytes | memoryview) -> int:
        view = memoryview(data)
        taken = 0
        while taken < len(view):
            if self._next >= self._end:
                raise ObjectTampered(
                    f"object {self._opener.name!r}: more bytes than its chunks hold; refused"
                )
            need = self._opener.cipher_length(self._next) - len(self._buffer)
            piece = view[taken : taken + need]
            taken += len(piece)
            if not self._buffer and len(piece) == need:
                self._emit(piece)  # a whole chunk in this piece: no copy into the buffer
                continue
            self._buffer += piece
            if len(self._buffer) == self._opener.cipher_length(self._next):
                sealed, self._buffer = self._buffer, bytearray()
                self._emit(sealed)
        return len(view)

    def _emit(self, sealed: bytes | bytearray | memoryview) -> None:
        self._sink(self._opener.open(self._next, sealed))
        self._next += 1

    @property
    def complete(self) -> bool:
        """Every chunk of the span opened, nothing left over."""
        return self._next == self._end and not self._buffer


def _read_full(source: IO[bytes], size: int) -> bytes:
    data = bytearray()
    while len(data) < size and (piece := source.read(size - len(data))):
        data += piece
    return bytes(data)


def decrypt_stream(source: IO[bytes], out: IO[bytes], name: str, run_key_of: RunKeyOf) -> int:
    """An object whose size nobody recorded (a manifest object), from `source` into `out`, chunk
    by chunk (one chunk and one byte of lookahead in memory): the last chunk is the one the
    object ends with, and must have been sealed as last. Returns the plaintext bytes written;
    raises `EnvelopeError` naming the object, having written only verified chunks."""
    header = Header.parse(_read_full(source, HEADER_SIZE), name)
    aead, ad = opener_parts(header, run_key_of(header.key_id), name)
    sealed = _read_full(source, CIPHER_CHUNK)
    written = index = 0
    while True:
        if len(sealed) < TAG_SIZE:
            raise ObjectTampered(f"object {name!r}: chunk {index} is truncated; refused")
        ahead = _read_full(source, CIPHER_CHUNK) if len(sealed) == CIPHER_CHUNK else b""
        plain = open_chunk(aead, ad, name, index, sealed, last=not ahead)
        out.write(plain)
        written += len(plain)
        if not ahead:
            return written
        sealed, index = ahead, index + 1
