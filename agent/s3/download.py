"""Download one node's SSTables of an exported backup into directories, verified before use.

Every file is written to a temporary name in its final directory, checked (size of every
component; the CRC32 of Data.db against the SSTable's Digest.crc32; Digest.crc32 itself against the
digest its key carries; a file received in order from its first byte, one GET below the multipart
threshold, has its CRC32 taken as it is written, else it is read back) and only then renamed into
place, with the mtime it had on the node (so a later export of the restored node finds the same
keys). A file that does not verify is deleted and the download stops, naming the key: nothing
unverified is ever at a final path.

Resumable: a file already at its final path with the right size (and digest, for Data.db and
Digest.crc32) is kept. The manifest object is copied to a temporary file first and read as a stream:
memory does not grow with the node's size.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from s3transfer.manager import TransferManager
from s3transfer.subscribers import BaseSubscriber

from ringsnap.agent.errors import DomainError
from ringsnap.agent.s3.backup_manifest import Entry, read_entries
from ringsnap.agent.s3.client import S3Client
from ringsnap.agent.s3.export import _Progress, transfer_config
from ringsnap.agent.s3.layout import Layout, node_name
from ringsnap.agent.s3.progress import Reporter, Tracker
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.errors import ValidationError
from ringsnap.logs import get_logger
from ringsnap.names import backup_id as valid_backup_id

log = get_logger(__name__)

PARTIAL_SUFFIX = ".ringsnap-partial"
_CHUNK = 1024 * 1024


class DownloadRefused(DomainError):
    """An object did not verify (or could not be fetched); the message names the key and file."""


class DownloadCancelled(DomainError):
    """The caller cancelled the download; what verified is kept for a rerun."""


#: How long a wait for a transfer goes without looking at the cancel event (a finished transfer
#: wakes it at once).
_CANCEL_POLL_SECONDS = 0.2


class _Wake(BaseSubscriber):  # type: ignore[misc]
    """Sets `event` whenever a transfer ends, so that the loop waiting for one wakes at once."""

    def __init__(self, event: threading.Event) -> None:
        self._event = event

    def on_done(self, future: Any, **_: Any) -> None:
        self._event.set()


@dataclass(frozen=True)
class DownloadResult:
    components: int
    bytes_total: int
    files_downloaded: int
    bytes_downloaded: int
    files_kept: int
    seconds: float


@dataclass(frozen=True, slots=True)
class _Pending:
    future: Any
    entry: Entry
    partial: Path
    target: Path
    #: The open partial file s3transfer writes into (its own temporary names would be left behind
    #: by a killed run; this one is truncated by the next).
    out: _PartialFile


def download_node(
    client: S3Client,
    settings: S3Settings,
    *,
    backup_id: str,
    node: str,
    destinations: Sequence[Path],
    progress: Reporter | None = None,
    place: Callable[[Entry], Path | None] | None = None,
    cancel: threading.Event | None = None,
) -> DownloadResult:
    """Fetch every component of `node` in `backup_id` into `destinations` (the node's data
    directories, in the order of the export's).

    `place` chooses another file for a (validated) entry, or None to leave it out (a table restore
    fetches one table into its staging); by default `<destination of its root>/<its path>`.

    Once `cancel` is set, no file is started and the transfers in flight are cancelled (the
    transfer manager shuts down cancelling them): `DownloadCancelled` is raised with only verified
    files at final paths and no partial file left, so a rerun goes on from there.
    """
    stop = cancel or threading.Event()

    def check_cancel() -> None:
        if stop.is_set():
            raise DownloadCancelled(
                f"backup {backup_id} node {node}: download cancelled by its caller; the files"
                " already verified are kept for a rerun"
            )

    valid_backup_id(backup_id)
    node_name(node)
    layout = Layout(settings.prefix)
    key = layout.manifest_key(backup_id, node)
    started = time.monotonic()
    with tempfile.TemporaryFile(prefix="ringsnap-s3-manifest-") as spool:
        try:
            client.download_fileobj(settings.bucket, key, spool)
        except Exception as exc:
            raise DownloadRefused(
                f"backup {backup_id} node {node}: manifest object {key!r} cannot be read ({exc});"
                " is the backup exported to this bucket and prefix?"
            ) from exc

        def target_of(entry: Entry) -> Path | None:
            if place is not None:
                return place(entry)
            return Path(destinations[entry.root], entry.parsed.relative_path)

        def entries() -> Any:
            spool.seek(0)
            return read_entries(
                spool, layout, name=key, backup_id=backup_id, node=node, roots=len(destinations)
            )

        # First pass: validate the whole object (every key) and count, before writing anything.
        components = total = largest = 0
        try:
            for entry in entries():
                if target_of(entry) is None:
                    continue
                components += 1
                total += entry.size_bytes
                largest = max(largest, entry.size_bytes)
        except ValidationError as exc:
            raise DownloadRefused(f"backup {backup_id} node {node}: {exc}") from None
        tracker = Tracker(components, total, progress)
        kept = 0
        window: deque[_Pending] = deque()
        with TransferManager(client, transfer_config(settings, largest)) as manager:
            ended = threading.Event()
            subscribers = [_Progress(tracker), _Wake(ended)]
            try:
                for entry in entries():
                    check_cancel()
                    target = target_of(entry)
                    if target is None:
                        continue
                    if any(pending.target == target for pending in window):
                        # Two transfers into one partial file would mix their bytes, and a
                        # component checked by its size alone could pass. Export never lists a
                        # key twice.
                        raise DownloadRefused(
                            f"manifest object {key!r} lists {entry.key!r} twice; refused"
                        )
                    if _already_there(target, entry):
                        tracker.skipped(entry.size_bytes)
                        kept += 1
                        continue
                    target.parent.mkdir(parents=True, exist_ok=True)
                    partial = target.with_name(f".{target.name}{PARTIAL_SUFFIX}")
                    out = _PartialFile(_open_partial(partial))
                    future = manager.download(
                        settings.bucket, entry.key, out, subscribers=subscribers
                    )
                    window.append(_Pending(future, entry, partial, target, out))
                    while len(window) >= settings.files_in_flight:
                        _wait(window[0], ended, check_cancel)
                        _finish(window.popleft())
                while window:
                    _wait(window[0], ended, check_cancel)
                    _finish(window.popleft())
            except BaseException:
                for pending in window:
                    pending.future.cancel()
                for pending in window:
                    with contextlib.suppress(Exception):  # abandoned: only the cleanup matters
                        pending.future.result()
                    pending.out.close()
                    pending.partial.unlink(missing_ok=True)
                raise
    done = tracker.finish()
    return DownloadResult(
        components=components,
        bytes_total=total,
        files_downloaded=done.files_transferred,
        bytes_downloaded=done.bytes_transferred,
        files_kept=kept,
        seconds=time.monotonic() - started,
    )


def _wait(pending: _Pending, ended: threading.Event, check_cancel: Callable[[], None]) -> None:
    """Wait for `pending`'s transfer, but no longer than until the download is cancelled.
    `ended` is set by every transfer that ends; it is cleared before `done()` is looked at, so
    that the end of this one is never missed."""
    while True:
        ended.clear()
        if pending.future.done():
            return
        check_cancel()
        ended.wait(_CANCEL_POLL_SECONDS)


def _finish(pending: _Pending) -> None:
    entry = pending.entry
    try:
        try:
            pending.future.result()
        finally:
            pending.out.close()
        problem = _problem(pending.partial, entry, pending.out.crc32_if_whole(entry.size_bytes))
    except Exception as exc:
        pending.partial.unlink(missing_ok=True)
        raise DownloadRefused(
            f"download of {entry.key!r} to {pending.target} failed: {exc}; run it again: files"
            " already verified are kept"
        ) from exc
    if problem:
        pending.partial.unlink(missing_ok=True)
        log.error("object refused", key=entry.key, file=str(pending.target), problem=problem)
        raise DownloadRefused(
            f"object {entry.key!r} is corrupt ({problem}); {pending.target} was not written."
            " Restore this SSTable from another backup or copy"
        )
    os.utime(pending.partial, ns=(entry.mtime_ns, entry.mtime_ns))
    os.rename(pending.partial, pending.target)


def _open_partial(path: Path) -> IO[bytes]:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    return os.fdopen(fd, "wb")


class _PartialFile:
    """The partial file s3transfer writes into, taking the CRC32 of what is written for as long as
    it comes in order from the first byte (the one GET of a file below the multipart threshold):
    Data.db is then verified without reading it back. Ranged GETs of a larger file arrive out of
    order, and a retried GET writes its range again: the file is then read back instead."""

    def __init__(self, raw: IO[bytes]) -> None:
        self._raw = raw
        self._position = 0
        self._in_order = 0  # bytes from the start covered by `_crc`
        self._crc = 0
        self._sequential = True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self._position = self._raw.seek(offset, whence)
        return self._position

    def tell(self) -> int:
        return self._position

    def write(self, data: bytes) -> int:
        if self._sequential and self._position == self._in_order:
            self._crc = zlib.crc32(data, self._crc)
            self._in_order += len(data)
        else:
            self._sequential = False
        written = self._raw.write(data)  # a buffered file: all of it
        self._position += written
        return written

    def close(self) -> None:
        self._raw.close()

    def crc32_if_whole(self, size: int) -> int | None:
        """The CRC32 of the file's `size` bytes when every byte was written once, in order."""
        return self._crc if self._sequential and self._in_order == size else None


def _problem(path: Path, entry: Entry, written_crc32: int | None = None) -> str:
    """Why the file at `path` is not the component `entry` describes ('' when it is).
    `written_crc32`: the CRC32 of the file as it was written, when known (else it is read)."""
    size = path.stat().st_size
    if size != entry.size_bytes:
        return f"size {size}, expected {entry.size_bytes}"
    component = entry.parsed.component
    if component == "Data.db":
        crc = _crc32(path) if written_crc32 is None else written_crc32
        if str(crc) != entry.data_crc32:
            return f"CRC32 {crc}, Digest.crc32 says {entry.data_crc32}"
    elif component == "Digest.crc32":
        value = path.read_bytes().strip().decode("ascii", "replace")
        if value != entry.data_crc32:
            return f"Digest.crc32 holds {value[:20]!r}, expected {entry.data_crc32}"
    return ""


def _already_there(target: Path, entry: Entry) -> bool:
    try:
        if not target.is_file() or target.is_symlink():
            return False
        return _problem(target, entry) == ""
    except OSError:
        return False


def _crc32(path: Path) -> int:
    crc = 0
    with path.open("rb") as source:
        while chunk := source.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc
