"""FlashArray REST items as ringsnap's types (volumes, snapshot infos) and the other way round."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from ringsnap.plugins.errors import UnsupportedError
from ringsnap.plugins.types import SnapshotInfo, SnapshotRef, Volume

# Purity prefixes a volume's serial with Pure's IEEE OUI to form the LUN's NAA identifier.
_WWN_PREFIX = "624a9370"


def volume_set(volumes: Sequence[Volume], array: str) -> dict[str, Volume]:
    by_name = {v.name: v for v in volumes}
    if not by_name:
        raise UnsupportedError("a group snapshot needs at least one volume", array=array)
    if len(by_name) != len(volumes):
        raise UnsupportedError("the same volume is listed twice", array=array)
    return dict(sorted(by_name.items()))


def volume_of(item: Mapping[str, Any]) -> Volume:
    serial = str(item.get("serial") or "")
    return Volume(
        name=str(item["name"]),
        id=str(item["id"]),
        size_bytes=int(item.get("provisioned") or 0),
        wwn=f"{_WWN_PREFIX}{serial}".lower() if serial else "",
    )


def snapshot_info(ref: SnapshotRef, item: Mapping[str, Any]) -> SnapshotInfo:
    warnings = []
    if item.get("destroyed"):
        remaining = item.get("time_remaining")
        when = f" in {int(remaining) // 1000} s" if remaining is not None else ""
        warnings.append(
            f"destroyed, pending eradication: the array eradicates it{when}; until then it can be"
            " recovered and its name stays taken"
        )
    space = item.get("space") or {}
    snapshots = space.get("snapshots") if isinstance(space, Mapping) else None
    return SnapshotInfo(
        ref=ref,
        space_bytes=int(snapshots) if snapshots is not None else None,
        warnings=tuple(warnings),
    )


def millis(moment: datetime) -> int:
    return round(moment.timestamp() * 1000)
