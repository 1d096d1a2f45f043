"""Who can open a run key: recipients wrap it (what a node holds), identities unwrap it (restores).

A node holds recipients only: public age X25519 keys, or a KMS key it may `Encrypt` with (an IAM
policy without `Decrypt`). It can seal new copies and never open old ones. The identities (an age
secret key, a KMS key the restore may `Decrypt` with) are given to a restore and nowhere else.

Every wrapped payload is bound to its run key's id: an age payload carries the id in front of the
key, a KMS one as its encryption context. A stanza copied from another key object is refused.

Two kinds, one small interface (`Recipient.wrap`, `Identity.unwrap`), tested by one contract
(`tests/unit/test_s3_crypto_recipients.py`) that every kind passes.
"""

from __future__ import annotations

import hmac
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import pyrage

from ringsnap.agent.s3.crypto.envelope import KEY_ID_SIZE, RUN_KEY_SIZE

#: `age1` and 58 bech32 characters.
_AGE_RECIPIENT_LENGTH = 62
#: KMS key ids, ARNs and aliases (as AWS documents them; a stanza's label must be one).
_KMS_ID_MAX = 2048


class WrapError(Exception):
    """A run key could not be wrapped or unwrapped; the message says for whom and why."""


class Recipient(ABC):
    kind: ClassVar[str]

    @property
    @abstractmethod
    def label(self) -> str:
        """Public and stable: how a stanza names this recipient (shown, stored, matched)."""

    @abstractmethod
    def wrap(self, key_id: bytes, run_key: bytes) -> bytes:
        """`run_key` sealed for this recipient, bound to `key_id`."""


class Identity(ABC):
    kind: ClassVar[str]

    @property
    @abstractmethod
    def label(self) -> str:
        """The label of the recipient this identity opens."""

    @abstractmethod
    def unwrap(self, key_id: bytes, body: bytes) -> bytes:
        """The run key of `key_id` from a stanza body made by `wrap`; `WrapError` if not."""

    def __repr__(self) -> str:  # never the secret
        return f"<{type(self).__name__} for {self.label}>"


def _check_ids(key_id: bytes, run_key: bytes) -> None:
    if len(key_id) != KEY_ID_SIZE or len(run_key) != RUN_KEY_SIZE:
        raise ValueError("a run key is 32 bytes with a 16-byte id")


class AgeRecipient(Recipient):
    """An age X25519 public key (`age1...`)."""

    kind = "age"

    def __init__(self, text: str) -> None:
        text = text.strip()
        if not text.startswith("age1") or len(text) != _AGE_RECIPIENT_LENGTH:
            raise WrapError(f"{text[:70]!r} is not an age X25519 recipient (age1...)")
        try:
            self._recipient = pyrage.x25519.Recipient.from_str(text)
        except Exception:
            raise WrapError(f"{text!r} is not a valid age X25519 recipient") from None
        self._label = text

    @property
    def label(self) -> str:
        return self._label

    def wrap(self, key_id: bytes, run_key: bytes) -> bytes:
        _check_ids(key_id, run_key)
        return bytes(pyrage.encrypt(key_id + run_key, [self._recipient]))


class AgeIdentity(Identity):
    """An age X25519 secret key (`AGE-SECRET-KEY-1...`)."""

    kind = "age"

    def __init__(self, text: str) -> None:
        try:
            self._identity = pyrage.x25519.Identity.from_str(text.strip())
        except Exception:
            # Never the text: it is (nearly) a secret key.
            raise WrapError("not a valid age X25519 secret key (AGE-SECRET-KEY-1...)") from None
        self._label = str(self._identity.to_public())

    @property
    def label(self) -> str:
        return self._label

    def unwrap(self, key_id: bytes, body: bytes) -> bytes:
        try:
            payload = bytes(pyrage.decrypt(body, [self._identity]))
        except Exception as exc:
            raise WrapError(f"the age stanza for {self._label} does not open ({exc})") from None
        if len(payload) != KEY_ID_SIZE + RUN_KEY_SIZE or not hmac.compare_digest(
            payload[:KEY_ID_SIZE], key_id
        ):
            raise WrapError(f"the age stanza for {self._label} holds another key; refused")
        return payload[KEY_ID_SIZE:]


def age_identities(text: str, source: str) -> list[AgeIdentity]:
    """The identities of an age key file (`age-keygen`'s: `#` comments, one key a line)."""
    found = [
        AgeIdentity(line)
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    if not found:
        raise WrapError(f"{source} holds no age secret key (AGE-SECRET-KEY-1...)")
    return found


def _context(key_id: bytes) -> dict[str, str]:
    return {"ringsnap-run-key": key_id.hex()}


def kms_key_id(key: str) -> str:
    """A KMS key id, ARN or alias as a stanza may name it; `WrapError` otherwise."""
    if not key or len(key) > _KMS_ID_MAX or not key.isprintable() or any(c.isspace() for c in key):
        raise WrapError(f"{key[:80]!r} is not a KMS key id, ARN or alias")
    return key


class _KmsKey:
    """A KMS key (id, ARN or alias) through `client`, a boto3 KMS client: what the recipient that
    encrypts with it and the identity that decrypts with it both hold."""

    kind = "kms"

    def __init__(self, client: Any, key: str) -> None:
        self._client = client
        self._key = kms_key_id(key)

    @property
    def label(self) -> str:
        return self._key


class KmsRecipient(_KmsKey, Recipient):
    """A KMS key the node may `Encrypt` with."""

    def wrap(self, key_id: bytes, run_key: bytes) -> bytes:
        _check_ids(key_id, run_key)
        try:
            answer = self._client.encrypt(
                KeyId=self._key, Plaintext=run_key, EncryptionContext=_context(key_id)
            )
        except Exception as exc:
            raise WrapError(f"KMS key {self._key} would not encrypt the run key: {exc}") from None
        return bytes(answer["CiphertextBlob"])


class KmsIdentity(_KmsKey, Identity):
    """The same KMS key, for a restore allowed to `Decrypt` with it."""

    def unwrap(self, key_id: bytes, body: bytes) -> bytes:
        try:
            answer = self._client.decrypt(
                CiphertextBlob=body, KeyId=self._key, EncryptionContext=_context(key_id)
            )
        except Exception as exc:
            raise WrapError(f"KMS key {self._key} would not decrypt the run key: {exc}") from None
        plain = bytes(answer.get("Plaintext", b""))
        if len(plain) != RUN_KEY_SIZE:
            raise WrapError(f"KMS key {self._key} gave back {len(plain)} bytes, not a run key")
        return plain
