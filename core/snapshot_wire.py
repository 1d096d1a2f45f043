"""Snapshot references and volumes as v1 messages (`types.proto`), both ways: what the agent's
node-local snapshot service and the coordinator's client of it exchange.

`ref_of`/`volume_of` read what a peer sent; they check nothing an array would not (the receiving
side validates names where it uses them).
"""

from __future__ import annotations

from ringsnap.api.v1 import types_pb2
from ringsnap.plugins.types import SnapshotRef, Volume, VolumeSnapshot
from ringsnap.wire import moment, timestamp


def volume_message(value: Volume, array: str = "") -> types_pb2.Volume:
    return types_pb2.Volume(
        array=array, name=value.name, id=value.id, size_bytes=value.size_bytes, wwn=value.wwn
    )


def volume_of(message: types_pb2.Volume) -> Volume:
    return Volume(name=message.name, id=message.id, size_bytes=message.size_bytes, wwn=message.wwn)


def ref_message(ref: SnapshotRef) -> types_pb2.SnapshotRef:
    return types_pb2.SnapshotRef(
        array=ref.array,
        driver=ref.driver,
        group=ref.group,
        snapshot_id=ref.snapshot_id,
        snapshot_name=ref.snapshot_name,
        created_at=timestamp(ref.created_at),
        members=[
            types_pb2.VolumeSnapshot(
                volume=volume_message(m.volume, ref.array),
                snapshot_id=m.snapshot_id,
                snapshot_name=m.snapshot_name,
            )
            for m in ref.members
        ],
        attributes=dict(ref.attributes),
    )


def ref_of(message: types_pb2.SnapshotRef) -> SnapshotRef:
    return SnapshotRef(
        array=message.array,
        driver=message.driver,
        group=message.group,
        snapshot_id=message.snapshot_id,
        snapshot_name=message.snapshot_name,
        created_at=moment(message.created_at),
        members=tuple(
            VolumeSnapshot(
                volume=volume_of(m.volume),
                snapshot_id=m.snapshot_id,
                snapshot_name=m.snapshot_name,
            )
            for m in message.members
        ),
        attributes=tuple(sorted(message.attributes.items())),
    )
