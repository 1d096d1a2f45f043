"""Retention of the copies on S3, and the purge of what no copy references.

The rule (docs/s3.md): a backup's copy lives as long as the backup is in the catalog, so the
snapshots' retention policies decide for the copies too. When retention (or an operator) deleted a
backup, `purge_cluster` first deletes what belongs to that backup alone (its manifest objects, its
commit-log segments and its catalog mirror) and drops its export record; then it deletes the SSTable
component objects that no kept copy references, in bulk (DeleteObjects, 1,000 keys a request), and
last the key objects of encrypted copies that no remaining object was sealed with (`purge_keys`).
Never while an export of the cluster runs: an export skips components it found in the bucket, and
the purge could delete them under it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ringsnap.agent.s3.client import S3Client
from ringsnap.agent.s3.layout import Layout
from ringsnap.agent.s3.purge import DEFAULT_MIN_AGE_SECONDS, PurgeResult, purge, referenced_keys
from ringsnap.agent.s3.purge_keys import purge_key_objects
from ringsnap.coordinator.catalog import BackupNotFoundError, Catalog
from ringsnap.coordinator.catalog.listing import MAX_PAGE_SIZE
from ringsnap.coordinator.export.mirror import delete_mirror
from ringsnap.coordinator.export.model import ExportRecord, ExportRefused, ExportState
from ringsnap.logs import get_logger

log = get_logger(__name__)

#: The data-directory index bound of a manifest object read for its keys only.
_ANY_ROOTS = 1024


@dataclass
class ClusterPurge:
    #: Backups whose copies were removed (their backup is gone from the catalog).
    copies_removed: list[str] = field(default_factory=list)
    #: Objects of those copies deleted (manifests, commit-log segments, mirror).
    copy_objects_deleted: int = 0
    #: Copies kept (their keys are referenced).
    copies_kept: int = 0
    components: PurgeResult = field(default_factory=PurgeResult)
    #: Key objects of encrypted copies no remaining object needs, deleted (`purge_keys`).
    key_objects_deleted: int = 0


def _backup_exists(catalog: Catalog, backup_id: str) -> bool:
    try:
        catalog.get_backup(backup_id)
    except BackupNotFoundError:
        return False
    return True


def _delete_prefix(client: S3Client, bucket: str, prefix: str, dry_run: bool) -> int:
    keys = [
        item["Key"]
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        for item in page.get("Contents", ())
        if not item["Key"].endswith("/")  # a directory marker (S3Proxy's filesystem backend)
    ]
    if not dry_run:
        for start in range(0, len(keys), 1000):
            chunk = keys[start : start + 1000]
            client.delete_objects(
                Bucket=bucket, Delete={"Objects": [{"Key": k} for k in chunk], "Quiet": True}
            )
    return len(keys)


def remove_copy(
    client: S3Client, bucket: str, layout: Layout, record: ExportRecord, *, dry_run: bool
) -> int:
    """Delete a backup's own objects: the manifest objects first (the copy is then no longer
    restorable, and nothing references its components), then its segments and its mirror."""
    deleted = _delete_prefix(client, bucket, layout.backups_prefix(record.backup_id), dry_run)
    for node in record.nodes:
        deleted += _delete_prefix(
            client, bucket, layout.commitlog_prefix(node.name, record.backup_id), dry_run
        )
    if dry_run:
        return deleted + _delete_prefix(
            client, bucket, layout.catalog_prefix(record.backup_id), True
        )
    return deleted + delete_mirror(client, bucket, layout, record.backup_id)


def purge_cluster(
    client: S3Client,
    bucket: str,
    layout: Layout,
    catalog: Catalog,
    cluster: str,
    *,
    nodes: list[str],
    dry_run: bool = False,
    min_age_seconds: float = DEFAULT_MIN_AGE_SECONDS,
    name_key: bytes | None = None,
) -> ClusterPurge:
    """`name_key`: the cluster's (`[s3.encryption] name_key_file`), which verifies the reference
    lists of encrypted copies (`ringsnap.agent.s3.crypto.references`)."""
    records = catalog.list_exports(cluster, limit=MAX_PAGE_SIZE)
    running = [r.backup_id for r in records if r.state is ExportState.RUNNING]
    if running:
        raise ExportRefused(
            f"an export of cluster {cluster} is running (backup {', '.join(running)}); let it"
            " finish before purging"
        )
    result = ClusterPurge()
    kept: list[tuple[str, str, int]] = []
    for record in records:
        if not _backup_exists(catalog, record.backup_id):
            result.copies_removed.append(record.backup_id)
            result.copy_objects_deleted += remove_copy(
                client, bucket, layout, record, dry_run=dry_run
            )
            if not dry_run:
                catalog.delete_export(record.backup_id)
            log.warning(
                "copy on S3 removed: its backup is no longer in the catalog",
                backup=record.backup_id,
                dry_run=dry_run,
            )
            continue
        kept += [(record.backup_id, n.name, _ANY_ROOTS) for n in record.nodes if n.exported]
    result.copies_kept = len({b for b, _, _ in kept})
    referenced = referenced_keys(client, bucket, layout, kept, name_key)
    total = PurgeResult(dry_run=dry_run)
    for node in nodes:
        one = purge(
            client,
            bucket,
            layout,
            referenced,
            node=node,
            dry_run=dry_run,
            min_age_seconds=min_age_seconds,
        )
        total.listed += one.listed
        total.referenced += one.referenced
        total.deleted += one.deleted
        total.bytes_deleted += one.bytes_deleted
        total.too_young += one.too_young
        total.delete_requests += one.delete_requests
        total.foreign_keys += one.foreign_keys
        total.seconds += one.seconds
    result.components = total
    if result.copies_removed or total.deleted:
        # Only after something was removed: deciding reads a header of each remaining object.
        for node in nodes:
            keys = purge_key_objects(
                client, bucket, layout, node, min_age_seconds=min_age_seconds, dry_run=dry_run
            )
            result.key_objects_deleted += len(keys.deleted)
    return result
