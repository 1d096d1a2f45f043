"""The restore's keys of an encrypted copy as a request carries them (DownloadFromS3, the plan's
checks): turned into identities for that one call, never logged, never written anywhere.

A node holds public keys only (`[s3.encryption] recipients`): it can seal new copies, never open
old ones. The secret key (an age key, or the right to decrypt with a KMS key: `crypto.kms`) comes
from the coordinator with the request, over the agent's mutual-TLS
channel, for the download of one restore; the agent keeps it in memory while that call runs.
"""

from __future__ import annotations

from collections.abc import Sequence

from ringsnap.agent.s3.crypto.kms import MAX_LINE, kms_identity, parse_kms_line
from ringsnap.agent.s3.crypto.recipients import AgeIdentity, Identity, WrapError
from ringsnap.agent.s3.settings import S3Encryption
from ringsnap.api.v1 import agent_pb2
from ringsnap.errors import ValidationError

#: As many as a key object may have recipients.
MAX_KEYS = 32
#: An age X25519 secret key is 74 characters; room for whitespace around it.
_MAX_SECRET = 256


def identities_of(
    keys: Sequence[agent_pb2.RestoreKey], encryption: S3Encryption | None = None
) -> list[Identity]:
    """The identities of a request's `keys`: age secret keys, and KMS rights (a KMS client of
    `encryption`'s endpoint with the credentials the key carries); refused, never quoting a
    secret, when one is neither."""
    if len(keys) > MAX_KEYS:
        raise ValidationError(f"keys: {len(keys)} restore keys (at most {MAX_KEYS})")
    found: list[Identity] = []
    for index, key in enumerate(keys):
        if key.kind == "kms":
            if not key.secret or len(key.secret) > MAX_LINE:
                raise ValidationError(f"keys[{index}]: not a kms restore key")
            try:
                found.append(kms_identity(encryption, parse_kms_line(key.secret, f"keys[{index}]")))
            except WrapError as exc:
                raise ValidationError(str(exc)) from None
            continue
        if key.kind != "age":
            raise ValidationError(
                f"keys[{index}]: kind {key.kind[:20]!r} is not one this agent opens copies with"
                " (age, kms)"
            )
        if not key.secret or len(key.secret) > _MAX_SECRET:
            raise ValidationError(f"keys[{index}]: not an age secret key (AGE-SECRET-KEY-1...)")
        try:
            found.append(AgeIdentity(key.secret))
        except WrapError as exc:
            raise ValidationError(f"keys[{index}]: {exc}") from None
    return found
