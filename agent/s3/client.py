"""The boto3 S3 client, built from `S3Settings`.

With `checksums = "md5"` every upload and bulk delete carries a Content-MD5 computed here (the store
refuses a body that does not match it: integrity of every byte in flight), and botocore's
flexible-checksum headers are neither computed nor sent, for stores that reject them.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import logging
import threading
from typing import Any

import boto3
from botocore.config import Config

from ringsnap.agent.s3 import sent_digest
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.agent.s3.sse import register_sse

#: boto3's clients are generated at run time (no types without a stubs package).
S3Client = Any

_MD5_OPERATIONS = ("PutObject", "UploadPart", "DeleteObjects")
_FLEXIBLE_HEADERS = ("x-amz-sdk-checksum-algorithm", "x-amz-trailer")
_CHUNK = 1024 * 1024


def make_client(settings: S3Settings) -> S3Client:
    """A client for `settings`' store. Credentials come from the secret files when set (never
    logged: they are SecretStr until this call), else from boto3's default chain."""
    flexible = settings.checksums == "flexible"
    config = Config(
        region_name=settings.region,
        s3={
            "addressing_style": settings.addressing_style,
            "payload_signing_enabled": settings.sign_payload,
        },
        request_checksum_calculation="when_supported" if flexible else "when_required",
        response_checksum_validation="when_supported" if flexible else "when_required",
        connect_timeout=settings.connect_timeout_seconds,
        read_timeout=settings.read_timeout_seconds,
        retries={"max_attempts": settings.max_attempts, "mode": "standard"},
        # One connection per transfer thread plus the listings and existence checks beside them.
        max_pool_connections=settings.concurrency + 4,
    )
    keys: dict[str, str] = {}
    if settings.access_key_id_file is not None and settings.secret_access_key_file is not None:
        keys = {
            "aws_access_key_id": settings.access_key_id_file.get_secret_value(),
            "aws_secret_access_key": settings.secret_access_key_file.get_secret_value(),
        }
        _MASK.add(keys["aws_access_key_id"])
    session = boto3.session.Session()
    client = session.client(
        "s3",
        endpoint_url=settings.endpoint_url,
        verify=settings.ca_file if settings.ca_file else None,
        config=config,
        **keys,
    )
    if not flexible:
        # An encrypted body's MD5 is taken while it is sent and checked against the ETag, which
        # is the body's MD5 unless SSE-KMS or SSE-C (`sent_digest`).
        after = settings.server_side_encryption in (None, "AES256")
        hook = functools.partial(_content_md5_only, hash_sealed_on_send=after)
        for operation in _MD5_OPERATIONS:
            client.meta.events.register(f"before-sign.s3.{operation}", hook)
        if after:
            sent_digest.register(client)
    register_sse(client, settings, _MASK.add)
    return client


class _CredentialMask(logging.Filter):
    """Masks access key ids in botocore's debug records.

    Every signed request carries the key id in clear in its Authorization header, and botocore's
    debug output dumps the headers. Daemons log libraries at WARNING, but a debugging session must
    not leak the key either. (The secret key itself never travels: only signatures.)
    """

    def __init__(self) -> None:
        super().__init__()
        self._values: set[str] = set()
        self._lock = threading.Lock()

    def add(self, value: str) -> None:
        with self._lock:
            if value in self._values:
                return
            first = not self._values
            self._values.add(value)
        if first:
            for name in _BOTOCORE_LOGGERS:
                logging.getLogger(name).addFilter(self)

    def filter(self, record: logging.LogRecord) -> bool:
        with self._lock:
            values = tuple(self._values)
        text = record.getMessage()
        if any(value in text for value in values):
            for value in values:
                text = text.replace(value, "**********")
            record.msg, record.args = text, None
        return True


_BOTOCORE_LOGGERS = ("botocore.endpoint", "botocore.auth", "botocore.hooks", "botocore.parsers")
_MASK = _CredentialMask()


def _content_md5_only(request: Any, hash_sealed_on_send: bool = False, **_: Any) -> None:
    """Replace any flexible checksum botocore added by a Content-MD5 of the body (an encrypted
    body's, with `hash_sealed_on_send`, is taken while it is sent instead: `sent_digest`).

    Runs while the request is signed: s3transfer has switched its progress callbacks and bandwidth
    accounting off for that moment, so reading the body here neither counts as transferred nor
    waits for bandwidth; the body is put back where it was.
    """
    headers = request.headers
    for name in list(headers.keys()):
        lowered = name.lower()
        if lowered.startswith("x-amz-checksum-") or lowered in _FLEXIBLE_HEADERS:
            del headers[name]
    if "Content-MD5" in headers:
        return
    body = request.body
    sealed = hash_sealed_on_send and sent_digest.is_sealed(body)
    if request.method == "PUT":
        sent_digest.expect(sealed)
    if sealed:
        return
    digest = hashlib.md5(usedforsecurity=False)
    if body is None:
        pass
    elif isinstance(body, bytes | bytearray):
        digest.update(body)
    elif isinstance(body, str):
        digest.update(body.encode())
    else:
        start = body.tell()
        while chunk := body.read(_CHUNK):
            digest.update(chunk)
        body.seek(start)
    headers["Content-MD5"] = base64.b64encode(digest.digest()).decode("ascii")
