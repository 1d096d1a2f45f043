"""The encrypted object format: round trips at chunk edges, ranged spans, and every tampering the
issue names (a flipped byte, a truncated object, two chunks swapped, an object under another
name, a changed header) refused as `ObjectTampered`/`EnvelopeError` naming the object."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ringsnap.agent.s3.crypto.envelope import (
    CHUNK_SIZE,
    CIPHER_CHUNK,
    HEADER_SIZE,
    TAG_SIZE,
    EnvelopeError,
    Header,
    ObjectTampered,
    Opener,
    chunk_count,
    chunk_offset,
    chunk_span,
    cipher_size,
    decrypt_whole,
    encrypt_whole,
)
from ringsnap.agent.s3.crypto.streams import DecryptingWriter, EncryptingReader

KEY_ID = bytes(range(16))
RUN_KEY = os.urandom(32)
NAME = "sstables/node1/shop/orders-0a/nb-1-big-k0123/Data.db-300000"


def run_key_of(key_id: bytes) -> bytes:
    assert key_id == KEY_ID
    return RUN_KEY


def _sealed(plain: bytes, name: str = NAME) -> bytes:
    return encrypt_whole(plain, name, RUN_KEY, KEY_ID)


def _open_span(blob: bytes, plain_size: int, start: int, length: int, name: str = NAME) -> bytes:
    """Plaintext bytes start..start+length through the ranged path: header parsed from the
    object's first bytes, the span's chunks fed in odd-sized pieces."""
    header = Header.parse(blob[:HEADER_SIZE], name)
    opener = Opener(RUN_KEY, header, name, plain_size)
    span = chunk_span(start, length, plain_size)
    out = bytearray()
    writer = DecryptingWriter(opener, span.first, span.count, out.extend)
    cipher = blob[span.cipher_start : span.cipher_start + span.cipher_length]
    for at in range(0, len(cipher), 7919):  # a prime: pieces never align with chunks
        writer.write(memoryview(cipher)[at : at + 7919])
    assert writer.complete
    skip = start - span.plain_start
    return bytes(out[skip : skip + length])


@pytest.mark.parametrize(
    "size", [0, 1, CHUNK_SIZE - 1, CHUNK_SIZE, CHUNK_SIZE + 1, 3 * CHUNK_SIZE, 3 * CHUNK_SIZE + 5]
)
def test_round_trip_at_chunk_edges(size: int) -> None:
    plain = os.urandom(size)
    blob = _sealed(plain)
    assert len(blob) == cipher_size(size) == HEADER_SIZE + size + TAG_SIZE * chunk_count(size)
    assert decrypt_whole(blob, NAME, run_key_of) == plain
    assert _open_span(blob, size, 0, size) == plain
    assert size < 16 or plain[:64] not in blob  # ciphertext, not the bytes


@given(
    size=st.integers(0, 5 * CHUNK_SIZE),
    start_fraction=st.floats(0, 1),
    length_fraction=st.floats(0, 1),
)
@settings(max_examples=60, deadline=None, derandomize=True)
def test_any_plaintext_range_maps_to_whole_chunks(
    size: int, start_fraction: float, length_fraction: float
) -> None:
    plain = os.urandom(size)
    blob = _sealed(plain)
    start = int(size * start_fraction)
    length = int((size - start) * length_fraction)
    span = chunk_span(start, length, size)
    assert span.plain_start <= start
    assert start + length <= span.plain_start + span.plain_length
    assert span.cipher_start == chunk_offset(span.first)
    assert span.cipher_start + span.cipher_length <= len(blob)
    assert _open_span(blob, size, start, length) == plain[start : start + length]


def test_encrypting_reader_is_the_same_object_whatever_the_reads_and_seeks(tmp_path: Path) -> None:
    plain = os.urandom(2 * CHUNK_SIZE + 123)
    path = tmp_path / "Data.db"
    path.write_bytes(plain)
    from ringsnap.agent.s3.crypto.envelope import Sealer

    sealer = Sealer(RUN_KEY, KEY_ID, NAME)
    with EncryptingReader(open(path, "rb"), len(plain), sealer) as reader:
        whole = reader.read()
        assert len(whole) == reader.size == cipher_size(len(plain))
        reader.seek(HEADER_SIZE + CIPHER_CHUNK - 3)  # a resend from the middle of a chunk
        assert reader.read(10) == whole[HEADER_SIZE + CIPHER_CHUNK - 3 :][:10]
        reader.seek(0)
        pieces = []
        while piece := reader.read(5000):
            pieces.append(piece)
        assert b"".join(pieces) == whole
    assert decrypt_whole(whole, NAME, run_key_of) == plain


def test_encrypting_reader_refuses_a_file_that_changed(tmp_path: Path) -> None:
    from ringsnap.agent.s3.crypto.envelope import Sealer

    path = tmp_path / "Data.db"
    path.write_bytes(b"x" * 100)
    with EncryptingReader(open(path, "rb"), 100, Sealer(RUN_KEY, KEY_ID, NAME)) as reader:
        path.write_bytes(b"y" * 50)
        with pytest.raises(OSError, match="changed while it was encrypted"):
            reader.read()


# --- tampering -------------------------------------------------------------------------------

PLAIN = os.urandom(3 * CHUNK_SIZE + 100)


@given(at=st.integers(0, cipher_size(len(PLAIN)) - 1), bit=st.integers(0, 7))
@settings(max_examples=80, deadline=None, derandomize=True)
def test_any_flipped_bit_is_refused(at: int, bit: int) -> None:
    blob = bytearray(_sealed(PLAIN))
    blob[at] ^= 1 << bit
    with pytest.raises(EnvelopeError):
        decrypt_whole(bytes(blob), NAME, run_key_of)
    with pytest.raises(EnvelopeError):
        _open_span(bytes(blob), len(PLAIN), 0, len(PLAIN))


@pytest.mark.parametrize("cut", [1, TAG_SIZE, 100, CIPHER_CHUNK - 1, 100 + TAG_SIZE])
def test_a_truncated_object_is_refused(cut: int) -> None:
    blob = _sealed(PLAIN)
    # Ending exactly at a chunk's end (cut = the last chunk whole) is the case a size check
    # alone would miss when the size is unknown: the new last chunk was sealed as not last.
    with pytest.raises(ObjectTampered, match="refused"):
        decrypt_whole(blob[:-cut], NAME, run_key_of)


def test_an_object_cut_at_a_chunk_boundary_is_refused() -> None:
    blob = _sealed(PLAIN)
    last_chunk = len(blob) - chunk_offset(chunk_count(len(PLAIN)) - 1)
    with pytest.raises(ObjectTampered, match="chunk 2 does not verify"):
        decrypt_whole(blob[:-last_chunk], NAME, run_key_of)
    # With the size the manifest gives, the missing chunk is missing bytes.
    writer_plain = bytearray()
    opener = Opener(RUN_KEY, Header.parse(blob, NAME), NAME, len(PLAIN))
    writer = DecryptingWriter(opener, 0, opener.chunks, writer_plain.extend)
    writer.write(blob[HEADER_SIZE:-last_chunk])
    assert not writer.complete


def test_two_chunks_swapped_are_refused() -> None:
    blob = _sealed(PLAIN)
    first, second = chunk_offset(0), chunk_offset(1)
    swapped = (
        blob[:first]
        + blob[second : second + CIPHER_CHUNK]
        + blob[first : first + CIPHER_CHUNK]
        + blob[second + CIPHER_CHUNK :]
    )
    assert len(swapped) == len(blob)
    with pytest.raises(ObjectTampered, match="chunk 0 does not verify"):
        decrypt_whole(swapped, NAME, run_key_of)
    with pytest.raises(ObjectTampered, match="chunk 0 does not verify"):
        _open_span(swapped, len(PLAIN), 0, len(PLAIN))


def test_an_object_under_another_name_is_refused() -> None:
    blob = _sealed(PLAIN)
    other = NAME.replace("Data.db", "Index.db")
    with pytest.raises(ObjectTampered, match=r"Index\.db"):
        decrypt_whole(blob, other, run_key_of)
    with pytest.raises(ObjectTampered):
        _open_span(blob, len(PLAIN), CHUNK_SIZE, 10, other)


def test_a_chunk_of_another_object_of_the_same_run_is_refused() -> None:
    blob, other = _sealed(PLAIN), _sealed(PLAIN)  # same run key and name, other salts
    assert blob[HEADER_SIZE:] != other[HEADER_SIZE:]
    mixed = blob[: chunk_offset(1)] + other[chunk_offset(1) :]
    with pytest.raises(ObjectTampered, match="chunk 1"):
        decrypt_whole(mixed, NAME, run_key_of)


def test_a_foreign_header_is_refused_before_any_key_is_looked_up() -> None:
    for bad, why in [
        (b"PK\3\4" + bytes(60), "no magic"),
        (b"RSE1\x02\x10" + bytes(60), "format 2"),
        (b"RSE1\x01\x14" + bytes(60), "2\\^20"),
        (b"RSE1\x01\x10\x00\x01" + bytes(60), "reserved"),
        (b"RSE1", "shorter than"),
    ]:
        with pytest.raises(EnvelopeError, match=why):
            decrypt_whole(bad, NAME, lambda _: pytest.fail("key looked up"))


def test_too_many_bytes_for_a_span_are_refused() -> None:
    blob = _sealed(b"abc")
    opener = Opener(RUN_KEY, Header.parse(blob, NAME), NAME, 3)
    writer = DecryptingWriter(opener, 0, 1, io.BytesIO().write)
    with pytest.raises(ObjectTampered, match="more bytes"):
        writer.write(blob[HEADER_SIZE:] + b"!")


@pytest.mark.parametrize("size", [0, 5, CHUNK_SIZE, 2 * CHUNK_SIZE + 9])
def test_decrypt_stream_writes_only_verified_chunks(size: int) -> None:
    from ringsnap.agent.s3.crypto.streams import decrypt_stream

    plain = os.urandom(size)
    blob = _sealed(plain)
    out = io.BytesIO()
    assert decrypt_stream(io.BytesIO(blob), out, NAME, run_key_of) == size
    assert out.getvalue() == plain
    if size > CHUNK_SIZE:
        damaged = bytearray(blob)
        damaged[-1] ^= 1
        out = io.BytesIO()
        with pytest.raises(ObjectTampered, match="chunk 2"):
            decrypt_stream(io.BytesIO(bytes(damaged)), out, NAME, run_key_of)
        assert out.getvalue() == plain[: 2 * CHUNK_SIZE]  # the chunks before it, verified
