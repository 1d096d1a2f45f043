"""The encrypted object format: a fixed header, then the plaintext in AES-256-GCM chunks.

    header (56 bytes)  magic "RSE1" | version 1 | chunk shift 16 | 2 zero bytes
                       | run key id (16) | salt (32)
    chunk i            AES-256-GCM(data key, nonce(i, last), plaintext[i*C : (i+1)*C], AD) || tag (16)

- **Chunks of C = 64 KiB** of plaintext, each sealed with its own 16-byte tag: a ranged or resumed
  GET decrypts and checks whole chunks as they arrive; nothing is buffered beyond one chunk. The
  overhead is 16 bytes per 64 KiB (0.02 %). An empty object is one empty chunk (its tag), so even
  an empty file is authenticated.
- **A fresh data key per object**: HKDF-SHA256 of the export's run key (the key wrapped for the
  recipients, see `keyring`) with the object's random 32-byte salt. A key therefore seals one
  object only, and the nonce can be the chunk's position: `nonce(i, last)` = i as 11 big-endian
  bytes, then 1 for the object's last chunk and 0 for any other (the STREAM construction of age
  and Tink). Two chunks swapped fail (their index is in the nonce); a truncated object fails (its
  new last chunk was sealed as not last, or its size is not the size the manifest gives).
- **Associated data** of every chunk: the header and the object's name (its key below the
  layout's prefix). A byte of the header changed fails every chunk; an object copied or moved to
  another name fails too, so a bucket writer cannot pass one component off as another.

Sizes follow from the plaintext size alone (`cipher_size`), so a listing can tell a complete
encrypted object by its size, and a plaintext byte range maps to whole chunks (`chunk_span`).

What this does not do: encryption to a public key does not authenticate the writer (as with age).
Someone who can write to the bucket and knows a recipient's public key can replace an object
whole with one of their own making; the tags stop changes by anyone who does not hold the run key.
"""

from __future__ import annotations

import io
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

MAGIC = b"RSE1"
VERSION = 1
CHUNK_SHIFT = 16
CHUNK_SIZE = 1 << CHUNK_SHIFT
TAG_SIZE = 16
CIPHER_CHUNK = CHUNK_SIZE + TAG_SIZE
KEY_ID_SIZE = 16
RUN_KEY_SIZE = 32
SALT_SIZE = 32
_HEADER = struct.Struct(f">4sBB2x{KEY_ID_SIZE}s{SALT_SIZE}s")
HEADER_SIZE = _HEADER.size
_KDF_INFO = b"ringsnap envelope 1 data key"
#: Counter bytes of a nonce (the 12th is the last-chunk flag).
_COUNTER_BYTES = 11


class EnvelopeError(Exception):
    """An encrypted object that cannot be opened: the message names the object and what failed."""


class ObjectTampered(EnvelopeError):
    """A chunk's tag did not verify: the object was changed, truncated, reordered or moved."""


@dataclass(frozen=True, slots=True)
class Header:
    key_id: bytes
    salt: bytes

    def to_bytes(self) -> bytes:
        return _HEADER.pack(MAGIC, VERSION, CHUNK_SHIFT, self.key_id, self.salt)

    @classmethod
    def new(cls, key_id: bytes) -> Header:
        return cls(key_id, os.urandom(SALT_SIZE))

    @classmethod
    def parse(cls, data: bytes | bytearray | memoryview, name: str) -> Header:
        """The header at the start of `data` (at least HEADER_SIZE bytes); refused naming `name`."""
        if len(data) < HEADER_SIZE:
            raise EnvelopeError(
                f"object {name!r} is not an encrypted ringsnap object: {len(data)} bytes, shorter"
                f" than the {HEADER_SIZE}-byte header"
            )
        magic, version, shift, key_id, salt = _HEADER.unpack(bytes(data[:HEADER_SIZE]))
        if magic != MAGIC:
            raise EnvelopeError(f"object {name!r} is not an encrypted ringsnap object (no magic)")
        if version != VERSION or shift != CHUNK_SHIFT:
            raise EnvelopeError(
                f"object {name!r} is encrypted in format {version} with chunks of 2^{shift}"
                f" bytes; this ringsnap reads format {VERSION} with 2^{CHUNK_SHIFT}: use a newer"
                " ringsnap"
            )
        # The two zero bytes: any other value is a changed header (caught by the tags too).
        if bytes(data[6:8]) != b"\0\0":
            raise EnvelopeError(f"object {name!r}: reserved header bytes are not zero; refused")
        return cls(key_id, salt)


