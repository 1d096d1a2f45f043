"""The MD5 of an encrypted upload's body taken while it is sent, checked against the store's ETag.

With `checksums = "md5"`, `client._content_md5_only` reads every body once before it is sent, to
put its Content-MD5 in the request. An encrypted body (`crypto.streams.EncryptingReader`) is
produced by encrypting the file as it is read: that first read would encrypt every byte a second
time (the export ran at 60 % of a plain one). So an encrypted PutObject or UploadPart goes without
Content-MD5; its bytes are hashed as the connection reads them, and the answer's ETag (the MD5 of
what the store received, for a PutObject or UploadPart with SSE-S3 or none) must equal that hash,
or the call fails with `SentBodyMismatch` (a PutObject's object is deleted first, so that a rerun
uploads it again; a failed part fails its multipart upload, which is aborted). A body sent otherwise than once from its first byte (a retry rewinds it to
0 and starts over) cannot be checked and fails the same way. SSE-KMS and SSE-C make ETags that are
not MD5s: there the Content-MD5 is computed before sending, as for a plain body.

Each transfer thread runs one request at a time: the state between the signing, the sending and
the answer of a request is the thread's own.
"""

from __future__ import annotations

import functools
import hashlib
import os
import threading
from typing import Any

from ringsnap.agent.s3.crypto.streams import EncryptingReader

#: The operations whose answer's ETag is the MD5 of the body (without SSE-KMS or SSE-C).
OPERATIONS = ("PutObject", "UploadPart")

_STATE = threading.local()
#: How deep s3transfer's wrappers of a file are looked into.
_MAX_WRAPPERS = 4


class SentBodyMismatch(Exception):
    """The store's ETag is not the MD5 of the bytes sent: the object (or part) is not the one
    ringsnap encrypted. The message names the request."""


def is_sealed(body: Any) -> bool:
    """Whether `body` is an encrypted upload's: itself, or what s3transfer's wrappers read
    (`ReadFileChunk` around `InterruptReader` around the file, each holding the next in
    `_fileobj`)."""
    for _ in range(_MAX_WRAPPERS):
        if isinstance(body, EncryptingReader):
            return True
        # s3transfer's DeferredOpenFile opens its file on the first read: ask who opens it.
        opener = getattr(getattr(body, "_open_function", None), "__self__", None)
        opens_sealed = getattr(opener, "opens_sealed", None)
        if callable(opens_sealed) and opens_sealed(getattr(body, "_filename", "")):
            return True
        body = getattr(body, "_fileobj", None)
        if body is None:
            return False
    return False


def expect(sealed: bool) -> None:
    """Said while the request is signed (without a Content-MD5 when `sealed`)."""
    _STATE.expect = sealed
    _STATE.body = None


class HashingBody:
    """The request's body, hashed as it is read; anything else is the body's own."""

    def __init__(self, body: Any) -> None:
        self._body = body
        self._digest = hashlib.md5(usedforsecurity=False)
        self._position: int = int(body.tell())
        self._start = self._position
        #: Read once, in order, from where the request starts: the hash is of the whole body.
        self.in_order = True

    def read(self, size: int = -1) -> bytes:
        data: bytes = self._body.read(size)
        self._digest.update(data)
        self._position += len(data)
        return data

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        position: int = self._body.seek(offset, whence)
        if position == self._start:
            self._digest = hashlib.md5(usedforsecurity=False)  # a retry sends it again
            self.in_order = True
        elif position != self._position:
            self.in_order = False
        self._position = position
        return position

    def tell(self) -> int:
        return self._position

    def hexdigest(self) -> str:
        return self._digest.hexdigest()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._body, name)


def wrap_body(request: Any, **_: Any) -> None:
    """before-send: an encrypted body sent without Content-MD5 is hashed as it goes."""
    if not getattr(_STATE, "expect", False) or "Content-MD5" in request.headers:
        _STATE.body = None
        return
    body = request.body
    if not isinstance(body, HashingBody):
        body = HashingBody(body)
        request.body = body
    _STATE.body = body


def remember_target(params: dict[str, Any], **_: Any) -> None:
    """before-parameter-build: the bucket and key a mismatched PutObject's object is deleted at."""
    _STATE.target = (params.get("Bucket"), params.get("Key"))


def check_etag(
    http_response: Any, parsed: dict[str, Any], model: Any, *, client: Any, **_: Any
) -> None:
    """after-call: the answer's ETag against the MD5 of what was sent."""
    body, _STATE.body, _STATE.expect = getattr(_STATE, "body", None), None, False
    if body is None or not 200 <= getattr(http_response, "status_code", 0) < 300:
        return
    etag = str(parsed.get("ETag", "")).strip('"')
    name = getattr(model, "name", "the request")
    bucket, key = getattr(_STATE, "target", (None, None))
    problem = ""
    if not body.in_order:
        problem = "the encrypted body was not sent in one pass"
    elif etag != body.hexdigest():
        problem = (
            f"the store's ETag {etag!r} is not the MD5 of the bytes sent ({body.hexdigest()}):"
            " corrupted on the way"
        )
    if not problem:
        return
    if name == "PutObject" and bucket and key:
        client.delete_object(Bucket=bucket, Key=key)  # never left to look uploaded
    raise SentBodyMismatch(f"{name} of {key!r}: {problem}; refused")


def register(client: Any) -> None:
    """Hash encrypted bodies while they are sent and check the ETags (see the module)."""
    for operation in OPERATIONS:
        client.meta.events.register(f"before-parameter-build.s3.{operation}", remember_target)
        client.meta.events.register(f"before-send.s3.{operation}", wrap_body)
        client.meta.events.register(
            f"after-call.s3.{operation}", functools.partial(check_etag, client=client)
        )
