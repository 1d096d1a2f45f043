"""The `[s3]` settings: where the copies go and how the client talks to the store.

S3-compatible stores differ: S3Proxy and several appliances reject the flexible-checksum headers
(`x-amz-checksum-*`, `x-amz-sdk-checksum-algorithm`) recent botocore sends by default, so the
checksum behaviour is a setting (see `Checksums`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from ringsnap.config import SecretFile, Section

#: - `md5` (default): only Content-MD5, computed by ringsnap for every PutObject, UploadPart and
#:   DeleteObjects; botocore's flexible checksums off (`when_required`). Every S3-compatible store
#:   checks Content-MD5, S3Proxy included.
#: - `flexible`: botocore's defaults (`when_supported`: CRC checksums on every upload, validated on
#:   download); for AWS S3 and stores that implement the flexible checksums.
Checksums = Literal["md5", "flexible"]

MIB = 1024 * 1024


def _is_hex_key(text: str) -> bool:
    """32 bytes as 64 hex digits (`openssl rand -hex 32`)."""
    return len(text) == 64 and all(c in "0123456789abcdefABCDEF" for c in text)


class S3Encryption(Section):
    """`[s3.encryption]`: copies encrypted on the node before they leave it (docs/s3.md,
    "Encryption"). The node holds public keys only: it can write copies, never read them."""

    #: age X25519 public keys (`age1...`, from `age-keygen`) the copies are encrypted for; any one
    #: of their secret keys opens a copy.
    recipients: list[str] = Field(default_factory=list, max_length=32)
    #: KMS keys (id, ARN or alias) the copies' run keys are also wrapped with (`kms:Encrypt`);
    #: a restore allowed `kms:Decrypt` with one of them opens a copy. The node's credentials
    #: should be allowed to encrypt only (docs/s3.md, "KMS recipients").
    kms_keys: list[str] = Field(default_factory=list, max_length=8)
    kms_region: str = Field(default="us-east-1", pattern=r"^[a-z0-9-]{1,32}$")
    #: None: AWS KMS of `kms_region`; else a KMS-compatible endpoint.
    kms_endpoint_url: str | None = Field(default=None, pattern=r"^https?://[^\s/]+(/[^\s]*)?$")
    #: The node's credentials for KMS (a path or `credential:NAME`); both or neither (then
    #: boto3's own chain: environment, instance profile).
    kms_access_key_id_file: SecretFile | None = None
    kms_secret_access_key_file: SecretFile | None = None
    #: The cluster's name key: 64 hex digits (`openssl rand -hex 32`), the same on every node; a
    #: path or `credential:NAME`. Object names are keyed with it (no plaintext digest in them).
    name_key_file: SecretFile

    @model_validator(mode="after")
    def _valid(self) -> S3Encryption:
        from ringsnap.agent.s3.crypto.recipients import AgeRecipient, WrapError, kms_key_id

        if not self.recipients and not self.kms_keys:
            raise ValueError("name at least one recipient (age) or KMS key (kms_keys)")
        for recipient in self.recipients:
            try:
                AgeRecipient(recipient)
            except WrapError as exc:
                raise ValueError(f"recipients: {exc}") from None
        for key in self.kms_keys:
            try:
                kms_key_id(key)
            except WrapError as exc:
                raise ValueError(f"kms_keys: {exc}") from None
        if len(set(self.recipients)) != len(self.recipients):
            raise ValueError("recipients: a recipient is listed twice")
        if len(set(self.kms_keys)) != len(self.kms_keys):
            raise ValueError("kms_keys: a key is listed twice")
        if (self.kms_access_key_id_file is None) != (self.kms_secret_access_key_file is None):
            raise ValueError(
                "kms_access_key_id_file and kms_secret_access_key_file go together: set both or"
                " neither"
            )
        if not _is_hex_key(self.name_key_file.get_secret_value().strip()):
            raise ValueError(
                "name_key_file must hold 64 hex digits (make it with `openssl rand -hex 32`)"
            )
        return self


class S3Settings(Section):
    bucket: str = Field(min_length=3, max_length=63, pattern=r"^[a-z0-9][a-z0-9.-]+[a-z0-9]$")
    #: Key prefix of everything ringsnap writes ('' or ending in '/').
    prefix: str = Field(default="", pattern=r"^$|^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9_.-]+)*/$")
    #: None: AWS S3 itself.
    endpoint_url: str | None = Field(default=None, pattern=r"^https?://[^\s/]+(/[^\s]*)?$")
    region: str = "us-east-1"
    addressing_style: Literal["auto", "virtual", "path"] = "path"
    checksums: Checksums = "md5"
    #: SigV4 over plain http signs a SHA-256 of every body by default (botocore); the body is
    #: already bound to the signature by its checksum header (Content-MD5, or the flexible
    #: checksum), so ringsnap sends `UNSIGNED-PAYLOAD` as botocore does over https. That saves a
    #: hash of every byte on both sides, and a store that checks a signed body may hold it whole in
    #: memory first (S3Proxy: up to 128 MiB a request, refusing more). True: sign every body.
    sign_payload: bool = False
    #: A path, or `credential:NAME` for a systemd credential; both or neither (then boto3's own
    #: chain: environment, instance profile).
    access_key_id_file: SecretFile | None = None
    secret_access_key_file: SecretFile | None = None
    #: A CA bundle for a store with a private CA (None: the system's).
    ca_file: str | None = None
    #: Files at least this large go up in parts of `part_size_bytes` (S3: 5 MiB to 5 GiB, at most
    #: 10,000 parts; the part size grows when a file would need more). Smaller files go in one
    #: request each, streamed from the file: a node's many files in flight already keep
    #: `concurrency` requests busy, and stores that keep objects as files (S3Proxy's filesystem
    #: backends, NAS gateways) copy every byte of a multipart object once more to join its parts.
    multipart_threshold_bytes: int = Field(default=512 * MIB, ge=5 * MIB, le=5 * 1024 * MIB)
    part_size_bytes: int = Field(default=64 * MIB, ge=5 * MIB, le=5 * 1024 * MIB)
    #: Parallel transfers (parts and files) of one node.
    concurrency: int = Field(default=8, ge=1, le=64)
    #: Files handed to the transfer manager ahead of completion (bounds memory and open files).
    files_in_flight: int = Field(default=32, ge=1, le=1024)
    #: Bytes per second for the whole node, None: unlimited.
    max_bandwidth_bytes: int | None = Field(default=None, ge=64 * 1024)
    connect_timeout_seconds: float = Field(default=10.0, gt=0)
    read_timeout_seconds: float = Field(default=60.0, gt=0)
    max_attempts: int = Field(default=5, ge=1, le=20)
    #: The store's own encryption at rest of what ringsnap writes (`ringsnap.agent.s3.sse`):
    #: `AES256` (SSE-S3), `aws:kms` (SSE-KMS, key `sse_kms_key_id` or the account's default),
    #: `customer` (SSE-C, key in `sse_customer_key_file`). None: the bucket's default.
    server_side_encryption: Literal["AES256", "aws:kms", "customer"] | None = None
    sse_kms_key_id: str | None = Field(default=None, min_length=1, max_length=2048)
    #: SSE-C's key: 64 hex digits (`openssl rand -hex 32`); a path or `credential:NAME`. Every
    #: node and the coordinator need the same key; without it no object can be read back.
    sse_customer_key_file: SecretFile | None = None
    #: Client-side encryption on the node (docs/s3.md, "Encryption"). None: copies in plain text
    #: (the store's own encryption only).
    encryption: S3Encryption | None = None

    @model_validator(mode="after")
    def _sse_keys(self) -> S3Settings:
        mode = self.server_side_encryption
        if self.sse_kms_key_id is not None and mode != "aws:kms":
            raise ValueError('sse_kms_key_id goes with server_side_encryption = "aws:kms"')
        if (self.sse_customer_key_file is not None) != (mode == "customer"):
            raise ValueError(
                'sse_customer_key_file goes with server_side_encryption = "customer" (both or'
                " neither)"
            )
        customer = self.sse_customer_key_file
        if customer is not None and not _is_hex_key(customer.get_secret_value().strip()):
            raise ValueError(
                "sse_customer_key_file must hold 64 hex digits (`openssl rand -hex 32`)"
            )
        return self

    @model_validator(mode="after")
    def _keys_together(self) -> S3Settings:
        if (self.access_key_id_file is None) != (self.secret_access_key_file is None):
            raise ValueError(
                "access_key_id_file and secret_access_key_file go together: set both or neither"
            )
        return self
