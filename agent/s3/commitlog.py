"""The commit-log segments captured with a backup, copied to S3 beside its SSTables and back.

Writes acknowledged between the flush and the freeze are only in the commit log: a restore from
S3 equals a restore from the array only if the segments the snapshot holds come back too.

    <prefix>commitlog/<node>/<backup id>/<segment>              one object per segment
    <prefix>backups/<backup id>/<node>.commitlog.jsonl.gz        the list, gzip'd JSON lines:

    {"format": "ringsnap-s3-commitlog/1", "backup_id": ..., "node": ..., "created": ...}
    {"key": ..., "segment": "CommitLog-7-1732...log", "size": ..., "crc32": ...}   one per segment
    {"end": true, "segments": N, "bytes": B}

Segments are not content addressed (Cassandra appends to a segment and recycles its name), so they
live per backup. The CRC32 of each segment is computed from the bytes as they are sent; the list
object is written after every segment and before the node's SSTable manifest object (which stays
last: a node is exported once that one exists). A rerun skips segments already stored with their
size (their CRC32 is then read from the snapshot's file: same backup, same bytes).

The restore side, a stable interface:

    download_commitlog(client, settings, backup_id, node, destination_dir, progress=None)
        -> CommitlogDownload

reads and validates the whole list object first (every key, name, size; the closing line), then
downloads each segment to `.<segment>.ringsnap-partial` in `destination_dir` (the node's commit-log
directory, Cassandra stopped), checks its size and CRC32 and only then renames it into place. A
segment that does not verify is deleted and the download stops with `DownloadRefused` naming the
key. A segment already in place with the right size and CRC32 is kept (a rerun resumes). A backup
exported before commit logs were copied has no list object: `CommitlogMissing` (a `DownloadRefused`)
says so.

Encrypted (`[s3.encryption]`): the segments and the list object go up sealed with a run key of
their own (its key object first); the CRC32 in the list is the plaintext's, and the download
opens each segment chunk by chunk with the restore's identities before checking it.
"""

from __future__ import annotations

import os
import threading
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ringsnap.agent.s3.client import S3Client
from ringsnap.agent.s3.commitlog_list import (
    FORMAT,
    MAX_COMMITLOG_OBJECT_BYTES,
    MAX_SEGMENT_BYTES,
    Segment,
    commitlog_object,
    read_commitlog_object,
)
from ringsnap.agent.s3.crypto.envelope import EnvelopeError, cipher_size
from ringsnap.agent.s3.crypto.recipients import Identity
from ringsnap.agent.s3.crypto.sealing import ExportSealing, Unsealing, is_sealed
from ringsnap.agent.s3.crypto.streams import EncryptingReader
from ringsnap.agent.s3.download import PARTIAL_SUFFIX, DownloadRefused
from ringsnap.agent.s3.export import ExportCancelled, ExportFailed
from ringsnap.agent.s3.layout import SEGMENT_NAME, Layout, node_name
from ringsnap.agent.s3.progress import Reporter, Tracker
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.errors import ValidationError
from ringsnap.logs import get_logger
from ringsnap.names import backup_id as valid_backup_id

__all__ = [
    "FORMAT",
    "MAX_COMMITLOG_OBJECT_BYTES",
    "CommitlogDownload",
    "CommitlogExport",
    "CommitlogMissing",
    "Segment",
    "commitlog_object",
    "download_commitlog",
    "export_commitlog",
    "read_commitlog_object",
]

log = get_logger(__name__)

_CHUNK = 1024 * 1024


class CommitlogMissing(DownloadRefused):
    """The backup has no commit-log object for the node (exported without it)."""


@dataclass(frozen=True)
class CommitlogExport:
    manifest_key: str
    segments: int
    bytes_total: int
    segments_uploaded: int
    bytes_uploaded: int


@dataclass(frozen=True)
class CommitlogDownload:
    segments: int
    bytes_total: int
    segments_downloaded: int
    bytes_downloaded: int
    segments_kept: int
    seconds: float