def chunk_count(plain_size: int) -> int:
    """Chunks of an object of `plain_size` bytes (one, empty, for an empty object)."""
    if plain_size < 0:
        raise ValueError(f"size {plain_size} < 0")
    return max(1, -(-plain_size // CHUNK_SIZE))


def cipher_size(plain_size: int) -> int:
    return HEADER_SIZE + plain_size + TAG_SIZE * chunk_count(plain_size)


def chunk_plain_length(index: int, plain_size: int) -> int:
    """Plaintext bytes in chunk `index` of an object of `plain_size` bytes."""
    last = chunk_count(plain_size) - 1
    if not 0 <= index <= last:
        raise ValueError(f"chunk {index} of an object of {plain_size} bytes ({last + 1} chunks)")
    return plain_size - index * CHUNK_SIZE if index == last else CHUNK_SIZE


def chunk_offset(index: int) -> int:
    """Where chunk `index` starts in the encrypted object."""
    return HEADER_SIZE + index * CIPHER_CHUNK


@dataclass(frozen=True, slots=True)
class ChunkSpan:
    """Chunks `first` .. `first + count - 1`: bytes `cipher_start` .. `+ cipher_length` of the
    encrypted object, plaintext bytes `plain_start` .. `+ plain_length`."""

    first: int
    count: int
    plain_start: int
    plain_length: int
    cipher_start: int
    cipher_length: int


def chunk_span(plain_start: int, plain_length: int, plain_size: int) -> ChunkSpan:
    """The whole chunks holding plaintext bytes `plain_start` .. `+ plain_length` (at least the
    chunk at `plain_start`, so an empty object's one chunk)."""
    if plain_start < 0 or plain_length < 0 or plain_start + plain_length > plain_size:
        raise ValueError(f"bytes {plain_start}+{plain_length} of an object of {plain_size}")
    first = min(plain_start // CHUNK_SIZE, chunk_count(plain_size) - 1)
    end = plain_start + plain_length
    last = max(first, (end - 1) // CHUNK_SIZE) if plain_length else first
    start = first * CHUNK_SIZE
    stop = min((last + 1) * CHUNK_SIZE, plain_size)
    return ChunkSpan(
        first=first,
        count=last - first + 1,
        plain_start=start,
        plain_length=stop - start,
        cipher_start=chunk_offset(first),
        cipher_length=stop - start + TAG_SIZE * (last - first + 1),
    )


def _nonce(index: int, last: bool) -> bytes:
    return index.to_bytes(_COUNTER_BYTES, "big") + (b"\1" if last else b"\0")


def _data_key(run_key: bytes, header: Header) -> bytes:
    if len(run_key) != RUN_KEY_SIZE:
        raise ValueError(f"run key of {len(run_key)} bytes, expected {RUN_KEY_SIZE}")
    kdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=header.salt, info=_KDF_INFO)
    return kdf.derive(run_key + header.key_id)


class Sealer:
    """Seals the chunks of one object (name, run key, a fresh salt)."""

    def __init__(self, run_key: bytes, key_id: bytes, name: str) -> None:
        self.header = Header.new(key_id)
        self.header_bytes = self.header.to_bytes()
        self._aead = AESGCM(_data_key(run_key, self.header))
        self._ad = self.header_bytes + name.encode()

    def seal(self, index: int, plaintext: bytes | memoryview, last: bool) -> bytes:
        if len(plaintext) > CHUNK_SIZE or (not last and len(plaintext) != CHUNK_SIZE):
            raise ValueError(f"chunk {index} of {len(plaintext)} bytes")
        return self._aead.encrypt(_nonce(index, last), bytes(plaintext), self._ad)


class Opener:
    """Opens the chunks of one object whose plaintext size is known (from the manifest)."""

    def __init__(self, run_key: bytes, header: Header, name: str, plain_size: int) -> None:
        self.name = name
        self.plain_size = plain_size
        self.chunks = chunk_count(plain_size)
        self._aead = AESGCM(_data_key(run_key, header))
        self._ad = header.to_bytes() + name.encode()

    def cipher_length(self, index: int) -> int:
        return chunk_plain_length(index, self.plain_size) + TAG_SIZE

    def open(self, index: int, sealed: bytes | bytearray | memoryview) -> bytes:
        """The plaintext of chunk `index`; `ObjectTampered` naming the object if it fails."""
        if not 0 <= index < self.chunks or len(sealed) != self.cipher_length(index):
            raise ObjectTampered(
                f"object {self.name!r}: chunk {index} has {len(sealed)} bytes; the manifest's"
                f" size {self.plain_size} allows {self.chunks} chunks"
            )
        return open_chunk(
            self._aead, self._ad, self.name, index, sealed, last=index == self.chunks - 1
        )


def open_chunk(
    aead: AESGCM,
    ad: bytes,
    name: str,
    index: int,
    sealed: bytes | bytearray | memoryview,
    *,
    last: bool,
) -> bytes:
    try:
        return aead.decrypt(_nonce(index, last), bytes(sealed), ad)
    except InvalidTag:
        raise ObjectTampered(
            f"object {name!r}: chunk {index} does not verify (changed, truncated, reordered,"
            " or not this object's); refused"
        ) from None


RunKeyOf = Callable[[bytes], bytes]
"""The run key of a key id (unwrapped with the restore's identity), or an `EnvelopeError`."""


def decrypt_whole(data: bytes | memoryview, name: str, run_key_of: RunKeyOf) -> bytes:
    """A small object whose size nobody recorded, opened whole (see `streams.decrypt_stream`)."""
    from ringsnap.agent.s3.crypto.streams import decrypt_stream

    out = io.BytesIO()
    decrypt_stream(io.BytesIO(data), out, name, run_key_of)
    return out.getvalue()


def opener_parts(header: Header, run_key: bytes, name: str) -> tuple[AESGCM, bytes]:
    """The AEAD and associated data of an object whose size is not known (`decrypt_stream`)."""
    return AESGCM(_data_key(run_key, header)), header.to_bytes() + name.encode()


def encrypt_whole(data: bytes, name: str, run_key: bytes, key_id: bytes) -> bytes:
    """`data` sealed whole (for small objects; files go through `EncryptingReader`)."""
    sealer = Sealer(run_key, key_id, name)
    out = bytearray(sealer.header_bytes)
    count = chunk_count(len(data))
    for index in range(count):
        piece = data[index * CHUNK_SIZE : (index + 1) * CHUNK_SIZE]
        out += sealer.seal(index, piece, index == count - 1)
    return bytes(out)
