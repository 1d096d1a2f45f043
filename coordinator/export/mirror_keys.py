"""The catalog mirror encrypted like the copies it describes, and opened again by a rebuild.

A mirror holds what an encrypted copy hides: every SSTable's file name, size and plaintext digest,
the keyspaces' schemas, the backup's nodes. With `[s3.encryption]` on, the coordinator (which
holds the same public recipients as the nodes, never a secret key) seals each mirror object like
a node seals its copy (`crypto.envelope`, the object bound to its name below the prefix), with a
run key of the mirror's own whose key object is written first, beside the objects:

    <prefix>catalog/<backup id>/key.json      the run key wrapped for the recipients (`keyring`)

It is deleted with the mirror (`delete_mirror`), and re-wrapped by a rotation with the copies'
key objects (`agent.s3.rekey`). A rebuild reads the key object first, for every backup it will
record, and refuses before recording anything when the identities it was given (`--key-file`) do
not open one, naming the recipients that would. An object of an encrypted mirror that is not
sealed is refused too: someone who can write to the bucket must not swap a sealed object for one
of their own in plain text.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from typing import IO

from botocore.exceptions import ClientError

from ringsnap.agent.s3.client import S3Client
from ringsnap.agent.s3.crypto.envelope import (
    MAGIC,
    EnvelopeError,
    RunKeyOf,
    decrypt_whole,
    encrypt_whole,
)
from ringsnap.agent.s3.crypto.keyring import (
    MAX_OBJECT_BYTES,
    KeyObjectInvalid,
    KeyUnavailable,
    RunKey,
    WrappedKey,
    new_run_key,
    unwrap,
)
from ringsnap.agent.s3.crypto.recipients import Identity, Recipient
from ringsnap.agent.s3.crypto.sealing import is_sealed
from ringsnap.agent.s3.crypto.streams import decrypt_stream
from ringsnap.agent.s3.layout import MIRROR_KEY_OBJECT, Layout
from ringsnap.errors import RingsnapError

KEY_OBJECT = MIRROR_KEY_OBJECT
#: A decrypted mirror manifest above this stays in a temporary file, not in memory.
_SPOOL_BYTES = 8 * 1024 * 1024
#: A sealed mirror manifest larger than this is not one (a hostile bucket must not fill the disk).
MAX_SEALED_BYTES = 4 * 1024 * 1024 * 1024

#: What a refused rebuild tells the operator to do.
KEY_HINT = (
    "give the rebuild the secret key of one of them: `ringsnap-coordinator catalog rebuild"
    " --from s3 --key-file FILE` (an age key file, or credential:NAME for a systemd credential)"
)


class MirrorLocked(RingsnapError):
    """An encrypted mirror the rebuild's keys do not open; nothing was recorded."""

    exit_code = 3


class MirrorSealing:
    """One backup's mirror as the coordinator writes it: a run key for the recipients."""

    def __init__(self, recipients: Sequence[Recipient], layout: Layout, backup_id: str) -> None:
        self._recipients = list(recipients)
        self._layout = layout
        self._backup_id = backup_id
        self._run_key: RunKey | None = None

    def start(self, client: S3Client, bucket: str) -> str:
        """Make the run key and write its key object (before any object sealed with it)."""
        run_key, wrapped = new_run_key(self._recipients)
        key = self._layout.catalog_key(self._backup_id, KEY_OBJECT)
        client.put_object(Bucket=bucket, Key=key, Body=wrapped.to_bytes())
        self._run_key = run_key
        return key

    def seal(self, key: str, data: bytes) -> bytes:
        if self._run_key is None:
            raise RuntimeError("MirrorSealing.start was not called")
        return encrypt_whole(
            data, self._layout.object_name(key), self._run_key.secret, self._run_key.key_id
        )


