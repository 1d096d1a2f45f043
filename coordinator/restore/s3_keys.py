"""The secret keys an operator gives one restore from S3 of an encrypted copy.

Nodes hold public keys only (`[s3.encryption] recipients`): they write copies they cannot read.
The secret key (an age X25519 identity, `AGE-SECRET-KEY-1...`, or the right to decrypt with a KMS
key: a `kms KEY [credentials]` line, `ringsnap.agent.s3.crypto.kms`) is given to the restore that needs
it (`ringsnap restore ... --from s3 --key-file FILE`, a path or `credential:NAME` for a systemd
credential) and travels with each node's download request over the agent's mutual-TLS channel,
for that download only. It is never logged, never in a plan's document, the catalog or the run
journal: a resumed restore is given it again.

`RestoreKeys` hides its secrets from `repr` (and so from logs and tracebacks) and compares by
identity only, so that a plan holding one shows nothing of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ringsnap.agent.s3.crypto.key_file import read_key_text
from ringsnap.agent.s3.crypto.kms import MAX_LINE, is_kms_line, parse_kms_line
from ringsnap.agent.s3.crypto.recipients import WrapError, age_identities
from ringsnap.errors import ValidationError

#: As many as a key object may have recipients.
MAX_KEYS = 32
#: An age X25519 secret key is 74 characters; room for whitespace around it.
_MAX_SECRET = 256


@dataclass(frozen=True, eq=False)
class RestoreKeys:
    """Age secret keys and KMS rights for one restore; empty: none given (a plain copy needs
    none)."""

    age: tuple[str, ...] = field(default=(), repr=False)
    #: Their public keys (`age1...`) and KMS keys (`kms:...`): what refusals and logs may name.
    recipients: tuple[str, ...] = ()
    #: `kms KEY [credentials]` lines (`crypto.kms`).
    kms: tuple[str, ...] = field(default=(), repr=False)

    def __bool__(self) -> bool:
        return bool(self.age or self.kms)

    def __repr__(self) -> str:
        return f"RestoreKeys(for {', '.join(self.recipients) or 'nobody'})"

    @property
    def lines(self) -> tuple[str, ...]:
        """Every key as a line of a key file (what the API's `age_keys` carries)."""
        return self.age + self.kms

    @classmethod
    def of_text(cls, text: str, source: str) -> RestoreKeys:
        """The keys of an age key file's text (`age-keygen`'s: `#` comments, one key a line);
        refused naming `source`, never quoting a line of it. A `kms KEY [credentials]` line
        gives the right to decrypt with that KMS key (`crypto.kms`)."""
        lines = [
            line.strip()
            for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")
        ]
        kms = tuple(line for line in lines if is_kms_line(line))
        secrets = tuple(line for line in lines if not is_kms_line(line))
        if len(lines) > MAX_KEYS:
            raise ValidationError(f"{source}: {len(lines)} keys (at most {MAX_KEYS})")
        try:
            identities = age_identities("\n".join(secrets), source) if secrets or not kms else []
            rights = [parse_kms_line(line, source) for line in kms]
        except WrapError as exc:
            raise ValidationError(f"{source}: {exc}") from None
        labels = [i.label for i in identities] + [f"kms:{r.key}" for r in rights]
        return cls(secrets, tuple(labels), kms)

    @classmethod
    def of_reference(cls, reference: str) -> RestoreKeys:
        """The keys of the file at `reference`, or of the systemd credential `credential:NAME`."""
        text, source = read_key_text(reference, kind="an age key file")
        return cls.of_text(text, source)


NO_KEYS = RestoreKeys()


def restore_keys_of(age_keys: Sequence[str], field: str = "age_keys") -> RestoreKeys:
    """The keys an API request carries (`age_keys`), each an age secret key or a `kms ...` line;
    refused naming the field and the index, never quoting one."""
    if not age_keys:
        return NO_KEYS
    if len(age_keys) > MAX_KEYS:
        raise ValidationError(f"{field}: {len(age_keys)} keys (at most {MAX_KEYS})")
    for index, secret in enumerate(age_keys):
        limit = MAX_LINE if is_kms_line(secret) else _MAX_SECRET
        if len(secret) > limit or "\n" in secret:
            raise ValidationError(f"{field}[{index}]: not an age secret key (AGE-SECRET-KEY-1...)")
    return RestoreKeys.of_text("\n".join(age_keys), field)
