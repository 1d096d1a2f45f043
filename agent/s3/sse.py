"""The store's own encryption at rest (server-side encryption) for what ringsnap writes.

`server_side_encryption` in `[s3]`:

- `AES256` (SSE-S3): the store encrypts with its own keys;
- `aws:kms` (SSE-KMS): with the KMS key `sse_kms_key_id` (or the account's default S3 key);
- `customer` (SSE-C): with the key in `sse_customer_key_file` (32 bytes as 64 hex digits), which
  the store never keeps: every PUT, part, GET and HEAD must send it again, and an object is
  unreadable without it.

Applied once for every client (`make_client`): the parameters are added to each call before
botocore builds the request (so its own SSE-C key MD5 handler sees them), whichever module makes
the call. This is independent of ringsnap's client-side encryption (`[s3.encryption]`); both can
be on.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

from ringsnap.agent.s3.settings import S3Settings

#: Calls that create an object (SSE-S3 and SSE-KMS are asked for there only).
_CREATING = ("PutObject", "CreateMultipartUpload", "CopyObject")
#: Calls that must carry an SSE-C key (the store keeps none).
_WITH_CUSTOMER_KEY = (
    "PutObject",
    "CreateMultipartUpload",
    "UploadPart",
    "GetObject",
    "HeadObject",
    "CopyObject",
)


def _adder(values: dict[str, str | bytes]) -> Callable[..., None]:
    def add(params: dict[str, Any], **_: Any) -> None:
        for name, value in values.items():
            params.setdefault(name, value)

    return add


def sse_parameters(settings: S3Settings) -> dict[str, dict[str, str | bytes]]:
    """Per operation name, the parameters `settings` add to it (empty without SSE)."""
    mode = settings.server_side_encryption
    if mode is None:
        return {}
    if mode == "customer":
        assert settings.sse_customer_key_file is not None  # the settings' validator
        key = bytes.fromhex(settings.sse_customer_key_file.get_secret_value().strip())
        # botocore base64-encodes the key and adds its MD5 (its `sse_md5` handler).
        customer: dict[str, str | bytes] = {"SSECustomerAlgorithm": "AES256", "SSECustomerKey": key}
        return dict.fromkeys(_WITH_CUSTOMER_KEY, customer)
    values: dict[str, str | bytes] = {"ServerSideEncryption": mode}
    if mode == "aws:kms" and settings.sse_kms_key_id:
        values["SSEKMSKeyId"] = settings.sse_kms_key_id
    return dict.fromkeys(_CREATING, values)


def register_sse(client: Any, settings: S3Settings, mask: Callable[[str], None]) -> None:
    """Add the SSE parameters of `settings` to every call of `client` that needs them; `mask`
    hides an SSE-C key (as botocore sends it, base64) from botocore's debug records."""
    for operation, values in sse_parameters(settings).items():
        client.meta.events.register_first(f"before-parameter-build.s3.{operation}", _adder(values))
        key = values.get("SSECustomerKey")
        if isinstance(key, bytes):
            mask(base64.b64encode(key).decode())
