"""Hostile input to the decryptor of encrypted S3 copies: key objects (wrapped run keys), stanza
bodies, object headers, chunk streams of any length, cut and spliced anywhere.

The oracle: a hostile input is refused with the module's own error naming the object
(`EnvelopeError`, `KeyObjectInvalid`, `WrapError`, `KeyUnavailable`), never another exception;
and nothing but the genuine object ever decrypts (a forged or damaged one yields no plaintext).

About 120 cases per target in CI (derandomized); `RINGSNAP_FUZZ_EXAMPLES=N` for a larger run.
"""

from __future__ import annotations

import base64
import json
import os
from typing import Any

import pyrage
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ringsnap.agent.s3.crypto.envelope import (
    CHUNK_SIZE,
    HEADER_SIZE,
    EnvelopeError,
    Header,
    Opener,
    chunk_count,
    decrypt_whole,
    encrypt_whole,
)
from ringsnap.agent.s3.crypto.keyring import (
    KeyObjectInvalid,
    KeyUnavailable,
    WrappedKey,
    new_run_key,
    unwrap,
)
from ringsnap.agent.s3.crypto.recipients import AgeIdentity, AgeRecipient, WrapError
from ringsnap.agent.s3.crypto.streams import DecryptingWriter
from tests.fuzz.protofuzz import fuzz_settings

NAME = "sstables/node1/shop/orders/nb-1-big-k00/Data.db-1"
_SECRET = pyrage.x25519.Identity.generate()
RECIPIENT = AgeRecipient(str(_SECRET.to_public()))
IDENTITY = AgeIdentity(str(_SECRET))
RUN_KEY, WRAPPED = new_run_key([RECIPIENT])
PLAIN = os.urandom(2 * CHUNK_SIZE + 77)
GENUINE = encrypt_whole(PLAIN, NAME, RUN_KEY.secret, RUN_KEY.key_id)

REFUSALS = (EnvelopeError, KeyObjectInvalid, WrapError, KeyUnavailable)


def _run_key_of(key_id: bytes) -> bytes:
    if key_id != RUN_KEY.key_id:
        raise EnvelopeError(f"object {NAME!r}: no key object for key id {key_id.hex()}")
    return RUN_KEY.secret


# --- key objects -------------------------------------------------------------------------------

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner),
    max_leaves=12,
)


def _genuine_doc() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(WRAPPED.to_bytes())
    return doc


@st.composite
def hostile_key_objects(draw: st.DrawFn) -> bytes:
    """A genuine key object with one field replaced, raw bytes, or JSON of any shape."""
    kind = draw(st.sampled_from(["field", "stanza", "bytes", "json", "cut"]))
    if kind == "bytes":
        return draw(st.binary(max_size=300))
    if kind == "json":
        return json.dumps(draw(_JSON)).encode()
    if kind == "cut":
        genuine = WRAPPED.to_bytes()
        return genuine[: draw(st.integers(0, len(genuine) - 1))]
    doc = _genuine_doc()
    if kind == "field":
        doc[draw(st.sampled_from(["format", "key_id", "stanzas", "extra"]))] = draw(_JSON)
    else:
        genuine_stanza = doc["stanzas"][0]
        stanza = dict(genuine_stanza)
        field = draw(st.sampled_from(["kind", "recipient", "body"]))
        stanza[field] = draw(
            _JSON
            | st.binary(max_size=400).map(lambda b: base64.b64encode(b).decode())
            | st.sampled_from(["kms", "age", "x" * 5000, "age1" + "q" * 58, "=="])
        )
        doc["stanzas"] = draw(
            st.sampled_from([[stanza], [stanza, stanza], [genuine_stanza, stanza]])
        )
    return json.dumps(doc).encode()


@given(data=hostile_key_objects())
@fuzz_settings()
def test_hostile_key_objects_are_refused_or_open_only_to_the_genuine_key(data: bytes) -> None:
    try:
        wrapped = WrappedKey.parse(data, "keys/node1/k.json")
        run_key = unwrap(wrapped, [IDENTITY], "keys/node1/k.json")
    except REFUSALS as exc:
        assert "keys/node1/k.json" in str(exc) or isinstance(exc, WrapError)
        return
    # Whatever opened is the genuine key of the genuine id, never one of the fuzzer's making.
    assert run_key == RUN_KEY


@given(body=st.binary(max_size=600), key_id=st.binary(min_size=16, max_size=16))
@fuzz_settings()
def test_hostile_stanza_bodies_are_refused(body: bytes, key_id: bytes) -> None:
    with pytest.raises(WrapError):
        IDENTITY.unwrap(key_id, body)


# --- headers and chunk streams -----------------------------------------------------------------


@st.composite
def hostile_objects(draw: st.DrawFn) -> bytes:
    """The genuine object cut, extended, spliced, with bytes replaced, or a forged header."""
    blob = bytearray(GENUINE)
    for _ in range(draw(st.integers(1, 3))):
        action = draw(st.sampled_from(["cut", "extend", "overwrite", "splice", "header"]))
        if action == "cut":
            del blob[draw(st.integers(0, max(0, len(blob) - 1))) :]
        elif action == "extend":
            blob += draw(st.binary(min_size=1, max_size=CHUNK_SIZE + 40))
        elif action == "overwrite":
            at = draw(st.integers(0, max(0, len(blob) - 1)))
            patch = draw(st.binary(min_size=1, max_size=32))
            blob[at : at + len(patch)] = patch
        elif action == "splice":
            start = draw(st.integers(0, len(GENUINE)))
            stop = draw(st.integers(start, len(GENUINE)))
            at = draw(st.integers(0, len(blob)))
            blob[at:at] = GENUINE[start:stop]
        else:
            fields = draw(st.binary(min_size=8, max_size=8))
            blob[:8] = draw(st.sampled_from([b"RSE1\x01\x10\0\0", fields, b"RSE1" + fields[4:]]))
    if bytes(blob) == GENUINE:
        blob.append(0)
    return bytes(blob)


@given(blob=hostile_objects())
@fuzz_settings()
def test_hostile_objects_never_decrypt_whole(blob: bytes) -> None:
    with pytest.raises(EnvelopeError):
        decrypt_whole(blob, NAME, _run_key_of)


@given(
    blob=hostile_objects(),
    plain_size=st.sampled_from([len(PLAIN), 0, 1, CHUNK_SIZE, 5 * CHUNK_SIZE]),
    pieces=st.lists(st.integers(1, 3 * CHUNK_SIZE), min_size=1, max_size=8),
)
@fuzz_settings()
def test_hostile_chunk_streams_are_refused_by_the_ranged_path(
    blob: bytes, plain_size: int, pieces: list[int]
) -> None:
    """The download's path: the header parsed, then the body fed in pieces of any length; only
    whole verified chunks come out, and never all of them from a hostile object."""
    out = bytearray()
    try:
        header = Header.parse(blob, NAME)
        opener = Opener(_run_key_of(header.key_id), header, NAME, plain_size)
        writer = DecryptingWriter(opener, 0, chunk_count(plain_size), out.extend)
        body, at = memoryview(blob)[HEADER_SIZE:], 0
        for size in [*pieces, len(blob)]:
            writer.write(body[at : at + size])
            at += size
    except EnvelopeError:
        pass
    else:
        assert not writer.complete, "a hostile object decrypted whole"
    assert bytes(out) == PLAIN[: len(out)], "unverified bytes came out"