def segments_in(directory: Path) -> list[tuple[str, int]]:
    """(name, size) of the commit-log segments in `directory`, oldest first; other files ignored."""
    found: list[tuple[str, int]] = []
    with os.scandir(directory) as entries:
        for entry in entries:
            if SEGMENT_NAME.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
                found.append((entry.name, entry.stat(follow_symlinks=False).st_size))
    return sorted(found, key=lambda item: _segment_order(item[0]))


def _segment_order(name: str) -> tuple[int, str]:
    parts = name.split("-")
    digits = "".join(ch for ch in parts[2] if ch.isdigit()) if len(parts) > 2 else ""
    return (int(digits) if digits else 0, name)


class _Crc32Reader:
    """A file read for an upload, computing the CRC32 of what is read from its start.

    botocore reads a body more than once (Content-MD5 while signing, then the send, then a retry),
    each time from the start: a read from offset 0 starts the CRC again.
    """

    def __init__(
        self, raw: IO[bytes] | EncryptingReader, cancel: threading.Event | None = None
    ) -> None:
        self._raw = raw
        self._cancel = cancel
        self.crc32 = 0
        self.covered = 0

    def read(self, size: int = -1) -> bytes:
        if self._cancel is not None and self._cancel.is_set():
            # Ends the request at once (a segment takes long at a limited bandwidth).
            raise ExportCancelled("the export was cancelled by its caller")
        start = self._raw.tell()
        data = self._raw.read(size)
        if start == 0:
            self.crc32, self.covered = zlib.crc32(data), len(data)
        elif start == self.covered:
            self.crc32, self.covered = zlib.crc32(data, self.crc32), self.covered + len(data)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._raw.seek(offset, whence)

    def tell(self) -> int:
        return self._raw.tell()

    def readable(self) -> bool:
        return True


def export_commitlog(
    client: S3Client,
    settings: S3Settings,
    *,
    backup_id: str,
    node: str,
    directory: Path | None,
    progress: Reporter | None = None,
    cancel: threading.Event | None = None,
) -> CommitlogExport:
    """Upload the segments in `directory` (the snapshot's commit-log directory; None: the backup
    captured none, e.g. a native snapshot) and then the list object. Once `cancel` is set, the
    segment being sent stops at its next read and `ExportCancelled` is raised (its file closed)."""
    valid_backup_id(backup_id)
    node_name(node)
    layout = Layout(settings.prefix)
    found = segments_in(directory) if directory is not None else []
    for name, size in found:
        if size > MAX_SEGMENT_BYTES:
            raise ExportFailed(f"node {node}: commit-log segment {name} is larger than 5 GiB")
    tracker = Tracker(len(found), sum(size for _, size in found), progress)
    sealing = ExportSealing(settings.encryption, layout, node) if settings.encryption else None
    if sealing is not None:
        sealing.start(client, settings.bucket)
    present: dict[str, int] = {}
    if found:
        paginator = client.get_paginator("list_objects_v2")
        prefix = layout.commitlog_prefix(node, backup_id)
        for page in paginator.paginate(Bucket=settings.bucket, Prefix=prefix):
            for item in page.get("Contents", ()):
                present[item["Key"]] = item["Size"]
    segments: list[Segment] = []
    uploaded = uploaded_bytes = 0
    for name, size in found:
        assert directory is not None
        key = layout.segment_key(node, backup_id, name)
        path = directory / name
        if cancel is not None and cancel.is_set():
            raise ExportCancelled(
                f"node {node}: the export of backup {backup_id} was cancelled by its caller"
                " during its commit log; what was uploaded stays (a rerun uploads only what is"
                " missing)"
            )
        if present.get(key) == (cipher_size(size) if sealing else size):
            segments.append(Segment(key, name, size, _file_crc32(path, size, node)))
            tracker.skipped(size)
            continue
        segments.append(
            Segment(
                key,
                name,
                size,
                _upload(
                    client,
                    settings.bucket,
                    key,
                    path,
                    size=size,
                    node=node,
                    cancel=cancel,
                    sealing=sealing,
                ),
            )
        )
        tracker.transferred(size)
        tracker.file_transferred()
        uploaded, uploaded_bytes = uploaded + 1, uploaded_bytes + size
    manifest_key = layout.commitlog_manifest_key(backup_id, node)
    body = commitlog_object(backup_id, node, segments)
    if sealing is not None:
        body = sealing.seal_bytes(manifest_key, body)
    try:
        client.put_object(Bucket=settings.bucket, Key=manifest_key, Body=body)
    except Exception as exc:
        raise ExportFailed(
            f"node {node}: writing {manifest_key!r} failed: {exc}; run the export again"
        ) from exc
    tracker.finish()
    log.info(
        "commit log exported",
        backup=backup_id,
        node=node,
        segments=len(segments),
        uploaded=uploaded,
        bytes_uploaded=uploaded_bytes,
    )
    return CommitlogExport(
        manifest_key, len(segments), sum(s.size_bytes for s in segments), uploaded, uploaded_bytes
    )


