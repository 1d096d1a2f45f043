"""A key file as restores, catalog rebuilds and rotations take it, turned into identities: age
secret keys (`age-keygen`'s file: `#` comments, one key a line) and `kms KEY [credentials]`
lines (`crypto.kms`: the right to decrypt with that KMS key). Never quoted in an error."""

from __future__ import annotations

from pathlib import Path

from ringsnap.agent.s3.crypto.kms import is_kms_line, kms_identity, parse_kms_line
from ringsnap.agent.s3.crypto.recipients import Identity, WrapError, age_identities
from ringsnap.agent.s3.settings import S3Encryption
from ringsnap.config import read_secret
from ringsnap.errors import ValidationError

#: As many as a key object may have recipients.
MAX_KEYS = 32

#: A key file is small (age-keygen's is one line; a kms line with a session token about 1 KiB).
MAX_KEY_FILE_BYTES = 64 * 1024


def read_key_text(reference: str, *, kind: str = "a key file") -> tuple[str, str]:
    """The text of `--key-file` (a path, or the systemd credential `credential:NAME`) and how
    errors name it; a file that cannot be read, or is larger than `kind` can be, is refused
    without quoting it."""
    source = f"--key-file {reference}"
    if not reference.startswith("credential:"):
        try:
            size = Path(reference).stat().st_size
        except OSError as exc:
            raise ValidationError(f"{source}: cannot read it ({exc.strerror})") from None
        if size > MAX_KEY_FILE_BYTES:
            raise ValidationError(f"{source}: larger than {kind}; refused")
    try:
        return read_secret(reference).get_secret_value(), source
    except ValueError as exc:
        raise ValidationError(f"{source}: {exc}") from None


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
