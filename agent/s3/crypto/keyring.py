"""Run keys and their key objects: the only encrypted-copy state that rotation rewrites.

One export run of one node makes one **run key** (32 random bytes, a random 16-byte id); every
object of that run gets its own data key derived from it with the object's salt (`envelope`).
Why per run and not a wrapped key per object: the wrapped keys live in a small key object of
their own, `keys/<node>/<key id>.json`, so a rotation (a new recipient, one removed) rewrites one
key object per node and export run and **no data object**; a wrapped key inside every object
would make a rotation rewrite the copy. Per run and not per cluster: a node may only wrap (it
holds public keys), so it cannot reuse a key made elsewhere; a run key lives only in the
exporting process.

A key object (JSON, at most 64 KiB):

    {"format": "ringsnap-run-key/1", "key_id": "<32 hex>",
     "stanzas": [{"kind": "age", "recipient": "age1...", "body": "<base64>"}, ...]}

One stanza per recipient, naming it: `ringsnap show` and a refused restore can say which keys
open a copy. A stanza's body is bound to the key id (`recipients`).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ringsnap.agent.s3.crypto.envelope import KEY_ID_SIZE, RUN_KEY_SIZE
from ringsnap.agent.s3.crypto.recipients import Identity, Recipient, WrapError

FORMAT = "ringsnap-run-key/1"
MAX_OBJECT_BYTES = 64 * 1024
MAX_STANZAS = 32
_MAX_BODY_BYTES = 4096
_KINDS = ("age", "kms")
_MAX_LABEL = 2048


class KeyObjectInvalid(Exception):
    """A key object that is not one ringsnap wrote (damaged or hostile); names the object."""


class KeyUnavailable(Exception):
    """None of the identities given opens the run key; names the recipients that would."""


@dataclass(frozen=True, slots=True)
class RunKey:
    key_id: bytes
    secret: bytes

    def __repr__(self) -> str:  # never the secret
        return f"RunKey({self.key_id.hex()})"


@dataclass(frozen=True, slots=True)
class Stanza:
    kind: str
    recipient: str
    body: bytes

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.recipient}"


@dataclass(frozen=True, slots=True)
class WrappedKey:
    key_id: bytes
    stanzas: tuple[Stanza, ...]

    @property
    def recipients(self) -> list[str]:
        return [stanza.label for stanza in self.stanzas]

    def to_bytes(self) -> bytes:
        return json.dumps(
            {
                "format": FORMAT,
                "key_id": self.key_id.hex(),
                "stanzas": [
                    {
                        "kind": s.kind,
                        "recipient": s.recipient,
                        "body": base64.b64encode(s.body).decode("ascii"),
                    }
                    for s in self.stanzas
                ],
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def parse(cls, data: bytes, name: str) -> WrappedKey:
        """A key object read back from the bucket, every field checked; refused naming `name`."""

        def refuse(why: str) -> KeyObjectInvalid:
            return KeyObjectInvalid(f"key object {name!r} {why}; refused")

        if len(data) > MAX_OBJECT_BYTES:
            raise refuse(f"has {len(data)} bytes (at most {MAX_OBJECT_BYTES})")
        try:
            doc = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise refuse("is not UTF-8 JSON") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise refuse(f"is not a {FORMAT} object")
        key_id = _hex_id(doc.get("key_id"))
        if key_id is None:
            raise refuse("has no valid key_id (32 hex digits)")
        raw = doc.get("stanzas")
        if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_STANZAS:
            raise refuse(f"must list 1 to {MAX_STANZAS} stanzas")
        stanzas = []
        for item in raw:
            stanza = _stanza(item)
            if stanza is None:
                raise refuse("has a malformed stanza (kind, recipient, base64 body)")
            stanzas.append(stanza)
        if len({s.label for s in stanzas}) != len(stanzas):
            raise refuse("names a recipient twice")
        return cls(key_id, tuple(stanzas))


def _hex_id(value: object) -> bytes | None:
    if not isinstance(value, str) or len(value) != 2 * KEY_ID_SIZE:
        return None
    try:
        return bytes.fromhex(value)
    except ValueError:
        return None


def _stanza(item: object) -> Stanza | None:
    if not isinstance(item, dict) or set(item) != {"kind", "recipient", "body"}:
        return None
    kind, recipient, body = item["kind"], item["recipient"], item["body"]
    if kind not in _KINDS or not isinstance(recipient, str) or not isinstance(body, str):
        return None
    if not 0 < len(recipient) <= _MAX_LABEL or not recipient.isprintable() or " " in recipient:
        return None
    if len(body) > _MAX_BODY_BYTES * 2:
        return None
    try:
        decoded = base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        return None
    return Stanza(kind, recipient, decoded) if 0 < len(decoded) <= _MAX_BODY_BYTES else None


def _wrap_all(run_key: RunKey, recipients: Iterable[Recipient]) -> list[Stanza]:
    return [Stanza(r.kind, r.label, r.wrap(run_key.key_id, run_key.secret)) for r in recipients]


def new_run_key(recipients: Sequence[Recipient]) -> tuple[RunKey, WrappedKey]:
    """A fresh run key and its key object for `recipients` (at least one)."""
    if not recipients:
        raise WrapError("encryption needs at least one recipient")
    if len({(r.kind, r.label) for r in recipients}) != len(recipients):
        raise WrapError("a recipient is listed twice")
    run_key = RunKey(os.urandom(KEY_ID_SIZE), os.urandom(RUN_KEY_SIZE))
    return run_key, WrappedKey(run_key.key_id, tuple(_wrap_all(run_key, recipients)))


def unwrap(wrapped: WrappedKey, identities: Sequence[Identity], name: str) -> RunKey:
    """The run key, opened by the first identity whose recipient has a stanza.

    `KeyUnavailable` names the recipients the key object has when no identity matches one, or
    why the matching ones failed."""
    failures = []
    for stanza in wrapped.stanzas:
        for identity in identities:
            if identity.kind != stanza.kind or identity.label != stanza.recipient:
                continue
            try:
                secret = identity.unwrap(wrapped.key_id, stanza.body)
            except WrapError as exc:
                failures.append(str(exc))
                continue
            return RunKey(wrapped.key_id, secret)
    needed = ", ".join(wrapped.recipients)
    if failures:
        raise KeyUnavailable(
            f"key object {name!r}: the given key does not open it ({'; '.join(failures)})"
        )
    given = ", ".join(f"{i.kind}:{i.label}" for i in identities) or "none"
    raise KeyUnavailable(
        f"key object {name!r} opens only with the secret key of one of: {needed} (given: {given})"
    )


def rewrap(
    wrapped: WrappedKey,
    identities: Sequence[Identity],
    name: str,
    *,
    add: Sequence[Recipient] = (),
    remove: Sequence[str] = (),
) -> WrappedKey:
    """The key object with stanzas for `add` and without those whose label (`kind:recipient`) is
    in `remove`; the run key itself (and so every data object) stays as it is."""
    unknown = set(remove) - set(wrapped.recipients)
    if unknown:
        raise WrapError(f"key object {name!r} has no recipient {', '.join(sorted(unknown))}")
    run_key = unwrap(wrapped, identities, name)
    kept = [s for s in wrapped.stanzas if s.label not in remove]
    labels = {s.label for s in kept}
    added = [s for s in _wrap_all(run_key, add) if s.label not in labels]
    stanzas = tuple(kept + added)
    if not stanzas:
        raise WrapError(f"key object {name!r}: removing every recipient would lose the copy")
    if len(stanzas) > MAX_STANZAS:
        raise WrapError(f"key object {name!r}: more than {MAX_STANZAS} recipients")
    return WrappedKey(wrapped.key_id, stanzas)
