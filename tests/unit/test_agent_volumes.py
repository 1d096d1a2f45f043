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
    by_id = tmp_path / "dev" / "disk" / "by-id"  # no links here
    loop = device_identity(7, 16, sys_root=sys_root, by_id_dir=by_id)
    assert loop.loop_backing_file == "/pool/luns/node1-data.img" and not loop.serial
    assert loop.identifiers() == set()
    scsi = device_identity(8, 1, sys_root=sys_root, by_id_dir=by_id)
    assert scsi.wwn == "naa.600a098038303053453f463045727a30" and scsi.serial == "80R0S?F0Erz0"
    assert scsi.identifiers() == {"600a098038303053453f463045727a30"} and scsi.source == "sysfs"
    nvme = device_identity(259, 0, sys_root=sys_root, by_id_dir=by_id)
    # The controller's serial is every namespace's: never taken for the volume's identity.
    assert (nvme.serial, nvme.wwn) == ("", "eui.0025385b71b07e2f")
    mpath = device_identity(253, 3, sys_root=sys_root, by_id_dir=by_id)
    assert mpath.wwn == "3624a93701c0d5f6c7a1b4a0b00011234" and mpath.source == "multipath"
    assert mpath.identifiers() == {"624a93701c0d5f6c7a1b4a0b00011234"}
    assert device_identity(0, 50, sys_root=sys_root) == device_identity(9, 9, sys_root=sys_root)


def _dm(sys_root: Path, name: str, uuid: str, slaves: list[Path]) -> Path:
    device = sys_root / "devices" / "virtual" / "block" / name
    (device / "dm").mkdir(parents=True)
    (device / "dm" / "uuid").write_text(uuid + "\n")
    (device / "slaves").mkdir()
    for slave in slaves:
        os.symlink(slave, device / "slaves" / slave.name)
    return device


def _link(sys_root: Path, number: str, target: Path) -> None:
    block = sys_root / "dev" / "block"
    block.mkdir(parents=True, exist_ok=True)
    os.symlink(target, block / number)


def test_lvm_on_a_partition_of_a_multipath_map_is_known_by_the_luns_wwid(tmp_path: Path) -> None:
    """dm-5 (LVM) -> dm-4 (kpartx partition part1-mpath-…) -> the map's WWID."""
    sys_root = tmp_path / "sys"
    wwid = "3600a098038303053453f463045727a30"
    sda = sys_root / "devices" / "pci" / "host0" / "block" / "sda"
    sda.mkdir(parents=True)
    (sda / "device").mkdir()
    (sda / "device" / "wwid").write_text("naa.600a0980ffffffffffffffffffffffff\n")
    mpath = _dm(sys_root, "dm-2", f"mpath-{wwid}", [sda])
    partition = _dm(sys_root, "dm-4", f"part1-mpath-{wwid}", [mpath])
    lvm = _dm(
        sys_root, "dm-5", "LVM-k3Jz0AbCdEfGhIjKlMnOpQrStUvWxYz0123456789abcdefghijklmn", [partition]
    )
    _link(sys_root, "253:5", lvm)
    identity = device_identity(253, 5, sys_root=sys_root, by_id_dir=tmp_path / "none")
    assert identity.wwn == wwid and identity.source == "multipath"
    assert identity.identifiers() == {wwid[1:]}


def test_lvm_over_two_devices_has_no_identity_and_says_why(tmp_path: Path) -> None:
    sys_root = tmp_path / "sys"
    disks = []
    for name, wwid in (("sdb", "naa.600a0980aa"), ("sdc", "naa.600a0980bb")):
        disk = sys_root / "devices" / "pci" / "block" / name
        (disk / "device").mkdir(parents=True)
        (disk / "device" / "wwid").write_text(wwid)
        disks.append(disk)
    lvm = _dm(sys_root, "dm-7", "LVM-striped", disks)
    _link(sys_root, "253:7", lvm)
    identity = device_identity(253, 7, sys_root=sys_root, by_id_dir=tmp_path / "none")
    assert identity.identifiers() == set()
    assert identity.source == "device-mapper dm-7 spans 2 devices"


