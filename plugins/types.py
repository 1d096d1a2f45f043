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
class HostInitiators:
    """A host as its agent reports it: the initiators it reaches arrays with.

    The array's host object for it (FlashArray host, ONTAP initiator group, E-Series host) is
    `array_host` when the config names one, else the one object that holds any of these
    initiators. Spellings are the host's (`iqn.…`, WWPNs with or without colons, `nqn.…`);
    `normalized()` is how the drivers compare them.
    """

    iqns: tuple[str, ...] = ()
    wwpns: tuple[str, ...] = ()
    nqns: tuple[str, ...] = ()
    array_host: str = ""

    def normalized(self) -> frozenset[str]:
        """Every initiator, lowercase, WWPNs as 16 hex digits without separators."""
        wwpns = {w.lower().replace(":", "").replace("-", "") for w in self.wwpns}
        return frozenset({i.lower() for i in (*self.iqns, *self.nqns)} | wwpns)

    @property
    def nvme(self) -> bool:
        """Reaches arrays over NVMe-oF only: devices are namespaces known by their NGUID."""
        return bool(self.nqns) and not (self.iqns or self.wwpns)

    def describe(self) -> str:
        named = f"host object {self.array_host!r}, " if self.array_host else ""
        return named + "initiators " + (", ".join(sorted(self.normalized())) or "(none)")


@dataclass(frozen=True)
class Presentation:
    """One volume mapped to one host: how the host finds it after a rescan."""

    volume: Volume
    #: The array's host object (or initiator group) the volume is mapped to.
    host: str
    #: The SCSI LUN id, or the NVMe namespace id.
    lun: int
    #: The device identity the host sees: the NAA WWN (SCSI) or the NGUID (NVMe), lowercase hex
    #: (`ringsnap.device_ids.canonical` spelling).
    identity: str


@dataclass(frozen=True)
class Capabilities:
    """What a driver can do, checked by the conformance suite against what it implements."""

    #: One atomic snapshot across several volumes (consistency/protection group).
    atomic_group_snapshot: bool
    revert: bool = False
    clone: bool = False
    #: Maps volumes to hosts (`Presentable`).
    present: bool = False
    #: Reverting deletes snapshots newer than the one reverted to (ONTAP restore_to).
    revert_deletes_newer: bool = False
    #: Snapshots must be deleted oldest first (E-Series).
    delete_oldest_first: bool = False
    max_volumes_per_group: int | None = None
    max_snapshots_per_volume: int | None = None
    extra: dict[str, str] = field(default_factory=dict)
