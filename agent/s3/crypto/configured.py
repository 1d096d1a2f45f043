"""The recipients `[s3.encryption]` names, as the nodes (exports) and the coordinator (the
catalog mirror) wrap run keys for them: public keys, and KMS keys they may encrypt with only;
never one that opens a copy."""

from __future__ import annotations

from ringsnap.agent.s3.crypto.kms import kms_recipients
from ringsnap.agent.s3.crypto.recipients import AgeRecipient, Recipient
from ringsnap.agent.s3.settings import S3Encryption


def configured_recipients(encryption: S3Encryption) -> list[Recipient]:
    """Every recipient of `encryption`: the age keys, then the KMS keys, as configured."""
    found: list[Recipient] = [AgeRecipient(r) for r in encryption.recipients]
    found += kms_recipients(encryption)
    return found
