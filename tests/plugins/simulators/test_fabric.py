"""The sandbox's fabric (`plugins.simulators.fabric`): a mapped clone's link names a device; a
device that goes takes its links with it, and a new array (simulator) starts with no mapping."""

from __future__ import annotations

import os
from pathlib import Path

from ringsnap.plugins.simulators import fabric
from ringsnap.plugins.simulators.lunpool import LunPool

NAA = "600a0980" + "ab" * 12
CLONE_NAA = "600a0980" + "cd" * 12


def _pool(tmp_path: Path) -> Path:
    (tmp_path / "luns").mkdir(parents=True)
    image = tmp_path / "luns" / "data.img"
    image.write_bytes(b"\0" * 512)
    fabric.present(tmp_path, image, NAA)
    fabric.present(tmp_path, Path("/dev/loop7"), CLONE_NAA)  # a mapping of the last simulator
    return image


def test_a_new_array_starts_with_no_mapping_links(tmp_path: Path) -> None:
    image = _pool(tmp_path)
    LunPool(tmp_path, fabric_loops=True)
    assert fabric.named(tmp_path, image), "a volume's own link stays"
    assert not fabric.named(tmp_path, Path("/dev/loop7"))
    assert not (fabric.by_id_dir(tmp_path) / f"wwn-0x{CLONE_NAA}").is_symlink()


def test_without_loop_devices_nothing_is_swept(tmp_path: Path) -> None:
    _pool(tmp_path)
    LunPool(tmp_path)  # the simulators' own tests: links name images, none is swept
    assert fabric.named(tmp_path, Path("/dev/loop7"))


def test_withdraw_id_and_forget_device(tmp_path: Path) -> None:
    image = _pool(tmp_path)
    fabric.withdraw_id(tmp_path, f"naa.{CLONE_NAA}")
    assert not fabric.named(tmp_path, Path("/dev/loop7"))
    fabric.present(tmp_path, Path("/dev/loop7"), CLONE_NAA)
    fabric.forget_device(tmp_path, "/dev/loop7")
    assert not fabric.named(tmp_path, Path("/dev/loop7")) and fabric.named(tmp_path, image)


def test_release_device_points_its_links_at_the_image(tmp_path: Path) -> None:
    """A host let go of a mapped clone's loop device: the id names the clone's image (the array
    still maps it), and deleting the clone removes that link whatever spelling of the pool it has."""
    image = _pool(tmp_path)
    clone = tmp_path / "luns" / "clone.img"
    clone.write_bytes(b"\0" * 512)
    fabric.present(tmp_path, Path("/dev/loop7"), CLONE_NAA)
    fabric.release_device(tmp_path, "/dev/loop8", clone)  # another device: nothing changes
    link = fabric.by_id_dir(tmp_path) / f"wwn-0x{CLONE_NAA}"
    assert os.readlink(link) == "/dev/loop7"

    fabric.release_device(tmp_path, "/dev/loop7", Path(os.path.realpath(clone)))
    assert not fabric.named(tmp_path, Path("/dev/loop7"))
    assert fabric.named(tmp_path, clone) and fabric.named(tmp_path, image)
    fabric.withdraw(tmp_path, clone)
    assert not link.is_symlink() and fabric.named(tmp_path, image)
