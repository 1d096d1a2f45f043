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
"""

from __future__ import annotations

import os
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from s3transfer.manager import TransferConfig, TransferManager
from s3transfer.subscribers import BaseSubscriber

from ringsnap.agent.errors import DomainError
from ringsnap.agent.manifest import SSTable
from ringsnap.agent.s3.backup_manifest import ManifestWriter
from ringsnap.agent.s3.client import S3Client
from ringsnap.agent.s3.layout import Layout, node_name
from ringsnap.agent.s3.progress import Reporter, Tracker
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.logs import get_logger
from ringsnap.names import backup_id as valid_backup_id

log = get_logger(__name__)

ManifestSource = Callable[[], Iterable[list[SSTable]]]
_MAX_PARTS = 10_000


class ExportFailed(DomainError):
    """The export stopped; the message names the node, the file or key, and what to do."""


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
    def __init__(self, tracker: Tracker) -> None:
        self._tracker = tracker

    def on_progress(self, future: Any, bytes_transferred: int, **_: Any) -> None:
        self._tracker.transferred(bytes_transferred)

    def on_done(self, future: Any, **_: Any) -> None:
        self._tracker.file_transferred()


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
) -> ExportResult:
    """Upload what is missing of the node's SSTables, then the backup's manifest object."""
    valid_backup_id(backup_id)
    node_name(node)
    layout = Layout(settings.prefix)
    roots = {str(root): index for index, root in enumerate(data_directories)}
    started = time.monotonic()
    components, total, largest = _count(manifest(), roots, node)
    tracker = Tracker(components, total, progress)
    aborted = abort_stale_uploads(client, settings.bucket, layout.sstables_prefix(node))
    listing = _TableListing(client, settings.bucket)
    manifest_key = layout.manifest_key(backup_id, node)
    uploaded_bytes_before = 0
    with (
        tempfile.TemporaryFile(prefix="ringsnap-s3-manifest-") as spool,
        TransferManager(client, transfer_config(settings, largest)) as manager,
    ):
        writer = ManifestWriter(spool, backup_id=backup_id, node=node)
        window: deque[_Pending] = deque()
        subscribers = [_Progress(tracker)]
        try:
            for table, component, key in _components(manifest(), layout, node):
                root = roots[table.data_directory]
                writer.add(
                    key, root, component.size_bytes, component.mtime_ns, table.data_digest_crc32
                )
                prefix = layout.table_prefix(node, table.keyspace, table.table_directory)
                if listing.has(prefix, key, component.size_bytes):
                    tracker.skipped(component.size_bytes)
                    continue
                path = os.path.join(table.data_directory, component.path)
                _unchanged(path, component.size_bytes, component.mtime_ns, node)
                future = manager.upload(path, settings.bucket, key, subscribers=subscribers)
                window.append(_Pending(future, path, key))
                while len(window) >= settings.files_in_flight:
                    _finish(window.popleft(), node)
            while window:
                _finish(window.popleft(), node)
        except BaseException:
            for pending in window:
                pending.future.cancel()
            raise
        writer.close()
        spool.seek(0)
        uploaded_bytes_before = tracker.bytes_transferred
        # Last: from now on the backup is exported.
        manager.upload(spool, settings.bucket, manifest_key).result()
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
    batches: Iterable[list[SSTable]], layout: Layout, node: str
) -> Iterator[tuple[SSTable, Any, str]]:
    for batch in batches:
        for table in batch:
            file_prefix = f"{table.version}-{table.generation}-{table.format}-"
            for component in table.components:
                key = layout.component_key(
                    node=node,
                    keyspace=table.keyspace,
                    table_directory=table.table_directory,
                    file_prefix=file_prefix,
                    data_crc32=table.data_digest_crc32,
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


def _finish(pending: _Pending, node: str) -> None:
    try:
        pending.future.result()
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
