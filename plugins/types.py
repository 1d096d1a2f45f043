"""Values that cross the driver interface. Frozen, serializable, free of vendor types."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime


@dataclass(frozen=True)
class Volume:
    """A volume (LUN, FlexVol, LV) on one array."""

    name: str
    #: The array's own identifier: ONTAP uuid, FlashArray id, E-Series ref, "vg/lv" for LVM.
    id: str
    size_bytes: int = 0
    wwn: str = ""


@dataclass(frozen=True)
class ConsistencyGroup:
    """A set of volumes snapshotted atomically: one write fence across all of them."""

    name: str
    volumes: tuple[Volume, ...]


@dataclass(frozen=True)
class VolumeSnapshot:
    """One member of a group snapshot: the array's image of one volume."""

    volume: Volume
    snapshot_id: str
    snapshot_name: str = ""


@dataclass(frozen=True)
class SnapshotRef:
    """Enough to find, revert, clone or delete one group snapshot later.

    Mirrored by `ringsnap.api.v1.SnapshotRef`; kept in the catalog.
    """

    array: str
    driver: str
    group: str
    snapshot_id: str
    snapshot_name: str
    created_at: datetime
    members: tuple[VolumeSnapshot, ...]
    #: Driver-specific details needed later (never secrets).
    attributes: tuple[tuple[str, str], ...] = ()

    def attribute(self, key: str, default: str = "") -> str:
        return dict(self.attributes).get(key, default)


@dataclass(frozen=True)
class SnapshotInfo:
    """What the array reports about an existing group snapshot."""

    ref: SnapshotRef
    #: Bytes the snapshot holds exclusively, where the array reports it.
    space_bytes: int | None = None
    #: Anything an operator should know (e.g. "repository 91% full", "invalid").
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class Capabilities:
    """What a driver can do, checked by the conformance suite against what it implements."""

    #: One atomic snapshot across several volumes (consistency/protection group).
    atomic_group_snapshot: bool
    revert: bool = False
    clone: bool = False
    #: Reverting deletes snapshots newer than the one reverted to (ONTAP restore_to).
    revert_deletes_newer: bool = False
    #: Snapshots must be deleted oldest first (E-Series).
    delete_oldest_first: bool = False
    max_volumes_per_group: int | None = None
    max_snapshots_per_volume: int | None = None
    extra: dict[str, str] = field(default_factory=dict)
