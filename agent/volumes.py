"""Which filesystem and block device hold each Cassandra directory, and how the device is known.

Mounts come from `/proc/self/mountinfo` (the agent's own mount namespace, which under systemd's
ProtectSystem= still shows every mount, read-only). Device identities come from sysfs: a loop
device's backing file, a disk's serial (including SCSI VPD page 0x80, where array LUN serials live)
and WWN/WWID, a multipath map's WWID; `/dev/disk/by-id` fills gaps where it exists.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ringsnap import device_ids, mountinfo
from ringsnap.mountinfo import Mount


@dataclass(frozen=True, slots=True)
class DeviceIdentity:
    """How the block device under a filesystem is known beyond this host's device names."""

    #: The SCSI unit serial number (an ONTAP LUN's ASCII serial); never an NVMe controller's.
    serial: str = ""
    #: The host's world-wide id, as read: `naa.…`/`eui.…` from sysfs, a multipath map's WWID,
    #: or a by-id link's value.
    wwn: str = ""
    loop_backing_file: str = ""
    #: An NVMe namespace's NGUID and EUI-64 (hex), where the namespace has them.
    nguid: str = ""
    eui: str = ""
    #: The UUID of the filesystem on it (filled by `NodeAgent.node_info`, which runs blkid).
    fs_uuid: str = ""
    #: Where the identity was read ("sysfs", "multipath", "by-id", ...) or why there is none.
    source: str = ""

    def identifiers(self) -> frozenset[str]:
        """The canonical ids an array's answer is compared with (`ringsnap.device_ids`). The
        serial is left out: an array names the same LUN by its NAA id, which holds it."""
        return device_ids.canonical_set((self.wwn, self.nguid, self.eui))


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


#: Where udev keeps its by-id links; `[volumes] by_id_dir` of the agent's config may name another.
BY_ID_DIR = Path("/dev/disk/by-id")
#: Device-mapper targets followed down to the one device below them (LVM, dm-crypt, a kpartx
#: partition of anything but multipath): the identity is that device's.
_MAX_DM_DEPTH = 8
_MPATH_PARTITION = re.compile(r"^part\d+-(mpath-.+)$")


def _by_id(disk_name: str, by_id_dir: Path, backing_file: str = "") -> dict[str, str]:
    """What udev-style links in `by_id_dir` that point at `disk_name` say: wwn, nguid, eui,
    serial (each from the first link that gives it). A loop device is also named by links to
    its backing file (the sandbox's fabric names LUN images so: `ringsnap.plugins.simulators.
    fabric`), which stay right whichever loop device the image is attached to."""
    found: dict[str, str] = {}
    try:
        names = sorted(os.listdir(by_id_dir))
    except OSError:
        return found
    # A deleted backing file is no longer the file a link names, even at the same path.
    deleted = backing_file.endswith(" (deleted)")
    backing = os.path.realpath(backing_file) if backing_file and not deleted else ""
    for name in names:
        target = os.path.realpath(by_id_dir / name)
        if os.path.basename(target) != disk_name and not (backing and target == backing):
            continue
        if name.startswith(("wwn-", "dm-uuid-mpath-")):
            found.setdefault("wwn", name.removeprefix("wwn-").removeprefix("dm-uuid-"))
        elif name.startswith("nvme-eui."):
            value = name.removeprefix("nvme-eui.")
            found.setdefault("nguid" if len(value) == 32 else "eui", value)
        elif name.startswith("scsi-3"):
            found.setdefault("wwn", name.removeprefix("scsi-"))
        elif not name.startswith(("dm-", "lvm-", "md-", "nvme-")):
            # e.g. scsi-S<vendor>_<model>_<serial>, virtio-<serial>. NVMe model_serial links name
            # the controller, not the namespace, so they are no identity of the volume.
            found.setdefault("serial", name.split("-", 1)[-1])
    return found


def _hex_attribute(path: Path) -> str:
    """An NVMe NGUID (`%pU`, dashed) or EUI-64 (bytes, spaced) sysfs attribute as plain hex;
    "" when absent or all zeros (the namespace has none)."""
    value = _read(path).replace("-", "").replace(" ", "").lower()
    return "" if not value or set(value) == {"0"} else value


