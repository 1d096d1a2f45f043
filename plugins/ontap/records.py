"""What ringsnap reads from ONTAP, as typed records: volumes, volume snapshots, consistency
groups, and the parsing of the REST answers (raw or SDK resources) into them."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

from netapp_ontap.raw_resource import RawResource


@dataclass(frozen=True)
class VolumeRecord:
    uuid: str
    name: str
    svm: str
    size: int
    is_flexclone: bool = False
    parent_volume_uuid: str = ""
    parent_snapshot_uuid: str = ""


@dataclass(frozen=True)
class SnapshotRecord:
    uuid: str
    name: str
    volume_uuid: str
    create_time: datetime.datetime
    size: int
    comment: str


@dataclass(frozen=True)
class CgRecord:
    uuid: str
    name: str
    volume_uuids: tuple[str, ...]


def resource_data(item: Any) -> dict[str, Any]:
    """The JSON of a resource: as received for raw collections, serialised for full ones."""
    if isinstance(item, RawResource):
        data: dict[str, Any] = item.resource_data
        return data
    full: dict[str, Any] = item.to_dict()
    return full


def _lookup(data: dict[str, Any], dotted: str, default: Any = None) -> Any:
    value: Any = data
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            return default
        value = value[part]
    return value


def cg_snapshot_members(data: dict[str, Any], name: str, comment: str) -> list[SnapshotRecord]:
    created = _timestamp(data.get("create_time"))
    return [
        SnapshotRecord(
            uuid=str(_lookup(item, "snapshot.uuid", "")),
            name=name,
            volume_uuid=str(_lookup(item, "volume.uuid", "")),
            create_time=created,
            size=0,
            comment=comment,
        )
        for item in data.get("snapshot_volumes") or []
    ]


def volume_record(item: Any) -> VolumeRecord:
    data = resource_data(item)
    return VolumeRecord(
        uuid=str(data["uuid"]),
        name=str(data["name"]),
        svm=str(_lookup(data, "svm.name", "")),
        size=int(data.get("size") or 0),
        is_flexclone=bool(_lookup(data, "clone.is_flexclone", False)),
        parent_volume_uuid=str(_lookup(data, "clone.parent_volume.uuid", "")),
        parent_snapshot_uuid=str(_lookup(data, "clone.parent_snapshot.uuid", "")),
    )


def snapshot_record(item: Any, volume_uuid: str) -> SnapshotRecord:
    data = resource_data(item)
    return SnapshotRecord(
        uuid=str(data["uuid"]),
        name=str(data["name"]),
        volume_uuid=volume_uuid,
        create_time=_timestamp(data.get("create_time")),
        size=int(data.get("size") or 0),
        comment=str(data.get("comment") or ""),
    )


def _timestamp(value: Any) -> datetime.datetime:
    """ONTAP times are ISO 8601 with the cluster's UTC offset."""
    if isinstance(value, datetime.datetime):
        return value
    if isinstance(value, str):
        return datetime.datetime.fromisoformat(value)
    return datetime.datetime.fromtimestamp(0, datetime.UTC)
