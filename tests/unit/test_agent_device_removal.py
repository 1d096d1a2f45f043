"""A clone found by its identity is let go of before the array unmaps it (issue 20): its buffers
flushed, a multipath map removed (`multipath -f`) and each SCSI path deleted through sysfs, read and
written under a fake root; a failing step leaves what it guards and says what to run."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from ringsnap.agent.config import VolumesSection
from ringsnap.agent.device_removal import DeviceRemoval
from ringsnap.agent.errors import CommandFailed
from tests.unit.test_agent_presented_clones import CLONE, _mounter


def _disk(root: Path, name: str) -> Path:
    delete = root / "sys/block" / name / "device/delete"
    delete.parent.mkdir(parents=True)
    delete.write_text("")
    return delete


class _Commands:
    """The commands run, each with the SCSI deletes already written at that moment."""

    def __init__(self, root: Path, fail: str = "") -> None:
        self.root = root
        self.fail = fail
        self.runs: list[tuple[list[str], list[str]]] = []

    def deleted(self) -> list[str]:
        return sorted(
            p.parent.parent.name
            for p in (self.root / "sys/block").glob("*/device/delete")
            if p.is_file() and p.read_text() == "1"
        )

    async def __call__(self, argv: Sequence[str]) -> None:
        self.runs.append((list(argv), self.deleted()))
        if self.fail and argv[0] == self.fail:
            raise CommandFailed(f"`{' '.join(argv)}` exited with 1: map in use")


def test_a_scsi_disk_is_flushed_then_deleted(tmp_path: Path) -> None:
    delete = _disk(tmp_path, "sdq")
    commands = _Commands(tmp_path)
    assert asyncio.run(DeviceRemoval(tmp_path, commands)("/dev/sdq")) == []
    assert commands.runs == [(["blockdev", "--flushbufs", "/dev/sdq"], [])]
    assert delete.read_text() == "1"


def _multipath(root: Path) -> None:
    block = root / "sys/block/dm-3"
    (block / "dm").mkdir(parents=True)
    (block / "dm/uuid").write_text("mpath-3600a098038303053453f463045727a41\n")
    (block / "dm/name").write_text("mpatha\n")
    for path in ("sdb", "sdc"):
        (block / "slaves" / path).mkdir(parents=True)
        _disk(root, path)


def test_a_multipath_map_is_removed_before_its_paths_are_deleted(tmp_path: Path) -> None:
    _multipath(tmp_path)
    commands = _Commands(tmp_path)
    assert asyncio.run(DeviceRemoval(tmp_path, commands)("/dev/dm-3")) == []
    assert commands.runs == [
        (["blockdev", "--flushbufs", "/dev/dm-3"], []),
        (["multipath", "-f", "mpatha"], []),  # no path deleted under a live map
    ]
    assert commands.deleted() == ["sdb", "sdc"]


def test_a_map_that_cannot_be_removed_keeps_its_paths_and_says_what_to_run(tmp_path: Path) -> None:
    _multipath(tmp_path)
    commands = _Commands(tmp_path, fail="multipath")
    (problem,) = asyncio.run(DeviceRemoval(tmp_path, commands)("/dev/dm-3"))
    assert "multipath map mpatha not removed" in problem and "`multipath -f mpatha`" in problem
    assert "sdb, sdc" in problem
    assert commands.deleted() == []


def test_a_delete_refused_by_the_kernel_says_where_to_write(tmp_path: Path) -> None:
    delete = _disk(tmp_path, "sdq")
    delete.unlink()
    delete.mkdir()  # writing a directory fails, whoever runs the test
    (problem,) = asyncio.run(DeviceRemoval(tmp_path, _Commands(tmp_path))("/dev/sdq"))
    assert "SCSI device sdq not deleted" in problem and str(delete) in problem


def test_nvme_loop_and_other_mapper_devices_are_left_alone(tmp_path: Path) -> None:
    (tmp_path / "sys/block/dm-4/dm").mkdir(parents=True)
    (tmp_path / "sys/block/dm-4/dm/uuid").write_text("LVM-abc\n")
    commands = _Commands(tmp_path)
    removal = DeviceRemoval(tmp_path, commands)
    for device in ("/dev/nvme0n1", "/dev/loop4", "/dev/dm-4", "/dev/sdz"):  # sdz: no sysfs entry
        assert asyncio.run(removal(device)) == []
    assert commands.runs == []


def test_unmounting_a_clone_found_by_identity_lets_go_of_its_device_after_the_unmount(
    tmp_path: Path,
) -> None:
    mounter, host, _ = _mounter(tmp_path, CLONE.fs_uuid)
    removed: list[str] = []

    async def remove(device: str) -> list[str]:
        removed.append(device)
        host.calls.append(("remove", device))
        return ["buffers not flushed (a test)"]  # logged; the unmount still succeeds

    mounter.remove_device = remove
    asyncio.run(mounter.mount("exp-1", [CLONE], read_only=True))
    assert asyncio.run(mounter.unmount("exp-1")) == ["c_data"]
    assert removed == ["/dev/loop4"]
    kinds = [call[0] for call in host.calls]
    assert kinds.index("umount") < kinds.index("remove")


def test_a_clone_an_attach_hook_attached_is_not_removed_by_the_agent(tmp_path: Path) -> None:
    """The hook's side (the operator's own detach hook, or none) decides for what it attached."""
    mounter, _, by_id = _mounter(tmp_path, CLONE.fs_uuid)
    removed: list[str] = []

    async def remove(device: str) -> list[str]:
        removed.append(device)
        return []

    mounter.remove_device = remove
    asyncio.run(mounter.mount("exp-1", [CLONE], read_only=True))
    mounter.settings = VolumesSection(by_id_dir=by_id, attach_command=["/bin/true"])
    assert asyncio.run(mounter.unmount("exp-1")) == ["c_data"]
    assert removed == []