def _upload(
    client: S3Client,
    bucket: str,
    key: str,
    path: Path,
    *,
    size: int,
    node: str,
    cancel: threading.Event | None = None,
    sealing: ExportSealing | None = None,
) -> int:
    try:
        with path.open("rb") as raw:
            source: IO[bytes] | EncryptingReader = raw
            length = size
            if sealing is not None:
                # Its CRC32 is then of the sealed bytes: the plaintext's is read from the file.
                source = EncryptingReader(raw, size, sealing.sealer(key))
                length = cipher_size(size)
            reader = _Crc32Reader(source, cancel)
            client.put_object(Bucket=bucket, Key=key, Body=reader, ContentLength=length)
    except OSError as exc:
        raise ExportFailed(
            f"node {node}: {path} cannot be read ({exc.strerror}); is the snapshot still mounted?"
        ) from None
    except Exception as exc:
        if cancel is not None and cancel.is_set():
            raise ExportCancelled(
                f"node {node}: the export was cancelled by its caller while {path} was sent;"
                " what was uploaded stays (a rerun uploads only what is missing)"
            ) from None
        raise ExportFailed(
            f"node {node}: upload of {path} to {key!r} failed: {exc}; run the export again"
        ) from exc
    if reader.covered != size:
        # The body was not read through in one pass from its start (a store that did not ask for
        # it all): the CRC comes from the file instead.
        return _file_crc32(path, size, node)
    return reader.crc32


def _file_crc32(path: Path, size: int, node: str) -> int:
    crc, read = 0, 0
    try:
        with path.open("rb") as source:
            while chunk := source.read(_CHUNK):
                crc, read = zlib.crc32(chunk, crc), read + len(chunk)
    except OSError as exc:
        raise ExportFailed(f"node {node}: {path} cannot be read ({exc.strerror})") from None
    if read != size:
        raise ExportFailed(
            f"node {node}: {path} changed while exported ({size} -> {read} bytes); export from a"
            " snapshot, not from the live commit log"
        )
    return crc


