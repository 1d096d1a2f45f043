"""How ringsnap's snapshot sets read in an lvs report: a member is an LVM snapshot tagged
`ringsnap.snapshot=<name>`, named `<lv>.rs.<name>` (long names shortened with a hash); the
`SnapshotRef` and `SnapshotInfo` a set of members describes; the warnings of thick snapshots and
thin pools filling up. Pure functions over `LogicalVolume`: the driver calls lvm2."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime

from ringsnap.plugins.lvm import names
from ringsnap.plugins.lvm.report import LogicalVolume
from ringsnap.plugins.types import SnapshotInfo, SnapshotRef, Volume, VolumeSnapshot

SNAPSHOT_TAG = "ringsnap.snapshot"
_MAX_LV_NAME = 127


def volume_of(lv: LogicalVolume) -> Volume:
    return Volume(name=lv.id, id=lv.id, size_bytes=lv.size_bytes)


def origin_id(lv: LogicalVolume) -> str:
    return f"{lv.vg}/{lv.origin}"


def members_named(lvs: Iterable[LogicalVolume], name: str) -> list[LogicalVolume]:
    return [lv for lv in lvs if lv.is_snapshot and lv.tag_value(SNAPSHOT_TAG) == name]


def member_name(origin: str, name: str) -> str:
    candidate = f"{origin}.rs.{name}"
    if len(candidate) > _MAX_LV_NAME:
        digest = hashlib.sha256(f"{origin}/{name}".encode()).hexdigest()[:16]
        candidate = f"{origin[: _MAX_LV_NAME - len(digest) - 4]}.rs.{digest}"
    return names.lv_name(candidate)


def snapshot_ref(
    *,
    array: str,
    driver: str,
    name: str,
    members: Sequence[LogicalVolume],
    current: Mapping[str, LogicalVolume],
) -> SnapshotRef:
    ordered = sorted(members, key=origin_id)
    times = [lv.created_at for lv in ordered if lv.created_at is not None]
    kinds = {"thin" if lv.is_thin_volume else "thick" for lv in ordered}
    return SnapshotRef(
        array=array,
        driver=driver,
        group=",".join(origin_id(lv) for lv in ordered),
        snapshot_id=name,
        snapshot_name=name,
        created_at=min(times) if times else datetime.now(UTC),
        members=tuple(
            VolumeSnapshot(
                volume=volume_of(current[origin_id(lv)])
                if origin_id(lv) in current
                else Volume(name=origin_id(lv), id=origin_id(lv)),
                snapshot_id=lv.id,
                snapshot_name=lv.name,
            )
            for lv in ordered
        ),
        attributes=(("kind", "+".join(sorted(kinds))),),
    )


def snapshot_info(
    ref: SnapshotRef,
    members: Sequence[LogicalVolume],
    current: Mapping[str, LogicalVolume],
    expected: set[str],
    *,
    warn_percent: float,
) -> SnapshotInfo:
    """The set's copy-on-write space (thick members only) and what needs attention."""
    warnings: list[str] = []
    missing = expected - {origin_id(lv) for lv in members}
    if missing:
        warnings.append(f"incomplete: no snapshot of {', '.join(sorted(missing))}")
    space = 0
    thick_only = True
    for lv in members:
        if lv.invalid:
            warnings.append(
                f"{lv.id} is invalid: its copy-on-write space filled up; it cannot be"
                " reverted to or cloned"
            )
        elif (
            lv.snap_percent is not None and lv.is_thick_snapshot and lv.snap_percent >= warn_percent
        ):
            warnings.append(
                f"{lv.id} copy-on-write space {lv.snap_percent:.2f}% used; it becomes"
                " invalid at 100%"
            )
        if lv.merging:
            warnings.append(f"{lv.id} is being merged into its origin")
        if lv.is_thick_snapshot and lv.snap_percent is not None:
            space += int(lv.size_bytes * lv.snap_percent / 100)
        else:
            thick_only = False
    origins = [current[origin_id(lv)] for lv in members if origin_id(lv) in current]
    warnings.extend(pool_warnings(current, origins, warn_percent))
    return SnapshotInfo(
        ref=ref, space_bytes=space if thick_only else None, warnings=tuple(warnings)
    )


def pool_warnings(
    current: Mapping[str, LogicalVolume], origins: Iterable[LogicalVolume], threshold: float
) -> list[str]:
    warnings = []
    pools = sorted({f"{lv.vg}/{lv.pool}" for lv in origins if lv.is_thin_volume and lv.pool})
    for pool_id in pools:
        pool = current.get(pool_id)
        if pool is not None and pool.data_percent is not None and pool.data_percent >= threshold:
            warnings.append(
                f"thin pool {pool_id} is {pool.data_percent:.2f}% full: a full pool stops writes to"
                " every thin volume in it"
            )
    return warnings
