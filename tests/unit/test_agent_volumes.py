"""Mount and device discovery: longest-prefix lookup, sysfs identities."""

from __future__ import annotations

import os
from pathlib import Path

from ringsnap.agent.volumes import device_identity, discover, mount_of
from ringsnap.mountinfo import parse, read

MOUNTINFO = """\
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard
42 27 254:0 /var/lib/docker /var/lib/docker rw,relatime shared:1 - ext4 /dev/vda rw
60 27 7:16 / /var/lib/ringsnap/sandbox/a/mnt/node1/data rw,relatime - ext4 /dev/loop16 rw
61 27 7:17 / /var/lib/ringsnap/sandbox/a/mnt/node1/commitlog rw,relatime - ext4 /dev/loop17 rw
62 27 8:1 / /srv/with\\040space rw - xfs /dev/sda1 rw
63 27 7:16 /data /srv/bind rw - ext4 /dev/loop16 rw
64 27 0:50 / /srv/tmp rw - tmpfs tmpfs rw
65 27 7:99 / /var/lib/ringsnap/sandbox/a/mnt/node1/data rw,relatime - ext4 /dev/loop99 rw
garbage line
"""


def test_mount_of_takes_longest_prefix_and_the_top_mount() -> None:
    mounts = parse(MOUNTINFO)
    assert mount_of("/var/lib/ringsnap/sandbox/a/mnt/node1/commitlog/commitlog", mounts).minor == 17
    # two mounts on one point: the later one is on top
    assert mount_of("/var/lib/ringsnap/sandbox/a/mnt/node1/data/data", mounts).minor == 99
    assert mount_of("/var/lib/ringsnap/sandbox/a/mnt/node1/datax", mounts).mount_point == "/"
    assert mount_of("/srv/with space/x", mounts).fs_type == "xfs"
    assert mount_of("/", mounts).source == "/dev/vda"


def test_discover_merges_bind_mounts_of_one_device_and_records_roles() -> None:
    mounts = parse(MOUNTINFO)[:-1]
    filesystems = discover(
        {
            "data": [Path("/var/lib/ringsnap/sandbox/a/mnt/node1/data/data")],
            "commitlog": [Path("/srv/bind/commitlog")],
            "saved_caches": [Path("/var/lib/ringsnap/sandbox/a/mnt/node1/data/saved_caches")],
            "hints": [Path("/srv/tmp/hints")],
        },
        mounts=mounts,
        identities=False,
    )
    assert len(filesystems) == 2
    loop, tmpfs = filesystems
    assert loop.mount_point == "/var/lib/ringsnap/sandbox/a/mnt/node1/data"
    assert loop.aliases == ("/srv/bind",)
    assert loop.kinds == {"data", "commitlog", "saved_caches"}
    assert loop.device == "/dev/loop16" and loop.device_number == os.makedev(7, 16)
    assert tmpfs.kinds == {"hints"} and tmpfs.fs_type == "tmpfs"


def fake_sysfs(root: Path) -> Path:
    sys_root = root / "sys"
    devices = sys_root / "devices"
    loop = devices / "virtual" / "block" / "loop16"
    (loop / "loop").mkdir(parents=True)
    (loop / "loop" / "backing_file").write_text("/pool/luns/node1-data.img\n")
    disk = devices / "pci0000:00" / "host0" / "block" / "sda"
    (disk / "sda1").mkdir(parents=True)
    (disk / "sda1" / "partition").write_text("1\n")
    (disk / "device").mkdir()
    (disk / "device" / "wwid").write_text("naa.600a098038303053453f463045727a30\n")
    # VPD page 0x80: peripheral, page code, 2-byte length, then the unit serial number
    serial = b"80R0S?F0Erz0"
    (disk / "device" / "vpd_pg80").write_bytes(bytes([0, 0x80, 0, len(serial)]) + serial)
    nvme = devices / "pci0000:00" / "nvme" / "nvme0" / "nvme0n1"
    (nvme / "device").mkdir(parents=True)
    (nvme / "wwid").write_text("eui.0025385b71b07e2f\n")
    (nvme / "device" / "serial").write_text("S4EWNX0R123456  \n")
    mpath = devices / "virtual" / "block" / "dm-3"
    (mpath / "dm").mkdir(parents=True)
    (mpath / "dm" / "uuid").write_text("mpath-3624a93701c0d5f6c7a1b4a0b00011234\n")
    block = sys_root / "dev" / "block"
    block.mkdir(parents=True)
    for name, target in (("7:16", loop), ("8:1", disk / "sda1"), ("259:0", nvme), ("253:3", mpath)):
        os.symlink(target, block / name)
    return sys_root


def test_device_identities_from_sysfs(tmp_path: Path) -> None:
    sys_root = fake_sysfs(tmp_path)
    dev_root = tmp_path / "dev"  # no /dev/disk/by-id here
    loop = device_identity(7, 16, sys_root=sys_root, dev_root=dev_root)
    assert loop.loop_backing_file == "/pool/luns/node1-data.img" and not loop.serial
    scsi = device_identity(8, 1, sys_root=sys_root, dev_root=dev_root)
    assert scsi.wwn == "naa.600a098038303053453f463045727a30" and scsi.serial == "80R0S?F0Erz0"
    nvme = device_identity(259, 0, sys_root=sys_root, dev_root=dev_root)
    assert (nvme.serial, nvme.wwn) == ("S4EWNX0R123456", "eui.0025385b71b07e2f")
    mpath = device_identity(253, 3, sys_root=sys_root, dev_root=dev_root)
    assert mpath.wwn == "3624a93701c0d5f6c7a1b4a0b00011234"
    assert device_identity(0, 50, sys_root=sys_root) == device_identity(9, 9, sys_root=sys_root)


def test_by_id_links_fill_gaps(tmp_path: Path) -> None:
    sys_root = tmp_path / "sys"
    disk = sys_root / "devices" / "block" / "sdb"
    disk.mkdir(parents=True)
    (sys_root / "dev" / "block").mkdir(parents=True)
    os.symlink(disk, sys_root / "dev" / "block" / "8:16")
    by_id = tmp_path / "dev" / "disk" / "by-id"
    by_id.mkdir(parents=True)
    (tmp_path / "dev" / "sdb").touch()
    os.symlink("../../sdb", by_id / "wwn-0x600a098038303053")
    os.symlink("../../sdb", by_id / "scsi-SNETAPP_LUN_C-Mode_80R0S")
    identity = device_identity(8, 16, sys_root=sys_root, dev_root=tmp_path / "dev")
    assert identity.wwn == "0x600a098038303053" and identity.serial == "SNETAPP_LUN_C-Mode_80R0S"


def test_real_mountinfo_holds_root() -> None:
    assert mount_of("/", read()).mount_point == "/"
