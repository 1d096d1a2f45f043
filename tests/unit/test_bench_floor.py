"""The floor benchmark's safety: it thaws exactly what it froze, whatever fails, and leaves no copy.

The ioctls are faked at the project's seam (`ringsnap.agent.fsfreeze`); the reflink by a byte copy
(the real one needs an XFS pool; the benchmark itself runs on the sandbox's).
"""

from __future__ import annotations

import errno
import os
import shutil
import threading
from pathlib import Path

import pytest

import bench.floor
from bench.floor import Floor, FloorTarget
from ringsnap.agent import fsfreeze


class Kernel:
    def __init__(self, frozen_by_others: set[str] | None = None) -> None:
        self.frozen: set[str] = set(frozen_by_others or ())
        self.calls: list[str] = []

    def syncfs(self, point: str) -> float:
        self.calls.append(f"syncfs {point}")
        return 0.0

    def freeze(self, point: str) -> fsfreeze.IoctlResult:
        self.calls.append(f"freeze {point}")
        if point in self.frozen:
            raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), point)
        self.frozen.add(point)
        return fsfreeze.IoctlResult(True, 0.0)

    def thaw(self, point: str) -> fsfreeze.IoctlResult:
        self.calls.append(f"thaw {point}")
        changed = point in self.frozen
        self.frozen.discard(point)
        return fsfreeze.IoctlResult(changed, 0.0)


@pytest.fixture
def targets(tmp_path: Path) -> list[FloorTarget]:
    found = []
    for name in ("a", "b", "c"):
        image = tmp_path / f"{name}.img"
        image.write_bytes(name.encode() * 64)
        found.append(FloorTarget(f"/mnt/{name}", image))
    return found


def _fake_kernel(monkeypatch: pytest.MonkeyPatch, kernel: Kernel) -> None:
    monkeypatch.setattr(fsfreeze, "syncfs", kernel.syncfs)
    monkeypatch.setattr(fsfreeze, "freeze", kernel.freeze)
    monkeypatch.setattr(fsfreeze, "thaw", kernel.thaw)


def test_a_floor_freezes_copies_every_lun_and_thaws_everything(
    tmp_path: Path, targets: list[FloorTarget], monkeypatch: pytest.MonkeyPatch
) -> None:
    kernel = Kernel()
    _fake_kernel(monkeypatch, kernel)
    copied: list[tuple[Path, Path, bool]] = []

    def reflink(source: Path, destination: Path) -> None:
        # Every filesystem is frozen while its image is copied.
        copied.append((source, destination, kernel.frozen == {t.mount_point for t in targets}))
        shutil.copyfile(source, destination)

    monkeypatch.setattr(bench.floor, "reflink", reflink)
    with Floor(targets, tmp_path / ".floor") as floor:
        run = floor.take()
    assert [source for source, _, _ in copied] == [t.image for t in targets]
    assert all(frozen for _, _, frozen in copied)
    assert kernel.frozen == set()
    assert not (tmp_path / ".floor").exists()  # every copy deleted, the scratch directory too
    assert run.window >= run.freezing + run.snapshot


def test_a_filesystem_frozen_by_someone_else_is_refused_and_left_frozen(
    tmp_path: Path, targets: list[FloorTarget], monkeypatch: pytest.MonkeyPatch
) -> None:
    kernel = Kernel(frozen_by_others={"/mnt/b"})
    _fake_kernel(monkeypatch, kernel)
    monkeypatch.setattr(bench.floor, "reflink", lambda *_: pytest.fail("copied under a refusal"))
    with Floor(targets, tmp_path / ".floor") as floor, pytest.raises(OSError) as refused:
        floor.take()
    assert refused.value.errno == errno.EBUSY
    assert kernel.frozen == {"/mnt/b"}  # ours thawed, theirs untouched
    assert "thaw /mnt/b" not in kernel.calls


def test_a_failed_copy_still_thaws_and_removes_what_was_copied(
    tmp_path: Path, targets: list[FloorTarget], monkeypatch: pytest.MonkeyPatch
) -> None:
    kernel = Kernel()
    _fake_kernel(monkeypatch, kernel)

    def reflink(source: Path, destination: Path) -> None:
        if source.name == "b.img":
            raise OSError(errno.ENOSPC, "pool full")
        shutil.copyfile(source, destination)

    monkeypatch.setattr(bench.floor, "reflink", reflink)
    with Floor(targets, tmp_path / ".floor") as floor, pytest.raises(OSError, match="pool full"):
        floor.take()
    assert kernel.frozen == set()
    assert not (tmp_path / ".floor").exists()


def test_each_node_syncs_every_filesystem_before_it_freezes_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As an agent does: the commit log is not frozen while the node's data filesystem still
    writes back (its syncfs is slow here); another node does not wait for it."""
    kernel = Kernel()
    _fake_kernel(monkeypatch, kernel)
    slow = threading.Event()

    def syncfs(point: str) -> float:
        if point == "/mnt/n1-data":
            slow.wait(0.3)
        kernel.calls.append(f"synced {point}")
        return 0.0

    monkeypatch.setattr(fsfreeze, "syncfs", syncfs)
    monkeypatch.setattr(bench.floor, "reflink", shutil.copyfile)
    targets = []
    for name in ("n1-data", "n1-commitlog", "n2-data", "n2-commitlog"):
        image = tmp_path / f"{name}.img"
        image.write_bytes(b"x" * 64)
        targets.append(FloorTarget(f"/mnt/{name}", image, name.split("-")[0]))
    with Floor(targets, tmp_path / ".floor") as floor:
        floor.take()
    calls = kernel.calls
    assert calls.index("freeze /mnt/n1-commitlog") > calls.index("synced /mnt/n1-data")
    assert calls.index("freeze /mnt/n2-commitlog") < calls.index("synced /mnt/n1-data")
    assert kernel.frozen == set()
