"""Real filesystems for tests: a sparse image, mkfs, loop-mounted in a temporary directory.

    with loop_filesystem(tmp_path, "data") as fs:     # fs.mount_point, fs.image, fs.device
        ...

Cleanup always runs: the filesystem is thawed (in case a test left it frozen), unmounted (lazily
if something still holds it), and the image removed. Needs root and loop devices; see
`unavailable_reason()` for a skip message that names the missing precondition.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

_FITHAW = 0xC0045878


@dataclass(frozen=True)
class LoopFilesystem:
    image: Path
    mount_point: Path
    device: str


def unavailable_reason() -> str | None:
    """Why loop-mounted filesystems cannot be made here, or None if they can."""
    if os.geteuid() != 0:
        return "needs root (mount, loop devices, FIFREEZE)"
    for tool in ("mkfs.ext4", "mount", "umount", "losetup"):
        if shutil.which(tool) is None:
            return f"needs {tool} (Debian: e2fsprogs/util-linux)"
    if not Path("/dev/loop-control").exists():
        return "needs /dev/loop-control (loop device support)"
    return None


def thaw_quietly(mount_point: Path) -> bool:
    """FITHAW, ignoring 'not frozen'; True if it was frozen."""
    try:
        fd = os.open(mount_point, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        fcntl.ioctl(fd, _FITHAW, 0)
        return True
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        return False
    finally:
        os.close(fd)


def _run(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout.strip()


@contextmanager
def loop_filesystem(
    directory: Path,
    name: str,
    *,
    size_mb: int = 64,
    fs_type: str = "ext4",
    mkfs_options: Sequence[str] = (),
) -> Iterator[LoopFilesystem]:
    image = directory / f"{name}.img"
    mount_point = directory / name
    mount_point.mkdir(parents=True, exist_ok=True)
    with image.open("wb") as handle:
        handle.truncate(size_mb * 1024 * 1024)
    mkfs = ["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0"]
    if fs_type != "ext4":
        mkfs = [f"mkfs.{fs_type}", "-q", "-f"]
    _run(*mkfs, *mkfs_options, str(image))
    device = _run("losetup", "--find", "--show", str(image))
    mounted = False
    try:
        _run("mount", "-t", fs_type, device, str(mount_point))
        mounted = True
        yield LoopFilesystem(image=image, mount_point=mount_point, device=device)
    finally:
        if mounted:
            thaw_quietly(mount_point)
            for attempt in range(20):
                result = subprocess.run(
                    ["umount", str(mount_point)], check=False, capture_output=True
                )
                if result.returncode == 0:
                    break
                time.sleep(0.1 * (attempt + 1))
            else:
                subprocess.run(["umount", "-l", str(mount_point)], check=False, capture_output=True)
        subprocess.run(["losetup", "-d", device], check=False, capture_output=True)
        image.unlink(missing_ok=True)
