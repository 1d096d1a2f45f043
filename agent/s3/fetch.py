"""The download's inner loop: one object, or one byte range of it, from S3 into a file.

A worker thread sends the GET and reads its body with `readinto` into its own reused buffer, then
hands each chunk to the writer (which takes its CRC32 and `pwrite`s it at its offset), in the same
thread. Socket reads, CRC32 and `pwrite` all release the GIL, so a few such threads keep both
cores of a small machine busy without a queue between a reading thread and a writing thread (the
design of s3transfer, whose hand-offs of 256 KiB chunks cost more CPU than the bytes themselves).

A body cut in the middle (connection reset, read timeout, a TLS error, a body shorter than its
Content-Length) is resumed from the byte reached with a ranged GET, up to `attempts` times: the
writer sees the bytes once, in order, so its CRC32 stays valid. botocore retries the request itself
(until the headers); what it cannot retry is the body, which is this loop's job. Only the read of
the body can be a cut: an error of the writer (a full disk) fails the file at once.

The object must be the size the manifest says: a whole GET's Content-Length, or a ranged GET's
Content-Range total, that differs is `ObjectCorrupt` before any byte is written.
"""

from __future__ import annotations

import http.client
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

import urllib3.exceptions
import urllib3.response
from botocore.exceptions import (
    ClientError,
    FlexibleChecksumError,
    IncompleteReadError,
    ReadTimeoutError,
    ResponseStreamingError,
)
from botocore.response import StreamingBody

from ringsnap.agent.s3.client import S3Client
from ringsnap.agent.s3.throttle import Throttle
from ringsnap.logs import get_logger

log = get_logger(__name__)

#: Bytes read per `readinto`: large enough that per-call costs vanish, small enough to keep one
#: buffer per thread cheap (8 threads: 8 MiB).
CHUNK = 1024 * 1024

#: A body cut in flight: resumed where it stopped. What the read of a body raises, and only that:
#: read through urllib3 and botocore, a socket's or TLS's error comes wrapped (urllib3's
#: `HTTPError`s, botocore's); read straight from the socket (`_raw_response`) it comes as is: an
#: `OSError` (`ssl.SSLError` is one: a TLS link dropped mid-record, a corrupted record). Any
#: `OSError` of a socket's read is the connection failing, but an `OSError` of the writer (a full
#: disk, an I/O error) is not: `_read_or_cut` tells them apart by where they are raised.
_CUT = (
    OSError,  # ConnectionError, TimeoutError, ssl.SSLError and the socket's others
    http.client.HTTPException,
    urllib3.exceptions.HTTPError,
    IncompleteReadError,
    ReadTimeoutError,
    ResponseStreamingError,
)

_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+)$")


class ObjectCorrupt(Exception):
    """The object in the store is not the component the manifest describes (its size differs)."""


class FetchHalted(Exception):
    """The download is stopping (cancelled, or another file failed): this GET gave up."""


class BodyCut(Exception):
    """The body of one GET (a file, or one part) was cut `attempts` times, counting the first."""


class _Cut(Exception):
    """The read of a body failed (one of `_CUT`, from the read and not from a writer)."""


@dataclass(frozen=True, slots=True)
class Span:
    """Bytes `start` to `start + length` of object `key`, whose size is `object_size`."""

    key: str
    object_size: int
    start: int
    length: int

    @property
    def whole(self) -> bool:
        return self.start == 0 and self.length == self.object_size


def spans(key: str, size: int, threshold: int, part_size: int) -> list[Span]:
    """One span for an object below `threshold` (one GET), else ranges of `part_size` bytes."""
    if size < threshold:
        return [Span(key, size, 0, size)]
    return [
        Span(key, size, start, min(part_size, size - start)) for start in range(0, size, part_size)
    ]


Write = Callable[[memoryview], object]


class Fetcher:
    """GETs spans into writers; shared by the worker threads of one download."""

    def __init__(
        self,
        client: S3Client,
        bucket: str,
        *,
        attempts: int,
        halts: tuple[threading.Event, ...],
        on_bytes: Callable[[int], None],
        throttle: Throttle | None = None,
    ) -> None:
        self._client = client
        self._bucket = bucket
        self._attempts = attempts
        self._halts = halts
        self._on_bytes = on_bytes
        self._throttle = throttle
        #: Bytes read at a time: smaller under a low bandwidth limit (`Throttle.step`).
        self._step = CHUNK if throttle is None else throttle.step(CHUNK)
        self._local = threading.local()

    def _check(self) -> None:
        if any(halt.is_set() for halt in self._halts):
            raise FetchHalted("the download is stopping")

    def _buffer(self) -> memoryview:
        view: memoryview | None = getattr(self._local, "view", None)
        if view is None:
            view = self._local.view = memoryview(bytearray(CHUNK))
        return view

    def fetch(self, span: Span, write: Write) -> None:
        """All of `span` into `write`, in order, each byte once."""
        view = self._buffer()
        done = cuts = 0
        while True:
            self._check()
            resumed = done > 0
            body = self._get(span, done)
            drained = False
            try:
                read = _reader(body)
                while done < span.length:
                    self._check()
                    count = _read_or_cut(read, view[: min(self._step, span.length - done)])
                    if count == 0:
                        break  # shorter than its Content-Length: a cut connection
                    if self._throttle is not None:
                        self._throttle.take(count, self._halts[0])
                    write(view[:count])
                    done += count
                    self._on_bytes(count)
                if done == span.length:
                    _end_of(read, view, span)
                    drained = True
                    return
                problem: str = "the body ended early"
            except _Cut as exc:
                problem = str(exc)
            finally:
                _close(body, drained)
            cuts += 1
            if cuts >= self._attempts:
                raise BodyCut(
                    f"the body of {span.key!r} was cut {cuts} times (last: {problem}) at byte"
                    f" {span.start + done}"
                )
            log.warning(
                "S3 body cut; resuming",
                key=span.key,
                at_byte=span.start + done,
                attempt=cuts,
                problem=problem,
                resumed_before=resumed,
            )

    def _get(self, span: Span, done: int) -> Any:
        """The GET of what is left of `span` after `done` bytes, its size checked; its body."""
        request = {"Bucket": self._bucket, "Key": span.key}
        ranged = not span.whole or done > 0
        first, last = span.start + done, span.start + span.length - 1
        if ranged:
            request["Range"] = f"bytes={first}-{last}"
        try:
            response = self._client.get_object(**request)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "InvalidRange":
                raise ObjectCorrupt(f"shorter than the {span.object_size} bytes expected") from None
            raise
        body = response["Body"]
        try:
            if ranged:
                _check_range(span, response.get("ContentRange"), first, last)
            elif (length := response.get("ContentLength")) is None:
                raise ValueError(f"the store sent {span.key!r} without a Content-Length")
            elif length != span.object_size:
                raise ObjectCorrupt(f"size {length}, expected {span.object_size}")
        except BaseException:
            _close(body, drained=False)
            raise
        return body