class MirrorKeys:
    """The run keys of the mirrors a rebuild reads, opened with the rebuild's identities."""

    def __init__(
        self, client: S3Client, bucket: str, layout: Layout, identities: Sequence[Identity]
    ) -> None:
        self._client = client
        self._bucket = bucket
        self._layout = layout
        self._identities = tuple(identities)
        #: backup id -> its run key, or None for a mirror in plain text.
        self._keys: dict[str, RunKey | None] = {}

    def load(self, backup_id: str) -> None:
        """Read and open the backup's key object (if its mirror has one); `MirrorLocked` naming
        the recipients when the identities do not open it."""
        key = self._layout.catalog_key(backup_id, KEY_OBJECT)
        try:
            body = self._client.get_object(Bucket=self._bucket, Key=key)["Body"]
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in ("NoSuchKey", "404"):
                raise
            self._keys[backup_id] = None  # a mirror in plain text
            return
        try:
            data = body.read(MAX_OBJECT_BYTES + 1)
        finally:
            body.close()
        try:
            wrapped = WrappedKey.parse(data, key)
        except KeyObjectInvalid as exc:
            raise MirrorLocked(f"{exc} (nothing was recorded)") from None
        if not self._identities:
            raise MirrorLocked(
                f"the catalog mirror of backup {backup_id} is encrypted for"
                f" {', '.join(wrapped.recipients)} ({key!r}); {KEY_HINT}; nothing was recorded"
            )
        try:
            self._keys[backup_id] = unwrap(wrapped, self._identities, key)
        except KeyUnavailable as exc:
            raise MirrorLocked(
                f"the catalog mirror of backup {backup_id}: {exc}; {KEY_HINT}; nothing was recorded"
            ) from None

    def encrypted(self, backup_id: str) -> bool:
        return self._keys.get(backup_id) is not None

    def _run_key_of(self, backup_id: str) -> RunKey | None:
        if backup_id not in self._keys:
            self.load(backup_id)
        return self._keys[backup_id]

    def _opener(self, run_key: RunKey, key: str) -> RunKeyOf:
        def run_key_of(key_id: bytes) -> bytes:
            if key_id != run_key.key_id:
                raise EnvelopeError(
                    f"object {key!r} is sealed with run key {key_id.hex()}, not its mirror's"
                    f" ({run_key.key_id.hex()}); refused"
                )
            return run_key.secret

        return run_key_of

    def open_bytes(self, backup_id: str, key: str, data: bytes) -> bytes:
        """The plaintext of a small mirror object read whole."""
        run_key = self._run_key_of(backup_id)
        if run_key is None:
            return data
        if not is_sealed(data):
            raise EnvelopeError(f"object {key!r} is in plain text in an encrypted mirror; refused")
        return decrypt_whole(data, self._layout.object_name(key), self._opener(run_key, key))

    def open_stream(self, backup_id: str, key: str, body: IO[bytes]) -> IO[bytes]:
        """The plaintext of a mirror object read as a stream (a manifest): the body itself for a
        plain mirror, else a spooled file of its verified plaintext, positioned at its start."""
        run_key = self._run_key_of(backup_id)
        if run_key is None:
            return body
        out: IO[bytes] = tempfile.SpooledTemporaryFile(max_size=_SPOOL_BYTES)  # noqa: SIM115 - the caller's
        try:
            with tempfile.SpooledTemporaryFile(max_size=_SPOOL_BYTES) as raw:
                copied = 0
                while piece := body.read(1024 * 1024):
                    copied += len(piece)
                    if copied > MAX_SEALED_BYTES:
                        raise EnvelopeError(
                            f"object {key!r} is larger than {MAX_SEALED_BYTES} bytes; refused"
                        )
                    raw.write(piece)
                raw.seek(0)
                if not is_sealed(raw.read(len(MAGIC))):
                    raise EnvelopeError(
                        f"object {key!r} is in plain text in an encrypted mirror; refused"
                    )
                raw.seek(0)
                name = self._layout.object_name(key)
                decrypt_stream(raw, out, name, self._opener(run_key, key))
        except BaseException:
            out.close()
            raise
        out.seek(0)
        return out
