"""Purge: delete every component object no kept backup references, in bulk.

The referenced keys are those of the manifest objects of the backups still kept
(`referenced_keys`), held in a set (about 150 bytes a key). Objects are listed under the
components' prefix and deleted 1,000 keys per DeleteObjects request (the S3 maximum), up to
`DELETE_CONCURRENCY` requests at a time.

Objects younger than `min_age_seconds` are never deleted: an export in progress has uploaded
components its manifest object does not yet reference. A key of the listing that is not a
component key of the layout is reported and left alone (it is not ours to delete).
"""

from __future__ import annotations

import tempfile
import time
from collections import deque
from collections.abc import Container, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from ringsnap.agent.errors import DomainError
from ringsnap.agent.s3.backup_manifest import read_entries
from ringsnap.agent.s3.client import S3Client
from ringsnap.agent.s3.crypto.envelope import MAGIC
from ringsnap.agent.s3.crypto.references import read_references
from ringsnap.agent.s3.crypto.sealing import is_sealed
from ringsnap.agent.s3.layout import Layout
from ringsnap.errors import ValidationError
from ringsnap.logs import get_logger

log = get_logger(__name__)

DELETE_BATCH = 1000
DELETE_CONCURRENCY = 4
DEFAULT_MIN_AGE_SECONDS = 6 * 3600


class PurgeFailed(DomainError):
    """The store refused some deletions; the message names keys and codes."""


@dataclass
class PurgeResult:
    listed: int = 0
    referenced: int = 0
    deleted: int = 0
    bytes_deleted: int = 0
    too_young: int = 0
    delete_requests: int = 0
    dry_run: bool = False
    #: Keys under the prefix that are not component keys (left in place).
    foreign_keys: list[str] = field(default_factory=list)
    seconds: float = 0.0


def referenced_keys(
    client: S3Client,
    bucket: str,
    layout: Layout,
    backups: Iterable[tuple[str, str, int]],
    name_key: bytes | None = None,
) -> set[str]:
    """Every component key of the given (backup id, node, data directory count) manifest objects.

    An encrypted copy's manifest does not open without a recipient's secret key: its reference
    list (`crypto.references`) is read instead, verified with the cluster's `name_key`. Any
    failure raises, and then nothing is deleted: the purge needs every kept copy's references."""
    keys: set[str] = set()
    for backup, node, roots in backups:
        key = layout.manifest_key(backup, node)
        with tempfile.TemporaryFile(prefix="ringsnap-s3-manifest-") as spool:
            client.download_fileobj(bucket, key, spool)
            spool.seek(0)
            if is_sealed(spool.read(len(MAGIC))):
                keys |= _sealed_references(client, bucket, layout, backup, node, name_key)
                continue
            spool.seek(0)
            for entry in read_entries(
                spool, layout, name=key, backup_id=backup, node=node, roots=roots
            ):
                keys.add(entry.key)
    return keys


def _sealed_references(  # noqa: PLR0917 - where the list is and the key that verifies it
    client: S3Client,
    bucket: str,
    layout: Layout,
    backup: str,
    node: str,
    name_key: bytes | None,
) -> set[str]:
    manifest = layout.manifest_key(backup, node)
    if name_key is None:
        raise ValidationError(
            f"manifest object {manifest!r} is encrypted: its reference list is verified with the"
            " cluster's name key, and this [s3] has no [s3.encryption] name_key_file (give the"
            " coordinator the nodes' one); nothing was deleted"
        )
    key = layout.references_key(backup, node)
    try:
        body = client.get_object(Bucket=bucket, Key=key)["Body"]
        try:
            data = body.read()
        finally:
            body.close()
    except Exception as exc:
        raise ValidationError(
            f"manifest object {manifest!r} is encrypted and its reference list {key!r} cannot be"
            f" read ({exc}; a copy exported before ringsnap wrote one has none): export backup"
            f" {backup} again, or remove it by hand; nothing was deleted"
        ) from None
    return read_references(name_key, layout, backup, node, data)


def purge(
    client: S3Client,
    bucket: str,
    layout: Layout,
    referenced: Container[str],
    *,
    node: str = "",
    dry_run: bool = False,
    min_age_seconds: float = DEFAULT_MIN_AGE_SECONDS,
    would_delete: list[str] | None = None,
) -> PurgeResult:
    """Delete unreferenced component objects (of `node`, or of every node).

    With `dry_run`, nothing is deleted; the keys that would be are appended to `would_delete`.
    """
    started = time.monotonic()
    result = PurgeResult(dry_run=dry_run)
    cutoff = datetime.now(UTC) - timedelta(seconds=min_age_seconds)
    batch: list[str] = []
    window: deque[Future[list[dict[str, Any]]]] = deque()
    errors: list[dict[str, Any]] = []
    pool = ThreadPoolExecutor(max_workers=DELETE_CONCURRENCY, thread_name_prefix="ringsnap-purge")

    def send(keys: list[str]) -> None:
        # Requests overlap (the store spends most of a DeleteObjects on its own I/O), a bounded
        # number at a time while the listing goes on.
        window.append(pool.submit(_delete, client, bucket, keys))
        result.delete_requests += 1
        result.deleted += len(keys)
        while len(window) >= 2 * DELETE_CONCURRENCY:
            errors.extend(window.popleft().result())

    for key, size, modified in _listing(client, bucket, layout.sstables_prefix(node)):
        if key.endswith("/"):
            continue  # a directory marker (S3Proxy's filesystem backend lists its directories)
        result.listed += 1
        try:
            layout.parse_component_key(key)
        except ValidationError:
            log.warning("purge leaves a key that is not a component key", key=key)
            result.foreign_keys.append(key)
            continue
        if key in referenced:
            result.referenced += 1
            continue
        if modified > cutoff:
            result.too_young += 1
            continue
        result.bytes_deleted += size
        if dry_run:
            result.deleted += 1
            if would_delete is not None:
                would_delete.append(key)
            continue
        batch.append(key)
        if len(batch) == DELETE_BATCH:
            send(batch)
            batch = []
    try:
        if batch:
            send(batch)
        while window:
            errors.extend(window.popleft().result())
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    result.deleted -= len(errors)
    if errors:
        shown = ", ".join(f"{e.get('Key')!r} ({e.get('Code')})" for e in errors[:5])
        raise PurgeFailed(
            f"bucket {bucket}: {len(errors)} deletion(s) refused: {shown}; run the purge again"
        )
    result.seconds = time.monotonic() - started
    log.info(
        "purge done" if not dry_run else "purge dry run",
        bucket=bucket,
        prefix=layout.sstables_prefix(node),
        listed=result.listed,
        deleted=result.deleted,
        referenced=result.referenced,
        too_young=result.too_young,
        requests=result.delete_requests,
    )
    return result


def _listing(client: S3Client, bucket: str, prefix: str) -> Iterator[tuple[str, int, datetime]]:
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", ()):
            yield item["Key"], item["Size"], item["LastModified"]


def _delete(client: S3Client, bucket: str, keys: list[str]) -> list[dict[str, Any]]:
    """One DeleteObjects request (quiet: only the refusals come back)."""
    response = client.delete_objects(
        Bucket=bucket, Delete={"Objects": [{"Key": key} for key in keys], "Quiet": True}
    )
    errors: list[dict[str, Any]] = response.get("Errors", [])
    return errors
