"""Download one node's SSTables of an exported backup into directories, verified before use.

Every file is written to a temporary name in its final directory, checked (size of every
component; the CRC32 of Data.db against the SSTable's Digest.crc32; Digest.crc32 itself against the
digest its key carries) and only then renamed into place, with the mtime it had on the node (so a
later export of the restored node finds the same keys). A file that does not verify is deleted and
the download stops, naming the key: nothing unverified is ever at a final path.

The bytes come through `fetch.Fetcher`: one GET per file below the multipart threshold, ranged GETs
of `part_size_bytes` above it, `concurrency` threads each reading into its own buffer and writing
at the bytes' offset. Every GET takes the CRC32 of what it writes, in order; a file's CRC32 is
joined from its parts' (`crc.crc32_of_parts`), so Data.db is verified without reading it back.

Resumable: a file already at its final path with the right size (and digest, for Data.db and
Digest.crc32) is kept. The manifest object is copied to a temporary file first and read as a stream:
memory does not grow with the node's size (`files_in_flight` files are handed to the threads ahead
of completion, one buffer of `fetch.CHUNK` per thread).
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ringsnap.agent.errors import DomainError
from ringsnap.agent.s3.backup_manifest import Entry, read_entries
from ringsnap.agent.s3.client import S3Client
from ringsnap.agent.s3.crc import crc32, crc32_of_parts
from ringsnap.agent.s3.crypto.envelope import (
    HEADER_SIZE,
    EnvelopeError,
    ObjectTampered,
    cipher_size,
)
from ringsnap.agent.s3.crypto.fetching import fetch_sealed_part, sealed_parts
from ringsnap.agent.s3.crypto.recipients import Identity
from ringsnap.agent.s3.crypto.sealing import KEY_HINT, Unsealing, is_sealed
from ringsnap.agent.s3.fetch import Fetcher, FetchHalted, ObjectCorrupt, Span, read_object, spans
from ringsnap.agent.s3.layout import Layout, node_name
from ringsnap.agent.s3.progress import Reporter, Tracker
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.agent.s3.throttle import Throttle
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


#: How long a wait for a file goes without looking at the cancel event (a finished GET wakes it at
#: once).
_CANCEL_POLL_SECONDS = 0.2


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
    """A file being fetched: its GETs (one per span) and their writers, all on `out`."""

    entry: Entry
    partial: Path
    target: Path
    out: IO[bytes]
    parts: tuple[tuple[Span, _PartialFile, Future[None]], ...]

    def done(self) -> bool:
        return all(future.done() for _, _, future in self.parts)

    def crc32(self) -> int | None:
        """The file's CRC32 joined from its GETs' (None if one was not written once in order)."""
        found: list[tuple[int, int]] = []
        for _, writer, _ in self.parts:
            crc = writer.crc32_if_whole(writer.length)
            if crc is None:
                return None
            found.append((crc, writer.length))
        return crc32_of_parts(found)


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
    identities: Sequence[Identity] = (),
) -> DownloadResult:
    """Fetch every component of `node` in `backup_id` into `destinations` (the node's data
    directories, in the order of the export's).

    `place` chooses another file for a (validated) entry, or None to leave it out (a table restore
    fetches one table into its staging); by default `<destination of its root>/<its path>`.

    Once `cancel` is set, no file is started and the GETs in flight stop at their next chunk:
    `DownloadCancelled` is raised with only verified files at final paths and no partial file left,
    so a rerun goes on from there.

    An encrypted copy (its manifest object is) opens only with `identities` (the restore's secret
    keys, held for this call only): without one that opens its key objects, it is refused before
    any file is written, naming the recipients that would.
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
    with (
        tempfile.TemporaryFile(prefix="ringsnap-s3-manifest-") as fetched,
        tempfile.TemporaryFile(prefix="ringsnap-s3-manifest-") as opened,
    ):
        try:
            read_object(client, settings.bucket, key, fetched)
        except Exception as exc:
            raise DownloadRefused(
                f"backup {backup_id} node {node}: manifest object {key!r} cannot be read ({exc});"
                " is the backup exported to this bucket and prefix?"
            ) from exc
        fetched.seek(0)
        keys: Unsealing | None = None
        spool = fetched
        if is_sealed(fetched.read(HEADER_SIZE)):
            keys = Unsealing(client, settings.bucket, layout, node, identities)
            fetched.seek(0)
            try:
                keys.decrypt_file(fetched, opened, key)
            except EnvelopeError as exc:
                raise DownloadRefused(
                    f"backup {backup_id} node {node}: the copy is encrypted and cannot be opened:"
                    f" {exc}; {KEY_HINT}"
                ) from None
            spool = opened

        def target_of(entry: Entry) -> Path | None:
            if place is not None:
                return place(entry)
            return Path(destinations[entry.root], entry.parsed.relative_path)

        def entries() -> Any:
            spool.seek(0)
            return read_entries(
                spool,
                layout,
                name=key,
                backup_id=backup_id,
                node=node,
                roots=len(destinations),
                sealed=keys is not None,
            )

        # First pass: validate the whole object (every key) and count, before writing anything.
        components = total = 0
        try:
            for entry in entries():
                if target_of(entry) is None:
                    continue
                components += 1
                total += entry.size_bytes
        except ValidationError as exc:
            raise DownloadRefused(f"backup {backup_id} node {node}: {exc}") from None
        tracker = Tracker(components, total, progress)
        halt = threading.Event()  # set when this download stops early: the GETs give up
        fetcher = Fetcher(
            client,
            settings.bucket,
            attempts=settings.max_attempts,
            halts=(halt, stop),
            on_bytes=tracker.transferred,
            throttle=Throttle(settings.max_bandwidth_bytes)
            if settings.max_bandwidth_bytes
            else None,
        )
        kept = 0
        window: deque[_Pending] = deque()
        with ThreadPoolExecutor(settings.concurrency, thread_name_prefix="s3-get") as pool:
            try:
                for entry in entries():
                    check_cancel()
                    target = target_of(entry)
                    if target is None:
                        continue
                    if any(pending.target == target for pending in window):
                        # Two downloads into one partial file would mix their bytes, and a
                        # component checked by its size alone could pass. Export never lists a
                        # key twice.
                        raise DownloadRefused(
                            f"manifest object {key!r} lists {entry.key!r} twice; refused"
                        )
                    if _already_there(target, entry):
                        tracker.skipped(entry.size_bytes)
                        kept += 1
                        continue
                    window.append(_start(pool, fetcher, settings, entry, target, keys))
                    # Files are finished in order; the ones already fetched at the head go now.
                    while window and (len(window) >= settings.files_in_flight or window[0].done()):
                        _wait(window[0], check_cancel)
                        _finish(window[0], tracker, halt)
                        window.popleft()
                while window:
                    _wait(window[0], check_cancel)
                    _finish(window[0], tracker, halt)
                    window.popleft()
            except BaseException:
                halt.set()
                for pending in window:
                    for _, _, future in pending.parts:
                        future.cancel()
                for pending in window:
                    wait([future for _, _, future in pending.parts])
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


def _start(  # noqa: PLR0917
    pool: ThreadPoolExecutor,
    fetcher: Fetcher,
    settings: S3Settings,
    entry: Entry,
    target: Path,
    keys: Unsealing | None,
) -> _Pending:
    """Create `target`'s partial file and hand its GETs to the threads (`keys`: the object is
    encrypted, its GETs open it as it comes)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}{PARTIAL_SUFFIX}")
    out = _open_partial(partial)
    parts: list[tuple[Span, _PartialFile, Future[None]]] = []
    threshold, part_size = settings.multipart_threshold_bytes, settings.part_size_bytes
    try:
        if keys is not None:
            total = cipher_size(entry.size_bytes)
            for part in sealed_parts(entry.size_bytes, threshold, part_size):
                writer = _PartialFile(out, part.plain_start, part.plain_length)
                future = pool.submit(
                    fetch_sealed_part,
                    fetcher,
                    keys,
                    entry.key,
                    entry.size_bytes,
                    part,
                    writer.write,
                )
                parts.append((Span(entry.key, total, part.cipher_start, 0), writer, future))
        for span in [] if keys else spans(entry.key, entry.size_bytes, threshold, part_size):
            writer = _PartialFile(out, span.start, span.length)
            parts.append((span, writer, pool.submit(fetcher.fetch, span, writer.write)))
    except BaseException:
        for _, _, future in parts:
            future.cancel()
        wait([future for _, _, future in parts])
        out.close()
        partial.unlink(missing_ok=True)
        raise
    return _Pending(entry, partial, target, out, tuple(parts))


def _wait(pending: _Pending, check_cancel: Callable[[], None]) -> None:
    """Wait for `pending`'s GETs (until one fails), but no longer than until the download is
    cancelled."""
    futures = [future for _, _, future in pending.parts]
    while True:
        done, running = wait(futures, timeout=_CANCEL_POLL_SECONDS, return_when=FIRST_EXCEPTION)
        failed = any(future.exception() is not None for future in done)
        if not running and not failed:
            return  # all of it arrived: verified and kept, even if a cancel came meanwhile
        # A GET that gave up because of the cancel is the cancel, not a failure of the file.
        check_cancel()
        if failed:
            return


def _finish(pending: _Pending, tracker: Tracker, halt: threading.Event) -> None:
    """Verify `pending`'s file and rename it into place, or refuse it naming its key (then `halt`
    is set: the other GETs stop)."""
    entry = pending.entry
    futures = [future for _, _, future in pending.parts]
    try:
        try:
            if any(future.exception() is not None for future in futures if future.done()):
                # The file's other GETs still write into it: stop them before its file closes.
                halt.set()
                wait(futures)
            failures = [error for future in futures if (error := future.exception()) is not None]
            if failures:
                # The cause, not a GET that gave up because of it.
                raise next((e for e in failures if not isinstance(e, FetchHalted)), failures[0])
        finally:
            pending.out.close()
        problem = _problem(pending.partial, entry, pending.crc32())
    except (ObjectCorrupt, ObjectTampered) as exc:
        problem = str(exc)
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
    tracker.file_transferred()


def _open_partial(path: Path) -> IO[bytes]:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    return os.fdopen(fd, "wb", buffering=0)


class _PartialFile:
    """One GET's writer into the partial file `raw` (shared by the GETs of a file's parts): it
    writes at its own position with `pwrite` and takes the CRC32 of what it writes for as long as it
    comes in order from `start`, each byte once. A writer sent back (seek) to bytes it wrote
    already knows no CRC32: the file is then read back instead."""

    def __init__(self, raw: IO[bytes], start: int = 0, length: int = 0) -> None:
        #: Bytes from `start` this writer is given (a GET's plaintext).
        self.length = length
        self._raw = raw
        self._fd = raw.fileno()
        self._start = start
        self._position = start
        self._in_order = 0  # bytes from `start` covered by `_crc`
        self._crc = 0
        self._sequential = True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if whence != os.SEEK_SET:
            raise ValueError("only absolute positions")
        self._position = offset
        return offset

    def tell(self) -> int:
        return self._position

    def write(self, data: bytes | memoryview) -> int:
        if self._sequential and self._position == self._start + self._in_order:
            self._crc = crc32(data, self._crc)
            self._in_order += len(data)
        else:
            self._sequential = False
        view = memoryview(data)
        while view:  # a regular file may take fewer bytes than asked (rarely)
            written = os.pwrite(self._fd, view, self._position)
            self._position += written
            view = view[written:]
        return len(data)

    def close(self) -> None:
        self._raw.close()

    def crc32_if_whole(self, size: int) -> int | None:
        """The CRC32 of the `size` bytes from `start` when each was written once, in order."""
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
            crc = crc32(chunk, crc)
    return crc
