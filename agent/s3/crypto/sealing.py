"""Encryption as the export and the download use it: one export run's sealing, one download's
unsealing, both against the bucket's key objects (`<prefix>keys/<node>/<key id>.json`).

- `ExportSealing.start` makes the run key and writes its key object **before** any object sealed
  with it: an object whose key object is missing could never be opened.
- Objects are bound to their name below the layout's prefix (the associated data), so a copy of
  the whole prefix elsewhere (another bucket, another prefix) still opens, and an object moved to
  another name does not.
- `Unsealing` finds the key object of each key id an object's header names, unwraps it with the
  restore's identities (once per key id) and keeps the run key in memory for this download only.
  Without an identity that opens it, the refusal names the recipients that would.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO

from ringsnap.agent.s3.client import S3Client
from ringsnap.agent.s3.crypto.configured import configured_recipients
from ringsnap.agent.s3.crypto.envelope import (
    HEADER_SIZE,
    MAGIC,
    EnvelopeError,
    Header,
    Opener,
    Sealer,
    chunk_count,
    encrypt_whole,
)
from ringsnap.agent.s3.crypto.keyring import (
    KeyObjectInvalid,
    KeyUnavailable,
    RunKey,
    WrappedKey,
    new_run_key,
    unwrap,
)
from ringsnap.agent.s3.crypto.names import NameKey
from ringsnap.agent.s3.crypto.recipients import Identity, Recipient
from ringsnap.agent.s3.crypto.references import write_references
from ringsnap.agent.s3.crypto.streams import DecryptingWriter, EncryptingReader
from ringsnap.agent.s3.layout import Layout
from ringsnap.agent.s3.settings import S3Encryption


def is_sealed(first_bytes: bytes) -> bool:
    """Whether an object starting with `first_bytes` is encrypted (a plain manifest is gzip)."""
    return first_bytes[: len(MAGIC)] == MAGIC


#: What a refusal of an encrypted copy tells the operator to do.
KEY_HINT = (
    "give the restore the secret key of one of those recipients (`ringsnap restore ... --from s3"
    " --key-file FILE`, a path or credential:NAME); a resumed restore needs it again: the key is"
    " held for that run only, never stored"
)


def key_problem(
    client: S3Client,
    bucket: str,
    layout: Layout,
    node: str,
    identities: Sequence[Identity],
    *,
    key: str,
    head: bytes,
) -> str:
    """Why the restore's `identities` cannot open the encrypted object `key` (whose first bytes
    are `head`), naming the recipients that would; '' when one opens its run key. Nothing is
    decrypted but the run key (unwrapped once, then forgotten)."""
    try:
        header = Header.parse(head, key)
    except EnvelopeError as exc:
        return str(exc)
    keys = Unsealing(client, bucket, layout, node, identities)
    try:
        keys.run_key_of(header.key_id)
    except EnvelopeError as exc:
        return f"{key!r} is encrypted and the restore's keys do not open it: {exc}; {KEY_HINT}"
    return ""


class ExportSealing:
    """One export run of one node: its run key, its key object, its keyed names."""

    def __init__(self, encryption: S3Encryption, layout: Layout, node: str) -> None:
        self._recipients: list[Recipient] = configured_recipients(encryption)
        self._name_secret = bytes.fromhex(encryption.name_key_file.get_secret_value().strip())
        self._names = NameKey(self._name_secret, "[s3.encryption] name_key_file")
        self._layout = layout
        self._node = node
        self._run_key: RunKey | None = None

    def start(self, client: S3Client, bucket: str) -> str:
        """Make the run key and write its key object; returns the key object's key."""
        run_key, wrapped = new_run_key(self._recipients)
        key = self._layout.key_object_key(self._node, run_key.key_id.hex())
        client.put_object(Bucket=bucket, Key=key, Body=wrapped.to_bytes())
        self._run_key = run_key
        return key

    @property
    def _key(self) -> RunKey:
        if self._run_key is None:
            raise RuntimeError("ExportSealing.start was not called")
        return self._run_key

    def put_references(
        self, client: S3Client, bucket: str, backup_id: str, keys: list[str]
    ) -> None:
        """Write the reference list of this run's manifest (`crypto.references`)."""
        body = write_references(self._name_secret, self._layout, backup_id, self._node, keys)
        key = self._layout.references_key(backup_id, self._node)
        client.put_object(Bucket=bucket, Key=key, Body=body)

    def sstable_tag(self, plain_address: str) -> str:
        """What stands for the Data.db CRC32 in an encrypted copy's component keys."""
        return "k" + self._names.address(plain_address)

    def sealer(self, key: str) -> Sealer:
        """A sealer of the object `key` (one per object: its salt must not change across reads)."""
        return Sealer(self._key.secret, self._key.key_id, self._layout.object_name(key))

    def reader(self, path: str | Path, plain_size: int, sealer: Sealer) -> EncryptingReader:
        return EncryptingReader(open(path, "rb"), plain_size, sealer)

    def seal_bytes(self, key: str, data: bytes) -> bytes:
        return encrypt_whole(
            data, self._layout.object_name(key), self._key.secret, self._key.key_id
        )


