"""Which filesystem and block device hold each Cassandra directory, and how the device is known.

Mounts come from `/proc/self/mountinfo` (the agent's own mount namespace, which under systemd's
ProtectSystem= still shows every mount, read-only). Device identities come from sysfs: a loop
device's backing file, a disk's serial (including SCSI VPD page 0x80, where array LUN serials live)
and WWN/WWID, a multipath map's WWID; `/dev/disk/by-id` fills gaps where it exists.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ringsnap import mountinfo
from ringsnap.mountinfo import Mount


@dataclass(frozen=True, slots=True)
class DeviceIdentity:
    serial: str = ""
    wwn: str = ""
    loop_backing_file: str = ""


@dataclass(frozen=True, slots=True)
class NodeFilesystem:
    """A filesystem that holds one or more configured Cassandra directories."""

    mount_point: str
    device: str
    fs_type: str
    major: int
    minor: int
    identity: DeviceIdentity
    #: Kinds of Cassandra directory on it: "data", "commitlog", "saved_caches", "hints".
    kinds: frozenset[str]
    cassandra_directories: tuple[str, ...]
    #: Other mount points of the same filesystem (bind mounts) that hold configured directories.
    aliases: tuple[str, ...] = field(default=())

    @property
    def device_number(self) -> int:
        return os.makedev(self.major, self.minor)


def mount_of(path: str | Path, mounts: Iterable[Mount]) -> Mount:
    """The mount that holds `path`: the longest mount point that is `path` or one of its parents.

    `path` should already be resolved (os.path.realpath). Of several mounts on the same point, the
    last one listed is the one on top.
    """
    target = os.path.normpath(str(path))
    best: Mount | None = None
    for mount in mounts:
        point = mount.mount_point
        inside = target == point or target.startswith(point if point == "/" else point + "/")
        if inside and (best is None or len(point) >= len(best.mount_point)):
            best = mount
    if best is None:
        raise LookupError(f"no mount holds {target!r}")
    return best


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return ""


def _vpd_serial(path: Path) -> str:
    """The unit serial number of a SCSI device from VPD page 0x80 (SPC: 4-byte header, ASCII)."""
    try:
        page = path.read_bytes()
    except OSError:
        return ""
    if len(page) < 4 or page[1] != 0x80:
        return ""
    length = int.from_bytes(page[2:4], "big")
    return page[4 : 4 + length].decode("ascii", errors="replace").strip()


def _by_id(disk_name: str, dev_root: Path) -> tuple[str, str]:
    """(serial, wwn) from /dev/disk/by-id links that point at the disk, where that directory exists."""
    serial = wwn = ""
    by_id = dev_root / "disk" / "by-id"
    try:
        names = sorted(os.listdir(by_id))
    except OSError:
        return serial, wwn
    for name in names:
        if os.path.basename(os.path.realpath(by_id / name)) != disk_name:
            continue
        if name.startswith("wwn-") and not wwn:
            wwn = name.removeprefix("wwn-")
        elif not serial and not name.startswith(("wwn-", "dm-", "lvm-", "md-")):
            # e.g. scsi-<vendor>_<model>_<serial>, nvme-<model>_<serial>, virtio-<serial>
            serial = name.split("-", 1)[-1]
    return serial, wwn


def device_identity(
    major: int, minor: int, *, sys_root: Path = Path("/sys"), dev_root: Path = Path("/dev")
) -> DeviceIdentity:
    """Whatever stable identity the block device `major:minor` exposes; empty fields if none."""
    if major == 0:
        return DeviceIdentity()  # not a block device (tmpfs, overlay, btrfs subvolume ...)
    node = Path(os.path.realpath(sys_root / "dev" / "block" / f"{major}:{minor}"))
    if not node.is_dir():
        return DeviceIdentity()
    disk = node.parent if (node / "partition").exists() else node
    backing = _read(disk / "loop" / "backing_file")
    serial = _read(disk / "device" / "serial") or _read(disk / "serial")
    serial = serial or _vpd_serial(disk / "device" / "vpd_pg80")
    wwn = _read(disk / "wwid") or _read(disk / "device" / "wwid")
    dm_uuid = _read(disk / "dm" / "uuid")
    if dm_uuid.startswith("mpath-"):
        wwn = wwn or dm_uuid.removeprefix("mpath-")
    if not (serial and wwn):
        by_id_serial, by_id_wwn = _by_id(disk.name, dev_root)
        serial, wwn = serial or by_id_serial, wwn or by_id_wwn
    return DeviceIdentity(serial=serial, wwn=wwn, loop_backing_file=backing)


def discover(
    directories: Mapping[str, Iterable[Path]],
    *,
    mounts: list[Mount] | None = None,
    identities: bool = True,
    sys_root: Path = Path("/sys"),
    dev_root: Path = Path("/dev"),
) -> list[NodeFilesystem]:
    """The filesystems behind `directories` ({kind: paths}), one per filesystem, in config order.

    Two mounts of one device (bind mounts) are one filesystem: freezing either freezes both.
    """
    if mounts is None:
        mounts = mountinfo.read()
    found: dict[tuple[int, int], tuple[Mount, set[str], list[str], list[str]]] = {}
    for kind, paths in directories.items():
        for path in paths:
            mount = mount_of(os.path.realpath(path), mounts)
            key = (mount.major, mount.minor)
            entry = found.setdefault(key, (mount, set(), [], []))
            entry[1].add(kind)
            if str(path) not in entry[2]:
                entry[2].append(str(path))
            if mount.mount_point != entry[0].mount_point and mount.mount_point not in entry[3]:
                entry[3].append(mount.mount_point)
    return [
        NodeFilesystem(
            mount_point=mount.mount_point,
            device=mount.source,
            fs_type=mount.fs_type,
            major=mount.major,
            minor=mount.minor,
            identity=(
                device_identity(mount.major, mount.minor, sys_root=sys_root, dev_root=dev_root)
                if identities
                else DeviceIdentity()
            ),
            kinds=frozenset(kinds),
            cassandra_directories=tuple(paths),
            aliases=tuple(aliases),
        )
        for mount, kinds, paths, aliases in found.values()
    ]
