"""Export one node's SSTables of a backup to S3, from the node itself.

Input: a callable giving the node's SSTable manifest (`ringsnap.agent.manifest` batches, over the
directory tree the files live in: a native snapshot, a mounted clone) and the node's data
directories (the roots of that manifest, in order). It is called twice: a first pass counts (and
refuses an incomplete SSTable before anything is uploaded), the second uploads. Nothing of it is
kept in memory beyond one batch and the listing of one table directory.

Deciding what to upload reads no data: a component's key is its content address (see `layout`),
and a key present in the bucket with that size is that component, because S3 objects appear
whole (a PutObject or CompleteMultipartUpload either happened or did not). One ListObjectsV2 per
1,000 objects of a table directory answers for all its SSTables (a HEAD per component would cost a
request per file).

Resumable: a rerun finds what is there and uploads the rest. Multipart uploads that a killed run
left behind are listed and aborted first (logged one by one); their files are uploaded again whole.

The manifest object is written last: the backup counts as exported once it exists.

Encrypted (`[s3.encryption]`): the run's key object is written first, component keys carry a
keyed address instead of the digest, and every file and the manifest object go up sealed
(`crypto.sealing`); the encrypting reader stands in for the file where s3transfer opens it.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from s3transfer.manager import TransferConfig, TransferManager
from s3transfer.subscribers import BaseSubscriber
from s3transfer.utils import OSUtils

from ringsnap.agent.errors import DomainError
from ringsnap.agent.manifest import SSTable
from ringsnap.agent.s3.backup_manifest import ManifestWriter
from ringsnap.agent.s3.client import S3Client
from ringsnap.agent.s3.crypto.envelope import Sealer, cipher_size
from ringsnap.agent.s3.crypto.sealing import ExportSealing
from ringsnap.agent.s3.crypto.streams import EncryptingReader
from ringsnap.agent.s3.in_flight import without_writes_in_flight
from ringsnap.agent.s3.layout import Layout, node_name
from ringsnap.agent.s3.progress import Reporter, Tracker
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.logs import get_logger
from ringsnap.names import backup_id as valid_backup_id

log = get_logger(__name__)

ManifestSource = Callable[[], Iterable[list[SSTable]]]
_MAX_PARTS = 10_000
#: How long a cancelled export waits for its transfers in flight to notice (at their next read of
#: a file) before it closes their files under them: the export's source must be unmountable soon
#: after its caller went away.
CANCEL_GRACE_SECONDS = 5.0
#: How long a wait for a transfer goes without looking at the cancel event (a finished transfer
#: wakes it at once).
_CANCEL_POLL_SECONDS = 0.2


class ExportFailed(DomainError):
    """The export stopped; the message names the node, the file or key, and what to do."""


class ExportCancelled(ExportFailed):
    """The caller cancelled the export; what was uploaded stays (a rerun skips it)."""


@dataclass(frozen=True)
class ExportResult:
    backup_id: str
    node: str
    manifest_key: str
    components: int
    bytes_total: int
    files_uploaded: int
    bytes_uploaded: int
    multipart_uploads_aborted: int
    listing_requests: int
    seconds: float


def transfer_config(settings: S3Settings, largest_file: int = 0) -> TransferConfig:
    """Part size from the settings, grown when a file would need more than 10,000 parts."""
    part = settings.part_size_bytes
    while largest_file > part * _MAX_PARTS:
        part *= 2
    return TransferConfig(
        multipart_threshold=settings.multipart_threshold_bytes,
        multipart_chunksize=part,
        max_request_concurrency=settings.concurrency,
        max_submission_concurrency=2,
        max_io_queue_size=64,
        # Downloads queue received chunks (256 KiB) for the writer thread: s3transfer allows 1,000
        # (250 MiB); 64 keep the disk busy in 16 MiB.
        max_in_memory_download_chunks=64,
        max_bandwidth=settings.max_bandwidth_bytes,
    )


class _Progress(BaseSubscriber):  # type: ignore[misc]
    """Progress into the tracker. A reporter that raises (a caller gone) must not raise into
    s3transfer: its file reader calls back while it closes, and an exception there skips the
    close of the file, which then stays open (keeping a clone busy) until garbage collected. The
    exception is kept in `failure`, that transfer is cancelled and `stop` (if any) is set."""

    def __init__(self, tracker: Tracker, stop: threading.Event | None = None) -> None:
        self._tracker = tracker
        self._stop = stop
        self.failure: BaseException | None = None

    def _report(self, future: Any, call: Callable[[], None]) -> None:
        try:
            call()
        except Exception as exc:
            if self.failure is None:
                self.failure = exc
            if self._stop is not None:
                self._stop.set()
            future.cancel()

    def on_progress(self, future: Any, bytes_transferred: int, **_: Any) -> None:
        self._report(future, lambda: self._tracker.transferred(bytes_transferred))

    def on_done(self, future: Any, **_: Any) -> None:
        self._report(future, self._tracker.file_transferred)


class _Wake(BaseSubscriber):  # type: ignore[misc]
    """Sets `event` whenever a transfer ends, so that a loop waiting for one wakes at once."""

    def __init__(self, event: threading.Event) -> None:
        self._event = event

    def on_done(self, future: Any, **_: Any) -> None:
        self._event.set()


class _TrackedFiles(OSUtils):  # type: ignore[misc]
    """s3transfer's file opening, remembering every file it opened for one export (weakly), so
    that the export closes whatever s3transfer left open before it returns: nothing of the export
    may keep its source (a clone to unmount) busy after it ended."""

    def __init__(self, sealing: ExportSealing | None = None) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._files: weakref.WeakSet[Any] = weakref.WeakSet()
        self._sealing = sealing
        #: Files uploaded sealed: their size and sealer (one salt per object, however often
        #: s3transfer opens the file).
        self._sealed: dict[str, tuple[int, Sealer]] = {}

    def seal(self, filename: str, size: int, sealer: Sealer) -> None:
        with self._lock:
            self._sealed[filename] = (size, sealer)

    def unseal(self, filename: str) -> None:
        with self._lock:
            self._sealed.pop(filename, None)

    def opens_sealed(self, filename: str) -> bool:
        """Whether `open(filename)` gives the encrypted object (`sent_digest`)."""
        return filename in self._sealed and self._sealing is not None

    def get_file_size(self, filename: str) -> int:
        sealed = self._sealed.get(filename)
        return cipher_size(sealed[0]) if sealed else int(super().get_file_size(filename))

    def open(self, filename: str, mode: str) -> Any:
        sealed = self._sealed.get(filename)
        if sealed is not None and self._sealing is not None:
            opened = self._sealing.reader(filename, *sealed)
        else:
            opened = super().open(filename, mode)
        with self._lock:
            self._files.add(opened)
        return opened

    def close_all(self) -> list[str]:
        """Close the files still open; their names."""
        with self._lock:
            left = [f for f in self._files if not f.closed]
            self._files = weakref.WeakSet()
        for opened in left:
            opened.close()
        return [str(getattr(f, "name", "?")) for f in left]


@dataclass(frozen=True, slots=True)
class _Pending:
    future: Any
    path: str
    key: str


def export_node(
    client: S3Client,
    settings: S3Settings,
    *,
    backup_id: str,
    node: str,
    data_directories: Sequence[Path | str],
    manifest: ManifestSource,
    progress: Reporter | None = None,
    cancel: threading.Event | None = None,
) -> ExportResult:
    """Upload what is missing of the node's SSTables, then the backup's manifest object.

    Once `cancel` is set (or `progress` raised), no file is started, the transfers in flight are
    cancelled and given CANCEL_GRACE_SECONDS to stop, every file the export opened is closed, and
    `ExportCancelled` (or what `progress` raised) is raised: what was uploaded stays for a rerun.
    """
    valid_backup_id(backup_id)
    node_name(node)
    layout = Layout(settings.prefix)
    roots = {str(root): index for index, root in enumerate(data_directories)}
    manifest = without_writes_in_flight(manifest, node)
    started = time.monotonic()
    components, total, largest = _count(manifest(), roots, node)
    tracker = Tracker(components, total, progress)
    aborted = abort_stale_uploads(client, settings.bucket, layout.sstables_prefix(node))
    listing = _TableListing(client, settings.bucket)
    manifest_key = layout.manifest_key(backup_id, node)
    sealing = ExportSealing(settings.encryption, layout, node) if settings.encryption else None
    if sealing is not None:
        sealing.start(client, settings.bucket)
    uploaded_bytes_before = 0
    stop = cancel or threading.Event()
    ended = threading.Event()
    reporting = _Progress(tracker, stop)
    subscribers = [reporting, _Wake(ended)]

    def check_cancel() -> None:
        if not stop.is_set():
            return
        if reporting.failure is not None:
            raise reporting.failure
        raise ExportCancelled(
            f"node {node}: the export of backup {backup_id} was cancelled by its caller; what"
            " was uploaded stays (a rerun uploads only what is missing)"
        )

    files = _TrackedFiles(sealing)
    with (
        tempfile.TemporaryFile(prefix="ringsnap-s3-manifest-") as spool,
        _closing_leftovers(files, node),
        TransferManager(client, transfer_config(settings, largest), osutil=files) as manager,
    ):
        writer = ManifestWriter(spool, backup_id=backup_id, node=node)
        referenced: list[str] = []  # an encrypted copy's keys, for its reference list
        window: deque[_Pending] = deque()
        try:
            for table, component, key in _components(manifest(), layout, node, sealing):
                check_cancel()
                root = roots[table.data_directory]
                writer.add(
                    key, root, component.size_bytes, component.mtime_ns, table.data_digest_crc32
                )
                if sealing is not None:
                    referenced.append(key)
                prefix = layout.table_prefix(node, table.keyspace, table.table_directory)
                stored = cipher_size(component.size_bytes) if sealing else component.size_bytes
                if listing.has(prefix, key, stored):
                    tracker.skipped(component.size_bytes)
                    continue
                path = os.path.join(table.data_directory, component.path)
                _unchanged(path, component.size_bytes, component.mtime_ns, node)
                if sealing is not None:
                    files.seal(path, component.size_bytes, sealing.sealer(key))
                future = manager.upload(path, settings.bucket, key, subscribers=subscribers)
                window.append(_Pending(future, path, key))
                while len(window) >= settings.files_in_flight:
                    _wait(window[0], ended, check_cancel)
                    files.unseal(_finish(window.popleft(), node))
            while window:
                _wait(window[0], ended, check_cancel)
                files.unseal(_finish(window.popleft(), node))
            check_cancel()
        except BaseException:
            for pending in window:
                pending.future.cancel()
            _wind_down(window, files, node)
            raise
        writer.close()
        spool.seek(0)
        uploaded_bytes_before = tracker.bytes_transferred
        # Last: from now on the backup is exported.
        if sealing is None:
            manager.upload(spool, settings.bucket, manifest_key).result()
        else:
            # Before the manifest: a purge without the secret key reads the references there.
            sealing.put_references(client, settings.bucket, backup_id, referenced)
            size = spool.seek(0, os.SEEK_END)
            sealer = sealing.sealer(manifest_key)
            source = os.fdopen(os.dup(spool.fileno()), "rb")
            with EncryptingReader(source, size, sealer) as sealed:
                manager.upload(sealed, settings.bucket, manifest_key).result()
    done = tracker.finish()
    result = ExportResult(
        backup_id=backup_id,
        node=node,
        manifest_key=manifest_key,
        components=components,
        bytes_total=total,
        files_uploaded=done.files_transferred,
        bytes_uploaded=uploaded_bytes_before,
        multipart_uploads_aborted=aborted,
        listing_requests=listing.requests,
        seconds=time.monotonic() - started,
    )
    log.info(
        "export done",
        backup=backup_id,
        node=node,
        components=components,
        bytes=total,
        uploaded_files=result.files_uploaded,
        uploaded_bytes=result.bytes_uploaded,
        seconds=round(result.seconds, 2),
    )
    return result


def _count(
    batches: Iterable[list[SSTable]], roots: dict[str, int], node: str
) -> tuple[int, int, int]:
    components = total = largest = 0
    for batch in batches:
        for table in batch:
            if not table.complete or not table.data_digest_crc32:
                why = table.problem or "no Digest.crc32"
                raise ExportFailed(
                    f"node {node}: SSTable {table.keyspace}/{table.table_directory}"
                    f" {table.version}-{table.generation}-{table.format} is incomplete ({why});"
                    " nothing was uploaded; take a new snapshot"
                )
            if table.data_directory not in roots:
                raise ExportFailed(
                    f"node {node}: SSTable in {table.data_directory!r}, which is not one of the"
                    " data directories given to the export"
                )
            for component in table.components:
                components += 1
                total += component.size_bytes
                largest = max(largest, component.size_bytes)
    return components, total, largest


def _components(
    batches: Iterable[list[SSTable]], layout: Layout, node: str, sealing: ExportSealing | None
) -> Iterator[tuple[SSTable, Any, str]]:
    for batch in batches:
        for table in batch:
            file_prefix = f"{table.version}-{table.generation}-{table.format}-"
            tag = table.data_digest_crc32
            if sealing is not None:
                tag = sealing.sstable_tag(
                    f"{node}/{table.keyspace}/{table.table_directory}/{file_prefix}{tag}"
                )
            for component in table.components:
                key = layout.component_key(
                    node=node,
                    keyspace=table.keyspace,
                    table_directory=table.table_directory,
                    file_prefix=file_prefix,
                    data_crc32=tag,
                    component=component.name,
                    size_bytes=component.size_bytes,
                    mtime_ns=component.mtime_ns,
                )
                yield table, component, key


def _unchanged(path: str, size: int, mtime_ns: int, node: str) -> None:
    """The file is still what the manifest saw (the key promises that size)."""
    try:
        status = os.lstat(path)
    except OSError as exc:
        raise ExportFailed(
            f"node {node}: {path} cannot be read ({exc.strerror}); is the snapshot still mounted?"
        ) from None
    if status.st_size != size or status.st_mtime_ns != mtime_ns:
        raise ExportFailed(
            f"node {node}: {path} changed since the manifest was taken (size {size} ->"
            f" {status.st_size}); export from a snapshot, not from live files"
        )


def _wait(pending: _Pending, ended: threading.Event, check_cancel: Callable[[], None]) -> None:
    """Wait for `pending`'s transfer, but no longer than until the export is cancelled. `ended`
    is cleared before `done()` is looked at, so that the end of this one is never missed."""
    while True:
        ended.clear()
        if pending.future.done():
            check_cancel()  # a transfer cancelled by a failed report: say why, not "cancelled"
            return
        check_cancel()
        ended.wait(_CANCEL_POLL_SECONDS)


def _wind_down(window: Iterable[_Pending], files: _TrackedFiles, node: str) -> None:
    """After a cancel or a failure: give the cancelled transfers CANCEL_GRACE_SECONDS to stop
    (a part stops at its next read of its file), then close their files under them, so that the
    transfer manager's shutdown does not wait for them and no file of the source stays open."""
    deadline = time.monotonic() + CANCEL_GRACE_SECONDS
    for pending in window:
        while not pending.future.done() and time.monotonic() < deadline:
            time.sleep(0.05)
    if any(not pending.future.done() for pending in window):
        closed = files.close_all()
        log.warning(
            "transfers still running after the export stopped: their files closed under them",
            node=node,
            files=closed[:20],
            grace_seconds=CANCEL_GRACE_SECONDS,
        )


