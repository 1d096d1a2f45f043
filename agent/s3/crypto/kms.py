"""KMS recipients as configured, and the KMS rights a restore is given.

The node wraps run keys with `kms:Encrypt` under its own credentials (`[s3.encryption]
kms_access_key_id_file`/`kms_secret_access_key_file`, or boto3's chain: its instance profile),
which should not be allowed `kms:Decrypt`: a stolen node then opens no copy. Decrypting is done
where the copy is downloaded (each node, for a restore; the coordinator, for a catalog rebuild),
with the rights the restore is given, as an age secret key is given: a line of the key file

    kms <key id, ARN or alias> [<access key id> <secret access key> [<session token>]]

The key is the one `kms_keys` names (the stanza's label). With credentials (short-lived ones of
a restore role, `aws sts assume-role`, are meant), they travel with the request over the agent's
mutual-TLS channel and are used for that call only, never stored or logged. Without, the node's
own credentials are used: for an operator who grants its role `kms:Decrypt` for the restore's
time (a KMS grant) and retires the grant after.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import boto3
from botocore.config import Config

from ringsnap.agent.s3.crypto.recipients import KmsIdentity, KmsRecipient, WrapError, kms_key_id
from ringsnap.agent.s3.settings import S3Encryption

#: What starts a KMS line of a restore's key file.
LINE_PREFIX = "kms "
#: A line with a session token (STS tokens run to about 1,000 characters) and room around it.
MAX_LINE = 4096
_TIMEOUTS = Config(connect_timeout=10, read_timeout=30, retries={"max_attempts": 3})


@dataclass(frozen=True)
class KmsRights:
    """A restore's right to decrypt with one KMS key (see the module)."""

    key: str
    access_key_id: str = field(default="", repr=False)
    secret_access_key: str = field(default="", repr=False)
    session_token: str = field(default="", repr=False)

    def __repr__(self) -> str:  # never a credential
        return f"KmsRights({self.key}, {'given credentials' if self.access_key_id else 'own'})"


def is_kms_line(line: str) -> bool:
    return line.strip().startswith(LINE_PREFIX)


def parse_kms_line(line: str, source: str) -> KmsRights:
    """A `kms ...` line of a key file; refused naming `source`, never quoting a credential."""
    if len(line) > MAX_LINE:
        raise WrapError(f"{source}: a kms line longer than {MAX_LINE} characters")
    words = line.split()
    if words[:1] != ["kms"] or len(words) not in (2, 4, 5):
        raise WrapError(
            f"{source}: a kms line is `kms KEY [ACCESS_KEY_ID SECRET_ACCESS_KEY [SESSION_TOKEN]]`"
        )
    key = kms_key_id(words[1])
    return KmsRights(key, *words[2:])


def kms_client(encryption: S3Encryption | None, rights: KmsRights | None = None) -> Any:
    """A boto3 KMS client for `encryption`'s endpoint and region: with the restore's
    credentials when `rights` carries some, else the configured ones (or boto3's chain)."""
    # Without `[s3.encryption]` (a rotation's or rebuild's settings may lack it), its default
    # region: boto3 would otherwise refuse to make the client at all.
    options: dict[str, Any] = {"config": _TIMEOUTS, "region_name": "us-east-1"}
    if encryption is not None:
        options["region_name"] = encryption.kms_region
        if encryption.kms_endpoint_url:
            options["endpoint_url"] = encryption.kms_endpoint_url
    if rights is not None and rights.access_key_id:
        options["aws_access_key_id"] = rights.access_key_id
        options["aws_secret_access_key"] = rights.secret_access_key
        if rights.session_token:
            options["aws_session_token"] = rights.session_token
    elif encryption is not None and encryption.kms_access_key_id_file is not None:
        secret = encryption.kms_secret_access_key_file
        options["aws_access_key_id"] = encryption.kms_access_key_id_file.get_secret_value().strip()
        options["aws_secret_access_key"] = secret.get_secret_value().strip() if secret else ""
    return boto3.session.Session().client("kms", **options)


def kms_recipients(encryption: S3Encryption) -> list[KmsRecipient]:
    if not encryption.kms_keys:
        return []
    client = kms_client(encryption)
    return [KmsRecipient(client, key) for key in encryption.kms_keys]


def kms_identity(encryption: S3Encryption | None, rights: KmsRights) -> KmsIdentity:
    return KmsIdentity(kms_client(encryption, rights), rights.key)
