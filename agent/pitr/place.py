"""A restore to a time, on one node (Cassandra stopped, the base backup's volumes back in place):
every shipped segment from the backup's commit-log position on is put together from its pieces in
the commit-log directory, and the properties file gets `restore_point_in_time`; the start replays
them up to that moment. `finish` takes the restore lines out again once the node serves, so the
next restart does not replay anew.

The backup's position is its oldest segment in the reverted commit-log directory: older segments
hold only what the snapshot's SSTables already have. A segment the bucket holds longer than the
directory's copy replaces it (the copy in the snapshot is a prefix of the same segment); a
shorter one leaves the directory's copy (it already has those bytes). Every piece is checked
(contiguous, size, CRC32) before its segment is renamed into place; a hole on the way (a segment
reported lost, or pieces not contiguous) refuses the restore naming the segment, before anything
is placed.
"""

from __future__ import annotations

import json
import os
import zlib
from dataclasses import dataclass
from pathlib import Path

from ringsnap.agent.durable import fsync_directory
from ringsnap.agent.pitr.archiving import restore_time, write_properties
from ringsnap.agent.pitr.keys import (
    MAX_SEQUENCE_STEP,
    PitrKeys,
    SegmentState,
    gaps,
    list_segments,
)
from ringsnap.agent.pitr.segment import SegmentName, synced_end
from ringsnap.agent.pitr.settings import PitrSettings
from ringsnap.agent.s3.client import S3Client
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.errors import RingsnapError

_PARTIAL = ".ringsnap-partial"


class PlacementRefused(RingsnapError):
    """The shipped log cannot bring this node to the time asked; nothing was placed."""


@dataclass(frozen=True)
class PlannedSegment:
    name: str
    bytes: int
    replaces_local: bool


@dataclass(frozen=True)
class Placement:
    base_segment: str
    segments: tuple[PlannedSegment, ...]
    restore_point: str

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.segments if s.replaces_local)


def _read_point(client: S3Client, bucket: str, keys: PitrKeys) -> dict[str, object]:
    try:
        body = client.get_object(Bucket=bucket, Key=keys.point)["Body"].read()
    except client.exceptions.NoSuchKey:
        raise PlacementRefused(
            f"nothing shipped for this node under {keys.root}: is [pitr] enabled on its agent?"
        ) from None
    point: dict[str, object] = json.loads(body)
    return point


def plan_placement(
    client: S3Client,
    s3: S3Settings,
    *,
    node: str,
    commitlog_directory: Path,
    target_ms: int,
) -> Placement:
    """What `place` would do, checking that the bucket covers the node up to `target_ms`."""
    keys = PitrKeys(s3.prefix, node)
    point = _read_point(client, s3.bucket, keys)
    through = int(str(point.get("recoverable_through_ms", 0)))
    if target_ms > through:
        raise PlacementRefused(
            f"node {node}: the shipped commit log reaches {restore_time(through)} GMT (shipped"
            f" point minus the sync window), before the time asked {restore_time(target_ms)}"
        )
    local: dict[str, SegmentName] = {}
    for name in os.listdir(commitlog_directory):
        parsed = SegmentName.parse(name)
        if parsed is not None:
            local[name] = parsed
    if not local:
        raise PlacementRefused(
            f"node {node}: no commit-log segment in {commitlog_directory}: the base backup's"
            " commit-log position is unknown (was the commit-log volume restored?)"
        )
    base = min(local.values())
    # A segment's id is its Cassandra process's start (ms) plus its rank: one more than
    # MAX_SEQUENCE_STEP past T was written by a process started after T, which received nothing
    # at or before T. Such segments are not placed, and a hole in one (a later restore that
    # discarded its commit log) does not refuse T.
    shipped = {
        name: state
        for name, state in list_segments(client, s3.bucket, keys).items()
        if (parsed := SegmentName.parse(name)) is None or parsed.id <= target_ms + MAX_SEQUENCE_STEP
    }
    lost = gaps(shipped, base.id)
    if lost:
        raise PlacementRefused(
            f"node {node}: the shipped commit log under {keys.log} has holes from the base"
            f" backup's position on ({'; '.join(lost)}): choose a time in the window before"
            " them (`ringsnap status`), or restore a backup alone"
        )
    holes = {str(h) for h in point.get("holes", ()) or ()}  # type: ignore[attr-defined]
    planned: list[PlannedSegment] = []
    for name, state in sorted(shipped.items(), key=lambda kv: _order(kv[0])):
        parsed = SegmentName.parse(name)
        if parsed is None or parsed.id < base.id:
            continue
        if name in holes:
            raise PlacementRefused(
                f"node {node}: segment {name} is a hole in the shipped commit log (its tail may"
                " be lost): choose a time before it, or restore the backup alone"
            )
        size = state.shipped
        have = 0
        if name in local:
            have = synced_end(commitlog_directory / name, parsed.id)
        planned.append(PlannedSegment(name, size, replaces_local=size > have))
    return Placement(base.name, tuple(planned), restore_time(target_ms))


def _order(name: str) -> int:
    parsed = SegmentName.parse(name)
    return parsed.id if parsed else -1


def _fetch(
    client: S3Client, bucket: str, keys: PitrKeys, state: SegmentState, target: Path
) -> None:
    with open(target, "wb") as out:
        for piece in state.chain:
            body = client.get_object(Bucket=bucket, Key=keys.piece(state.name, piece))["Body"]
            crc = 0
            size = 0
            while chunk := body.read(1024 * 1024):
                crc = zlib.crc32(chunk, crc)
                size += len(chunk)
                out.write(chunk)
            if crc != piece.crc32 or size != piece.end - piece.start:
                raise PlacementRefused(
                    f"piece {keys.piece(state.name, piece)} does not verify (CRC32 or size):"
                    " nothing was placed for this segment"
                )
        out.flush()
        os.fsync(out.fileno())


def place(
    client: S3Client,
    s3: S3Settings,
    *,
    pitr: PitrSettings,
    node: str,
    commitlog_directory: Path,
    target_ms: int,
) -> Placement:
    plan = plan_placement(
        client, s3, node=node, commitlog_directory=commitlog_directory, target_ms=target_ms
    )
    keys = PitrKeys(s3.prefix, node)
    shipped = list_segments(client, s3.bucket, keys)
    owner = os.stat(commitlog_directory)
    for segment in plan.segments:
        if not segment.replaces_local:
            continue
        partial = commitlog_directory / f".{segment.name}{_PARTIAL}"
        try:
            _fetch(client, s3.bucket, keys, shipped[segment.name], partial)
            os.chown(partial, owner.st_uid, owner.st_gid)
            os.replace(partial, commitlog_directory / segment.name)
        finally:
            partial.unlink(missing_ok=True)
    fsync_directory(commitlog_directory)
    write_properties(pitr.properties_file, pitr.spool_directory, restore_point_ms=target_ms)
    return plan


def finish(pitr: PitrSettings) -> None:
    """The node replayed and serves: the restore lines go, the archive_command stays."""
    write_properties(pitr.properties_file, pitr.spool_directory)


__all__ = ["Placement", "PlacementRefused", "finish", "place", "plan_placement"]