@contextlib.contextmanager
def _closing_leftovers(files: _TrackedFiles, node: str) -> Iterator[None]:
    """Once the transfer manager is shut down: close every file it opened and left open."""
    try:
        yield
    finally:
        left = files.close_all()
        if left:
            log.warning(
                "files of the export left open by the transfers: closed",
                node=node,
                files=left[:20],
                count=len(left),
            )


def _finish(pending: _Pending, node: str) -> str:
    """The path of `pending`'s file once its upload succeeded; `ExportFailed` if it did not."""
    try:
        pending.future.result()
        return pending.path
    except Exception as exc:
        raise ExportFailed(
            f"node {node}: upload of {pending.path} to {pending.key!r} failed: {exc};"
            " run the export again: it uploads only what is missing"
        ) from exc


class _TableListing:
    """The bucket's objects (key -> size) under one table prefix at a time."""

    def __init__(self, client: S3Client, bucket: str) -> None:
        self._client = client
        self._bucket = bucket
        self._prefix: str | None = None
        self._sizes: dict[str, int] = {}
        self.requests = 0

    def has(self, prefix: str, key: str, size: int) -> bool:
        if prefix != self._prefix:
            self._sizes = {}
            paginator = self._client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self._bucket, Prefix=prefix):
                self.requests += 1
                for item in page.get("Contents", ()):
                    self._sizes[item["Key"]] = item["Size"]
            self._prefix = prefix
        return self._sizes.get(key) == size


def abort_stale_uploads(client: S3Client, bucket: str, prefix: str) -> int:
    """Abort every unfinished multipart upload under `prefix` (a killed run's); returns how many.

    Only one export runs per node at a time, so any upload there is a leftover: its parts cost
    storage and it can never complete. Each abort is logged with its key and start time.
    """
    aborted = 0
    paginator = client.get_paginator("list_multipart_uploads")
    for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
        for upload in page.get("Uploads", ()):
            initiated = upload.get("Initiated")
            log.warning(
                "aborting a multipart upload left by an interrupted export",
                key=upload["Key"],
                upload_id=upload["UploadId"],
                initiated=initiated.isoformat() if isinstance(initiated, datetime) else None,
                now=datetime.now(UTC).isoformat(),
            )
            client.abort_multipart_upload(
                Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"]
            )
            aborted += 1
    return aborted
