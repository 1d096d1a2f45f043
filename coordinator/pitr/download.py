"""How many bytes of shipped commit log a restore to a time will download, said before it runs
(`ringsnap restore --to T --dry-run`), from the bucket alone.

A node's placement (ringsnap.agent.pitr.place) fetches every shipped segment from the base
backup's commit-log position up to the last one a process started before T can have written,
except those the backup's own commit-log volume already holds whole. Which ones those are is known
for sure only once the volume is back; before, the bucket says it: a segment whose `complete-`
marker was stored before the backup began was completed (every byte synced) before its snapshot,
so the snapshot holds it whole, or Cassandra had already deleted it and it lies before the base.
Every other segment counts whole: the one open at the snapshot is replaced by its longer shipped
copy, the later ones are fetched. The figure is an upper bound by at most the segments completed
between the backup's start and its snapshot (it relies on the bucket's and the coordinator's
clocks agreeing to the second).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from ringsnap.agent.pitr.keys import MAX_SEQUENCE_STEP, PitrKeys, SegmentState
from ringsnap.agent.pitr.segment import SegmentName
from ringsnap.agent.s3.client import S3Client
from ringsnap.agent.s3.settings import S3Settings


@dataclass(frozen=True)
class DownloadEstimate:
    node: str
    #: Segments fetched whole, oldest first.
    segments: tuple[str, ...] = field(default=())
    bytes: int = 0


def _listed(client: S3Client, bucket: str, keys: PitrKeys) -> dict[str, tuple[SegmentState, float]]:
    """Each segment with its pieces and when its complete marker was stored (epoch seconds; inf
    without one)."""
    found: dict[str, tuple[SegmentState, float]] = {}
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=bucket, Prefix=keys.log):
        for item in page.get("Contents", ()):
            parsed = keys.parse_log_key(item["Key"])
            if parsed is None:
                continue
            segment, piece = parsed
            state, marked = found.get(segment, (SegmentState(segment, []), float("inf")))
            if isinstance(piece, int):
                stored: datetime = item["LastModified"]
                state.complete, state.complete_bytes = True, piece
                marked = min(marked, stored.timestamp())
            else:
                state.pieces.append(piece)
            found[segment] = (state, marked)
    return found


def estimate_download(
    client: S3Client, settings: S3Settings, node: str, target_ms: int, backup_started: datetime
) -> DownloadEstimate:
    keys = PitrKeys(settings.prefix, node)
    before = backup_started.timestamp()
    fetched: list[tuple[int, str, int]] = []
    for name, (state, marked) in _listed(client, settings.bucket, keys).items():
        parsed = SegmentName.parse(name)
        if parsed is None or parsed.id > target_ms + MAX_SEQUENCE_STEP:
            continue  # written by a process started after T: not placed
        if marked < before:
            continue  # whole in the backup's snapshot, or before its position
        fetched.append((parsed.id, name, state.shipped))
    fetched.sort()
    return DownloadEstimate(
        node, tuple(name for _, name, _ in fetched), sum(size for _, _, size in fetched)
    )
