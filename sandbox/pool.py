"""The reflink-capable XFS pool and the per-node LUNs inside it.

An instance's pool is a sparse image file formatted `mkfs.xfs -m reflink=1` and loop-mounted at
`<instance root>/pool`. Each LUN is a sparse ext4 image file `<pool>/luns/<volume-name>.img`,
loop-mounted where the node's data or commit log lives. The array simulators snapshot, revert and
clone LUNs by reflinking those image files (`cp --reflink=always`), which is a real block-level
copy-on-write snapshot; to put a copy back, unmount the LUN, replace the file, mount it again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

from ringsnap.logs import get_logger
from ringsnap.sandbox.commands import run
from ringsnap.sandbox.errors import SandboxError
from ringsnap.sandbox.mounts import current_loop_devices, mount_at

log = get_logger(__name__)

GiB = 1024**3
DEFAULT_POOL_SIZE = 64 * GiB
DEFAULT_LUN_SIZES = {"data": 4 * GiB, "commitlog": 2 * GiB}


@dataclass(frozen=True)
class Pool:
    """The XFS pool: its image file, its loop device and where it is mounted."""

    image: Path
    mount_point: Path
    loop_device: str | None

    @property
    def luns_dir(self) -> Path:
        return self.mount_point / "luns"


@dataclass(frozen=True)
class Lun:
    """One LUN: an image file in the pool, and (when mounted) its loop device and mount point.

    `volume_name` is what an array would call it (`<instance>-node1-data`); `image_path` is the file
    the simulators snapshot by reflink; `loop_device` is the one it was mounted on when this value
    was made (None: not mounted); `current_loop_device(lun)` asks the system.
    """

    volume_name: str
    image_path: Path
    pool_dir: Path
    mount_point: Path
    loop_device: str | None
    size_bytes: int
    fs_type: str = "ext4"


def lun_image_path(pool_dir: Path, volume_name: str) -> Path:
    return pool_dir / "luns" / f"{volume_name}.img"


def create_pool(image: Path, mount_point: Path, size_bytes: int = DEFAULT_POOL_SIZE) -> Pool:
    """Make (if needed) and mount (if needed) the pool. Safe to call again on a mounted pool."""
    mounted = mount_at(mount_point)
    if mounted is not None:
        if mounted.fs_type != "xfs":
            raise SandboxError(
                f"{mount_point} is already mounted with {mounted.fs_type}, not the XFS pool"
            )
        return Pool(image=image, mount_point=mount_point, loop_device=mounted.source)
    image.parent.mkdir(parents=True, exist_ok=True)
    if not image.exists():
        run(["truncate", "--size", str(size_bytes), str(image)])
        # reflink=1 is what makes `cp --reflink=always` of a LUN image a block-level snapshot.
        run(["mkfs.xfs", "-q", "-m", "reflink=1", str(image)], timeout=120)
        log.info("pool created", image=str(image), size_gib=size_bytes // GiB)
    loop = _attach(image)
    try:
        mount_point.mkdir(parents=True, exist_ok=True)
        run(["mount", "-t", "xfs", loop, str(mount_point)])
    except BaseException:
        _detach(loop)
        raise
    (mount_point / "luns").mkdir(exist_ok=True)
    return Pool(image=image, mount_point=mount_point, loop_device=loop)


def destroy_pool(pool: Pool) -> None:
    """Unmount the pool and release its loop device (the image file stays; the caller removes it)."""
    if mount_at(pool.mount_point) is not None:
        unmount_path(pool.mount_point)
    for device in current_loop_devices():
        if device.back_file == pool.image:
            _detach(device.name)


def create_lun(pool: Pool, volume_name: str, mount_point: Path, size_bytes: int) -> Lun:
    """Make the LUN's sparse image and its ext4 filesystem, unless the image already exists."""
    image = lun_image_path(pool.mount_point, volume_name)
    if not image.exists():
        pool.luns_dir.mkdir(parents=True, exist_ok=True)
        run(["truncate", "--size", str(size_bytes), str(image)])
        run(["mkfs.ext4", "-q", "-F", "-m", "0", "-E", "nodiscard", str(image)], timeout=120)
        log.info("lun created", volume=volume_name, image=str(image), size_gib=size_bytes / GiB)
    return Lun(
        volume_name=volume_name,
        image_path=image,
        pool_dir=pool.mount_point,
        mount_point=mount_point,
        loop_device=None,
        size_bytes=image.stat().st_size,
    )


def mount_lun(lun: Lun) -> Lun:
    """Attach the LUN's image to a loop device and mount it; returns the LUN with its loop device.

    Already mounted (from this image): returns it as it is.
    """
    mounted = mount_at(lun.mount_point)
    if mounted is not None:
        backing = _back_file(mounted.source)
        if backing != lun.image_path:
            raise SandboxError(
                f"{lun.mount_point} is already mounted from {mounted.source}, not {lun.image_path}"
            )
        return replace(lun, loop_device=mounted.source)
    if not lun.image_path.is_file():
        raise SandboxError(f"LUN image {lun.image_path} does not exist")
    loop = _attach(lun.image_path)
    try:
        lun.mount_point.mkdir(parents=True, exist_ok=True)
        run(["mount", "-t", lun.fs_type, loop, str(lun.mount_point)])
    except BaseException:
        _detach(loop)
        raise
    log.info("lun mounted", volume=lun.volume_name, device=loop, mount_point=str(lun.mount_point))
    return replace(lun, loop_device=loop)


def unmount_lun(lun: Lun) -> Lun:
    """Unmount the LUN and release its loop device; returns the LUN without a loop device.

    The node using it must be stopped first (a running container keeps the filesystem busy).
    """
    if mount_at(lun.mount_point) is not None:
        unmount_path(lun.mount_point)
    for device in current_loop_devices():
        if device.back_file == lun.image_path:
            _detach(device.name)
    log.info("lun unmounted", volume=lun.volume_name, mount_point=str(lun.mount_point))
    return replace(lun, loop_device=None)


def current_loop_device(lun: Lun) -> str | None:
    """The loop device the LUN's mount point is on right now, if it is mounted."""
    mounted = mount_at(lun.mount_point)
    return mounted.source if mounted is not None else None


def unmount_path(mount_point: Path, *, attempts: int = 10) -> None:
    """Unmount, retrying while the filesystem is busy (a container that just stopped may still hold it)."""
    for attempt in range(1, attempts + 1):
        proc = run(["umount", str(mount_point)], check=False)
        if proc.returncode == 0 or mount_at(mount_point) is None:
            return
        if attempt < attempts:
            time.sleep(0.5)
    # Last resort, logged: detach it from the tree so nothing is left mounted; the kernel frees
    # the filesystem when its last user goes away.
    log.warning(
        "unmount failed, detaching lazily", mount_point=str(mount_point), error=proc.stderr.strip()
    )
    run(["umount", "--lazy", str(mount_point)])


def _attach(image: Path) -> str:
    device = run(["losetup", "--find", "--show", str(image)]).stdout.strip()
    if not device.startswith("/dev/loop"):
        raise SandboxError(f"losetup gave no loop device for {image}: {device!r}")
    return device


def _detach(device: str) -> None:
    proc = run(["losetup", "--detach", device], check=False)
    if proc.returncode != 0 and any(d.name == device for d in current_loop_devices()):
        raise SandboxError(f"could not release loop device {device}: {proc.stderr.strip()}")


def _back_file(device: str) -> Path | None:
    for loop in current_loop_devices():
        if loop.name == device:
            return loop.back_file
    return None