def _below_device_mapper(disk: Path, sys_root: Path) -> tuple[Path, str, str]:
    """(device whose identity counts, multipath WWID if a multipath map was met, why none).

    A multipath map (dm uuid `mpath-<wwid>`, or `partN-mpath-<wwid>` for a partition of one) is
    the LUN itself. Other device-mapper targets (LVM, dm-crypt) with one device below them are
    followed down; over several devices (a striped or spanned LV) there is no one identity."""
    for _ in range(_MAX_DM_DEPTH):
        uuid = _read(disk / "dm" / "uuid")
        if not uuid and not (disk / "dm").is_dir():
            return disk, "", ""
        partition = _MPATH_PARTITION.match(uuid)
        if partition is not None:
            uuid = partition.group(1)
        if uuid.startswith("mpath-"):
            return disk, uuid.removeprefix("mpath-"), ""
        try:
            slaves = sorted(os.listdir(disk / "slaves"))
        except OSError:
            slaves = []
        if len(slaves) != 1:
            why = f"device-mapper {disk.name} spans {len(slaves)} devices" if slaves else ""
            return disk, "", why
        below = Path(os.path.realpath(disk / "slaves" / slaves[0]))
        disk = below.parent if (below / "partition").exists() else below
    return disk, "", f"device-mapper stack deeper than {_MAX_DM_DEPTH} at {disk.name}"


def device_identity(
    major: int,
    minor: int,
    *,
    sys_root: Path = Path("/sys"),
    by_id_dir: Path = BY_ID_DIR,
) -> DeviceIdentity:
    """Whatever stable identity the block device `major:minor` exposes; empty fields if none.

    A partition is known by its disk; a multipath map by its WWID; an LVM or dm-crypt device by
    the one device below it; an NVMe namespace by its NGUID/EUI-64 (its controller's serial is
    the same for every namespace, so it is not used); a SCSI disk by its `wwid` and VPD serial.
    Links in `by_id_dir` fill what sysfs does not say (a loop device has nothing in sysfs)."""
    if major == 0:
        return DeviceIdentity()  # not a block device (tmpfs, overlay, btrfs subvolume ...)
    node = Path(os.path.realpath(sys_root / "dev" / "block" / f"{major}:{minor}"))
    if not node.is_dir():
        return DeviceIdentity()
    disk = node.parent if (node / "partition").exists() else node
    disk, mpath_wwid, why = _below_device_mapper(disk, sys_root)
    if why:
        return DeviceIdentity(source=why)
    backing = _read(disk / "loop" / "backing_file")
    nvme = disk.name.startswith("nvme") or (disk / "nguid").exists()
    nguid = _hex_attribute(disk / "nguid") if nvme else ""
    eui = _hex_attribute(disk / "eui") if nvme else ""
    serial = "" if nvme else _read(disk / "device" / "serial") or _read(disk / "serial")
    if not nvme:
        serial = serial or _vpd_serial(disk / "device" / "vpd_pg80")
    wwn = mpath_wwid or _read(disk / "wwid") or _read(disk / "device" / "wwid")
    source = "multipath" if mpath_wwid else "sysfs" if (wwn or nguid or eui) else ""
    if not (wwn or nguid or eui) or not (serial or nvme):
        links = _by_id(disk.name, by_id_dir, backing)
        if not (wwn or nguid or eui) and links.keys() & {"wwn", "nguid", "eui"}:
            source = f"by-id links in {by_id_dir}"
        wwn = wwn or links.get("wwn", "")
        nguid, eui = nguid or links.get("nguid", ""), eui or links.get("eui", "")
        serial = serial or ("" if nvme else links.get("serial", ""))
    return DeviceIdentity(
        serial=serial, wwn=wwn, loop_backing_file=backing, nguid=nguid, eui=eui, source=source
    )


def discover(
    directories: Mapping[str, Iterable[Path]],
    *,
    mounts: list[Mount] | None = None,
    identities: bool = True,
    sys_root: Path = Path("/sys"),
    by_id_dir: Path = BY_ID_DIR,
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
                device_identity(mount.major, mount.minor, sys_root=sys_root, by_id_dir=by_id_dir)
                if identities
                else DeviceIdentity()
            ),
            kinds=frozenset(kinds),
            cassandra_directories=tuple(paths),
            aliases=tuple(aliases),
        )
        for mount, kinds, paths, aliases in found.values()
    ]
