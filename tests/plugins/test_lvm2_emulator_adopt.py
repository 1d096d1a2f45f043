"""The lvm2 emulator adopting existing image files as LVs (a sandbox LUN becoming a node's local
LV, `sandbox.das`), and its per-command latency (figures of DAS backups timed as real lvm2)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ringsnap.plugins.errors import DriverError
from ringsnap.plugins.lvm.config import LvmSettings
from ringsnap.plugins.lvm.driver import LvmDriver
from ringsnap.plugins.simulators.lunpool import temporary_xfs_pool
from ringsnap.plugins.simulators.lvm2 import REAL_LATENCY, Lvm2Emulator
from ringsnap.plugins.testing import mounts
from ringsnap.plugins.types import Volume

VG = "das1"
SIZE = 8 << 20


@pytest.fixture
def pool_root(tmp_path: Path) -> Iterator[Path]:
    missing = mounts.missing_preconditions()
    if missing:
        pytest.skip("missing precondition: " + "; ".join(missing))
    with temporary_xfs_pool(tmp_path, size_bytes=512 << 20) as pool:
        yield pool.root


def _lun(root: Path, name: str, content: bytes) -> Path:
    image = root / "luns" / f"{name}.img"
    image.parent.mkdir(exist_ok=True)
    image.write_bytes(content.ljust(SIZE, b"\0"))
    return image


def _adopted(root: Path) -> tuple[Lvm2Emulator, Path, Path]:
    data = _lun(root, "node1-data", b"data as backed up")
    commitlog = _lun(root, "node1-commitlog", b"commitlog as backed up")
    emulator = Lvm2Emulator(root / "das")
    emulator.add_vg(VG, 64 << 20)
    assert emulator.add_linear(VG, "data", SIZE, image=data) == root / "das" / VG / "data.img"
    emulator.add_thin_pool(VG, "pool", 16 << 20)
    emulator.add_thin(VG, "commitlog", SIZE, "pool", image=commitlog)
    return emulator, data, commitlog


def test_snapshots_and_merges_of_adopted_images_act_on_those_very_files(pool_root: Path) -> None:
    emulator, data, commitlog = _adopted(pool_root)
    inodes = {path: path.stat().st_ino for path in (data, commitlog)}
    driver = LvmDriver("node1-das", LvmSettings(volume_groups=[VG]), runner=emulator)
    volumes = sorted(driver.list_volumes(), key=lambda v: v.id)
    assert [v.id for v in volumes] == [f"{VG}/commitlog", f"{VG}/data"]
    ref = driver.create_group_snapshot(volumes, "b1")
    data.write_bytes(b"written later".ljust(SIZE, b"\0"))
    commitlog.write_bytes(b"written later".ljust(SIZE, b"\0"))

    driver.revert(ref)  # thick (data) and thin (commitlog) merges

    assert data.read_bytes().startswith(b"data as backed up")
    assert commitlog.read_bytes().startswith(b"commitlog as backed up")
    assert {path: path.stat().st_ino for path in (data, commitlog)} == inodes, "not the LUN"
    assert sorted(emulator.names(VG)) == ["commitlog", "data", "pool"]
    # The LVs are still the LUNs: a later snapshot sees what is written to them.
    data.write_bytes(b"third".ljust(SIZE, b"\0"))
    again = driver.create_group_snapshot([Volume(f"{VG}/data", f"{VG}/data", SIZE)], "b2")
    (member,) = again.members
    snapshot = emulator.device(VG, member.snapshot_id.split("/")[1])
    assert snapshot.read_bytes().startswith(b"third") and not snapshot.is_symlink()


def test_an_adopted_image_attached_to_a_loop_device_is_an_open_lv(pool_root: Path) -> None:
    emulator, data, _ = _adopted(pool_root)
    device = subprocess.run(
        ["losetup", "--find", "--show", str(data)], capture_output=True, text=True, check=True
    ).stdout.strip()
    try:
        driver = LvmDriver("node1-das", LvmSettings(volume_groups=[VG]), runner=emulator)
        (volume,) = [v for v in driver.list_volumes() if v.id.endswith("/data")]
        ref = driver.create_group_snapshot([volume], "b1")
        with pytest.raises(DriverError, match="open"):
            driver.revert(ref)
    finally:
        subprocess.run(["losetup", "-d", device], check=False)


def test_an_image_is_adopted_only_when_it_exists_and_is_big_enough(tmp_path: Path) -> None:
    emulator = Lvm2Emulator(tmp_path / "store")
    emulator.add_vg(VG, 64 << 20)
    with pytest.raises(FileNotFoundError, match=r"missing\.img"):
        emulator.add_linear(VG, "data", SIZE, image=tmp_path / "missing.img")
    small = tmp_path / "small.img"
    small.write_bytes(b"\0" * 4096)
    with pytest.raises(ValueError, match="smaller than LV das1/data"):
        emulator.add_linear(VG, "data", SIZE, image=small)
    assert emulator.names(VG) == []
    without_store = Lvm2Emulator()
    without_store.add_vg(VG, 64 << 20)
    with pytest.raises(RuntimeError, match="store"):
        without_store.add_linear(VG, "data", SIZE, image=small)


def test_each_command_takes_its_configured_latency() -> None:
    slept: list[float] = []
    emulator = Lvm2Emulator(latency={"lvcreate": 0.3, "lvs": 0.05}, sleep=slept.append)
    emulator.add_vg(VG, 64 << 20)
    emulator.add_linear(VG, "data", SIZE)
    emulator.run(["lvs", "--reportformat", "json", VG], timeout=10)
    emulator.run(["lvcreate", "-s", "-L", "4m", "-n", "snap", f"{VG}/data"], timeout=10)
    emulator.run(["vgs", "--reportformat", "json", VG], timeout=10)
    assert slept == [0.05, 0.3]


def test_latency_out_of_range_is_refused_naming_the_command() -> None:
    with pytest.raises(ValueError, match="latency of lvcreate"):
        Lvm2Emulator(latency={"lvcreate": -1})
    assert set(REAL_LATENCY) >= {"lvs", "vgs", "lvcreate", "lvremove", "lvconvert", "lvchange"}