def _check_range(span: Span, content_range: str | None, first: int, last: int) -> None:
    match = _CONTENT_RANGE.match(content_range or "")
    if match is None:
        # A whole file's GET is ranged only to resume a cut body: no threshold avoids that.
        advice = (
            "a body cut in the middle cannot be resumed from it; run the download again"
            if span.whole
            else "set multipart_threshold_bytes above the largest file"
        )
        raise ValueError(
            f"the store answered a ranged GET of {span.key!r} without a valid Content-Range"
            f" ({content_range!r}): it ignores Range; {advice}"
        )
    start, end, total = map(int, match.groups())
    if total != span.object_size:
        raise ObjectCorrupt(f"size {total}, expected {span.object_size}")
    if (start, end) != (first, last):
        raise ValueError(
            f"the store sent bytes {start}-{end} of {span.key!r} for a GET of {first}-{last}"
        )


def _raw_response(body: Any) -> http.client.HTTPResponse | None:
    """The http.client response under botocore's plain body, when it can be read directly.

    Reading it with its own `readinto` puts the socket's bytes straight into the buffer: urllib3's
    `readinto` reads a new bytes object and copies it, a quarter more CPU per byte. Only for
    botocore's plain `StreamingBody` (not the flexible-checksum body, which must see the bytes)
    over urllib3 without a content encoding; anything else is read through botocore.
    """
    if type(body) is not StreamingBody:
        return None
    stream = getattr(body, "_raw_stream", None)
    if not isinstance(stream, urllib3.response.HTTPResponse):
        return None
    if stream.headers.get("content-encoding", "identity") != "identity":
        return None
    raw = getattr(stream, "_fp", None)
    return raw if isinstance(raw, http.client.HTTPResponse) else None


def _reader(body: Any) -> Callable[[memoryview], int]:
    raw = _raw_response(body)
    if raw is not None:
        return raw.readinto
    return _through_botocore(body)


def _through_botocore(body: Any) -> Callable[[memoryview], int]:
    def read_into(view: memoryview) -> int:
        data = body.read(len(view))
        view[: len(data)] = data
        return len(data)

    return read_into


def _read_or_cut(read: Callable[[memoryview], int], view: memoryview) -> int:
    """`read(view)`; what it raises of `_CUT` as `_Cut` (any other error of it, as is)."""
    try:
        return read(view)
    except _CUT as exc:
        raise _Cut(f"{type(exc).__name__}: {exc}") from exc


def _end_of(read: Callable[[memoryview], int], view: memoryview, span: Span) -> None:
    """Reads past the last byte of `span`'s body: botocore checks a whole object's flexible
    checksum (`checksums = "flexible"`) only when a read finds the body's end. An error of that
    read other than the checksum's fails the file (not a cut: nothing is left to resume)."""
    try:
        extra = read(view[:1])
    except FlexibleChecksumError as exc:
        raise ObjectCorrupt(f"its bytes do not match the store's checksum ({exc})") from None
    if extra:
        raise ObjectCorrupt(f"the store sent more than the {span.length} bytes asked")


def _close(body: Any, drained: bool) -> None:
    """A body read to its end gives its connection back to the pool; any other is closed (its
    connection is not reused: unread bytes would be read as the next response)."""
    stream = getattr(body, "_raw_stream", None)
    if drained and isinstance(stream, urllib3.response.HTTPResponse):
        stream.release_conn()
        return
    body.close()


def read_object(client: S3Client, bucket: str, key: str, out: IO[bytes], attempts: int = 3) -> None:
    """Object `key` whole into `out` (a seekable file, from its start: a manifest object); a body
    cut in the middle is fetched again from its start, up to `attempts` GETs."""
    for attempt in range(1, attempts + 1):
        out.seek(0)
        out.truncate()
        body = client.get_object(Bucket=bucket, Key=key)["Body"]
        # Through botocore, which checks the body's length at its end (`_reader`'s fast path would
        # take a short body for a whole one); the writes to `out` outside `_read_or_cut`.
        read, view = _through_botocore(body), memoryview(bytearray(CHUNK))
        try:
            while count := _read_or_cut(read, view):
                out.write(view[:count])
            return
        except _Cut as cut:
            if attempt == attempts:
                raise BodyCut(
                    f"the body of {key!r} was cut {attempts} times (last: {cut})"
                ) from cut
            log.warning(
                "S3 body cut; fetching it again", key=key, attempt=attempt, problem=str(cut)
            )
        finally:
            body.close()