class Unsealing:
    """One download's keys: key objects read as their ids come, unwrapped with `identities`."""

    def __init__(
        self,
        client: S3Client,
        bucket: str,
        layout: Layout,
        node: str,
        identities: Sequence[Identity],
    ) -> None:
        self._client = client
        self._bucket = bucket
        self._layout = layout
        self._node = node
        self._identities = tuple(identities)
        self._keys: dict[bytes, bytes] = {}
        self._lock = threading.Lock()

    def run_key_of(self, key_id: bytes) -> bytes:
        with self._lock:
            if key_id not in self._keys:
                self._keys[key_id] = self._unwrap(key_id)
            return self._keys[key_id]

    def _unwrap(self, key_id: bytes) -> bytes:
        key = self._layout.key_object_key(self._node, key_id.hex())
        try:
            body = self._client.get_object(Bucket=self._bucket, Key=key)["Body"]
            try:
                data = body.read(64 * 1024 + 1)
            finally:
                body.close()
        except Exception as exc:
            raise EnvelopeError(
                f"key object {key!r} cannot be read ({exc}); without it the copy's objects of"
                " that export cannot be opened"
            ) from None
        try:
            return unwrap(WrappedKey.parse(data, key), self._identities, key).secret
        except (KeyObjectInvalid, KeyUnavailable) as exc:
            raise EnvelopeError(str(exc)) from None

    def recipients_of(self, key_id: bytes) -> list[str]:
        """The recipients a key object names (readable without any identity)."""
        key = self._layout.key_object_key(self._node, key_id.hex())
        body = self._client.get_object(Bucket=self._bucket, Key=key)["Body"]
        try:
            return WrappedKey.parse(body.read(64 * 1024 + 1), key).recipients
        finally:
            body.close()

    def opener(self, header: Header, key: str, plain_size: int) -> Opener:
        return Opener(
            self.run_key_of(header.key_id), header, self._layout.object_name(key), plain_size
        )

    def whole_writer(
        self, key: str, plain_size: int, sink: Callable[[bytes], object]
    ) -> HeaderFirst:
        """A writer of a whole object's bytes (header first) into `sink` as plaintext."""
        return HeaderFirst(self, key, plain_size, sink)

    def decrypt_file(self, source: BinaryIO, out: BinaryIO, key: str) -> int:
        from ringsnap.agent.s3.crypto.streams import decrypt_stream

        return decrypt_stream(source, out, self._layout.object_name(key), self.run_key_of)

    def decrypt_bytes(self, data: bytes, key: str) -> bytes:
        from ringsnap.agent.s3.crypto.envelope import decrypt_whole

        return decrypt_whole(data, self._layout.object_name(key), self.run_key_of)


class HeaderFirst:
    """Takes an encrypted object from its first byte: the header, then its first `count` chunks
    (all by default), opened into `sink`. The run key is looked up once the header arrived (its
    id is in it)."""

    def __init__(
        self,
        keys: Unsealing,
        key: str,
        plain_size: int,
        sink: Callable[[bytes], object],
        count: int | None = None,
    ) -> None:
        self._count = chunk_count(plain_size) if count is None else count
        self._keys = keys
        self._key = key
        self._plain_size = plain_size
        self._sink = sink
        self._header = bytearray()
        self._chunks: DecryptingWriter | None = None

    def write(self, data: bytes | memoryview) -> int:
        view = memoryview(data)
        if self._chunks is None:
            need = HEADER_SIZE - len(self._header)
            self._header += view[:need]
            view = view[need:]
            if len(self._header) < HEADER_SIZE:
                return len(data)
            header = Header.parse(self._header, self._key)
            opener = self._keys.opener(header, self._key, self._plain_size)
            self._chunks = DecryptingWriter(opener, 0, self._count, self._sink)
        if view:
            self._chunks.write(view)
        return len(data)

    @property
    def complete(self) -> bool:
        return self._chunks is not None and self._chunks.complete
