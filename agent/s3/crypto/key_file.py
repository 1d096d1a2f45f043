"""A key file as restores, catalog rebuilds and rotations take it, turned into identities: age
secret keys (`age-keygen`'s file: `#` comments, one key a line) and `kms KEY [credentials]`
lines (`crypto.kms`: the right to decrypt with that KMS key). Never quoted in an error."""

from __future__ import annotations

from ringsnap.agent.s3.crypto.kms import is_kms_line, kms_identity, parse_kms_line
from ringsnap.agent.s3.crypto.recipients import Identity, WrapError, age_identities
from ringsnap.agent.s3.settings import S3Encryption

#: As many as a key object may have recipients.
MAX_KEYS = 32


def key_file_identities(
    text: str, source: str, encryption: S3Encryption | None = None
) -> list[Identity]:
    """The identities of a key file's `text`; KMS ones call `encryption`'s KMS endpoint and
    region. `WrapError` naming `source` when a line is neither kind or none is given."""
    lines = [
        line.strip()
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    if len(lines) > MAX_KEYS:
        raise WrapError(f"{source}: {len(lines)} keys (at most {MAX_KEYS})")
    kms = [line for line in lines if is_kms_line(line)]
    age = [line for line in lines if not is_kms_line(line)]
    # With no kms line, age_identities refuses an empty file naming it.
    found: list[Identity] = list(age_identities("\n".join(age), source)) if age or not kms else []
    found += [kms_identity(encryption, parse_kms_line(line, source)) for line in kms]
    return found