def test_nvme_namespace_is_known_by_its_nguid_and_eui(tmp_path: Path) -> None:
    """A FlashArray namespace over NVMe-oF: wwid eui.<NGUID>, nguid dashed, eui spaced."""
    sys_root = tmp_path / "sys"
    namespace = sys_root / "devices" / "virtual" / "nvme-subsystem" / "nvme-subsys0" / "nvme0n2"
    (namespace / "p1").mkdir(parents=True)
    (namespace / "p1" / "partition").write_text("1\n")
    (namespace / "device").mkdir()
    (namespace / "device" / "serial").write_text("CONTROLLER-SERIAL\n")
    (namespace / "wwid").write_text("eui.003b7b308d98f94224a9375e00018816\n")
    (namespace / "nguid").write_text("003b7b30-8d98-f942-24a9-375e00018816\n")
    (namespace / "eui").write_text("00 00 00 00 00 00 00 00\n")
    _link(sys_root, "259:3", namespace / "p1")
    identity = device_identity(259, 3, sys_root=sys_root, by_id_dir=tmp_path / "none")
    assert identity.nguid == "003b7b308d98f94224a9375e00018816"
    assert identity.eui == "" and identity.serial == ""
    assert identity.identifiers() == {"003b7b308d98f94224a9375e00018816"}


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
    identity = device_identity(8, 16, sys_root=sys_root, by_id_dir=by_id)
    assert identity.wwn == "0x600a098038303053" and identity.serial == "SNETAPP_LUN_C-Mode_80R0S"
    assert identity.source == f"by-id links in {by_id}"


def test_a_loop_device_is_known_by_the_link_of_the_by_id_dir_it_is_given(tmp_path: Path) -> None:
    """The sandbox's fabric: a `wwn-0x…` link to /dev/loopN in a directory of its own."""
    sys_root = tmp_path / "sys"
    loop = sys_root / "devices" / "virtual" / "block" / "loop7"
    (loop / "loop").mkdir(parents=True)
    (loop / "loop" / "backing_file").write_text("/pool/luns/n1-data.img\n")
    _link(sys_root, "7:7", loop)
    fabric = tmp_path / "fabric" / "node1"
    fabric.mkdir(parents=True)
    os.symlink("/dev/loop7", fabric / "wwn-0x600a0980383030534d3f463045727a31")
    os.symlink("/dev/loop70", fabric / "wwn-0x600a0980ffffffffffffffffffffffff")
    os.symlink("/dev/loop7", fabric / "nvme-eui.0025385b71b07e2f")
    identity = device_identity(7, 7, sys_root=sys_root, by_id_dir=fabric)
    assert identity.identifiers() == {
        "600a0980383030534d3f463045727a31",
        "0025385b71b07e2f",
    }
    assert identity.loop_backing_file == "/pool/luns/n1-data.img"
    assert device_identity(7, 7, sys_root=sys_root).identifiers() == set()


def test_real_mountinfo_holds_root() -> None:
    assert mount_of("/", read()).mount_point == "/"


def test_a_loop_device_is_named_by_links_to_its_backing_file(tmp_path: Path) -> None:
    """The sandbox's fabric names LUN images; whichever loop device an image is attached to is
    known by that name, and a deleted image names nothing."""
    from ringsnap.plugins.simulators import fabric

    pool = tmp_path / "pool"
    (pool / "luns").mkdir(parents=True)
    image = pool / "luns" / "n1-data.img"
    image.touch()
    fabric.present(pool, image, "naa.600A0980383030534D3F463045727A31")
    fabric.present(pool, image, "naa.600a0980383030534d3f463045727a31")  # idempotent
    sys_root = tmp_path / "sys"
    for number, name, backing in (
        ("7:3", "loop3", str(image)),
        ("7:4", "loop4", f"{image} (deleted)"),
    ):
        loop = sys_root / "devices" / "virtual" / "block" / name
        (loop / "loop").mkdir(parents=True)
        (loop / "loop" / "backing_file").write_text(backing + "\n")
        _link(sys_root, number, loop)
    by_id = fabric.by_id_dir(pool)
    assert os.listdir(by_id) == ["wwn-0x600a0980383030534d3f463045727a31"]
    found = device_identity(7, 3, sys_root=sys_root, by_id_dir=by_id)
    assert found.identifiers() == {"600a0980383030534d3f463045727a31"}
    assert device_identity(7, 4, sys_root=sys_root, by_id_dir=by_id).identifiers() == set()
    # Named again (a volume made anew under that name): the old id goes.
    fabric.present(pool, image, "600a0980ffffffffffffffffffffffff")
    assert os.listdir(by_id) == ["wwn-0x600a0980ffffffffffffffffffffffff"]
    fabric.withdraw(pool, image)
    assert os.listdir(by_id) == []
