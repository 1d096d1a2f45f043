"""Retention of the shipped commit log: what no retained backup can need goes.

A restore to a time places, from its base backup's commit-log position on, the segments the bucket
holds longer than the backup's volume does. A segment completed (its `complete-<bytes>` marker
written) before a backup began was either deleted by Cassandra before that backup's snapshot or is
in the snapshot whole: no restore from that backup, or a newer one, fetches it. So once the oldest
retained backup began at B, every segment completed before B is removed (its pieces, marker and
hole record); segments still open then, or completed after, stay.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from ringsnap.agent.pitr.keys import PitrKeys
from ringsnap.agent.s3.client import S3Client
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.logs import get_logger

log = get_logger(__name__)

#: DeleteObjects takes at most 1000 keys a request.
_BATCH = 1000


def purge_shipped_log(
    client: S3Client, settings: S3Settings, nodes: Iterable[str], oldest_backup_start: datetime
) -> int:
    """Remove the segments completed before `oldest_backup_start`; returns the objects removed."""
    removed = 0
    for node in nodes:
        keys = PitrKeys(settings.prefix, node)
        by_segment: dict[str, list[str]] = {}
        completed_before: set[str] = set()
        paginator = client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=settings.bucket, Prefix=keys.log):
            for item in page.get("Contents", ()):
                parsed = keys.parse_log_key(item["Key"])
                if parsed is None:
                    continue
                segment, piece = parsed
                by_segment.setdefault(segment, []).append(item["Key"])
                if isinstance(piece, int) and item["LastModified"] < oldest_backup_start:
                    completed_before.add(segment)
        doomed = [k for s in sorted(completed_before) for k in by_segment[s]]
        holes = {
            item["Key"]
            for page in paginator.paginate(Bucket=settings.bucket, Prefix=keys.holes)
            for item in page.get("Contents", ())
        }
        doomed += [keys.hole(s) for s in sorted(completed_before) if keys.hole(s) in holes]
        for start in range(0, len(doomed), _BATCH):
            batch = doomed[start : start + _BATCH]
            client.delete_objects(
                Bucket=settings.bucket,
                Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True},
            )
        if completed_before:
            log.info(
                "shipped commit log older than the oldest retained backup removed",
                node=node,
                segments=len(completed_before),
                before=oldest_backup_start.isoformat(),
            )
        removed += len(doomed)
    return removed