def download_commitlog(  # noqa: PLR0917 - the restore side's stable signature
    client: S3Client,
    settings: S3Settings,
    backup_id: str,
    node: str,
    destination_dir: Path,
    progress: Reporter | None = None,
    *,
    identities: Sequence[Identity] = (),
) -> CommitlogDownload:
    """Fetch the backup's commit-log segments of `node` into `destination_dir`, each verified
    (size and CRC32) before it is renamed into place; see the module docstring. `identities`
    open an encrypted copy (held for this call only)."""
    valid_backup_id(backup_id)
    node_name(node)
    layout = Layout(settings.prefix)
    key = layout.commitlog_manifest_key(backup_id, node)
    started = time.monotonic()
    try:
        data = client.get_object(Bucket=settings.bucket, Key=key)["Body"].read()
    except Exception as exc:
        code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
        if code in ("NoSuchKey", "404"):
            raise CommitlogMissing(
                f"backup {backup_id} node {node}: no commit-log object {key!r}; the backup was"
                " exported without its commit log (restore without it, or export it again)"
            ) from None
        raise DownloadRefused(
            f"backup {backup_id} node {node}: commit-log object {key!r} cannot be read ({exc})"
        ) from exc
    keys = Unsealing(client, settings.bucket, layout, node, identities)
    sealed = is_sealed(data)
    try:
        if sealed:
            data = keys.decrypt_bytes(data, key)
        segments = read_commitlog_object(data, layout, name=key, backup_id=backup_id, node=node)
    except EnvelopeError as exc:
        raise DownloadRefused(f"backup {backup_id} node {node}: {exc}") from None
    except ValidationError as exc:
        raise DownloadRefused(f"backup {backup_id} node {node}: {exc}") from None
    tracker = Tracker(len(segments), sum(s.size_bytes for s in segments), progress)
    kept = downloaded = downloaded_bytes = 0
    destination_dir.mkdir(parents=True, exist_ok=True)
    for segment in segments:
        target = destination_dir / segment.name
        if _verifies(target, segment):
            kept += 1
            tracker.skipped(segment.size_bytes)
            continue
        _download(client, settings.bucket, segment, target, keys if sealed else None)
        downloaded, downloaded_bytes = downloaded + 1, downloaded_bytes + segment.size_bytes
        tracker.transferred(segment.size_bytes)
        tracker.file_transferred()
    tracker.finish()
    return CommitlogDownload(
        segments=len(segments),
        bytes_total=sum(s.size_bytes for s in segments),
        segments_downloaded=downloaded,
        bytes_downloaded=downloaded_bytes,
        segments_kept=kept,
        seconds=time.monotonic() - started,
    )


def _verifies(target: Path, segment: Segment) -> bool:
    try:
        if target.is_symlink() or not target.is_file():
            return False
        if target.stat().st_size != segment.size_bytes:
            return False
        return _crc_of(target) == segment.crc32
    except OSError:
        return False


def _crc_of(path: Path) -> int:
    crc = 0
    with path.open("rb") as source:
        while chunk := source.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


def _download(
    client: S3Client, bucket: str, segment: Segment, target: Path, keys: Unsealing | None
) -> None:
    partial = target.with_name(f".{target.name}{PARTIAL_SUFFIX}")
    crc, size = 0, 0
    try:
        fd = os.open(
            partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644
        )
        with os.fdopen(fd, "wb") as out:

            def write(chunk: bytes) -> None:
                nonlocal crc, size
                crc, size = zlib.crc32(chunk, crc), size + len(chunk)
                out.write(chunk)

            body = client.get_object(Bucket=bucket, Key=segment.key)["Body"]
            opened = keys.whole_writer(segment.key, segment.size_bytes, write) if keys else None
            for chunk in _chunks(body):
                if opened is None:
                    write(chunk)
                else:
                    opened.write(chunk)
            if opened is not None and not opened.complete:
                size = -1  # fewer chunks than the size in the list: refused below
            out.flush()
            os.fsync(out.fileno())
    except Exception as exc:
        partial.unlink(missing_ok=True)
        raise DownloadRefused(
            f"download of {segment.key!r} to {target} failed: {exc}; run it again: segments"
            " already verified are kept"
        ) from exc
    if size != segment.size_bytes or crc != segment.crc32:
        partial.unlink(missing_ok=True)
        log.error("commit-log segment refused", key=segment.key, file=str(target))
        raise DownloadRefused(
            f"object {segment.key!r} is corrupt (size {size}, CRC32 {crc}; the list says"
            f" {segment.size_bytes}, {segment.crc32}); {target} was not written"
        )
    os.rename(partial, target)


def _chunks(body: Any) -> Iterator[bytes]:
    while chunk := body.read(_CHUNK):
        yield chunk
