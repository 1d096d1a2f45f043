"""LUN images in a reflink-capable pool: the storage behind every array simulator.

Layout (shared with the test bed, `ringsnap.sandbox.pool`):

    <pool>/luns/<volume>.img                  a volume (LUN); the test bed loop-mounts it
    <pool>/snapshots/<volume>/<id>.img        a snapshot of that volume: a reflink copy

The pool directory must be on a filesystem with reflinks (XFS made with `-m reflink=1`, or
btrfs). A snapshot is a FICLONE of the LUN (block-level copy-on-write, instant, exact bytes); a
revert clones the snapshot back over the LUN, in place (same inode); a clone is a new LUN cloned
from a snapshot. Nothing here ever falls back to a byte copy: that would not be copy-on-write.

Reverting requires the LUN to be unused: unmounted and its loop device detached (the caller's
job). `revert` refuses a LUN that a loop device still holds, because the device's page cache would
keep serving the old blocks.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ringsnap.plugins.simulators import fabric

#: ioctl(dest_fd, FICLONE, src_fd): share all of src's extents with dest (linux/fs.h).
FICLONE = 0x40049409

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,254}$")


class LunPoolError(Exception):
    """A pool operation failed; the message says which file and why."""


class LunNotFoundError(LunPoolError):
    """No such LUN or snapshot image."""


class LunExistsError(LunPoolError):
    """A LUN or snapshot image of that name exists already."""


class LunInUseError(LunPoolError):
    """The LUN is attached to a loop device (mounted or not) and cannot be reverted or deleted."""


def check_name(name: str, what: str = "name") -> str:
    """Names become file names: letters, digits, `_ . : -`, not starting with `.` or `-`."""
    if not _NAME.match(name) or name in {".", ".."}:
        raise LunPoolError(f"{what} {name!r} is not usable as a file name in the pool")
    return name


def reflink(source: Path, destination: Path, *, replace: bool = False) -> None:
    """Make `destination` share every block of `source` (FICLONE).

    With `replace`, an existing destination keeps its inode and gets the new contents.
    """
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if replace else os.O_EXCL)
    with open(source, "rb") as src:
        try:
            fd = os.open(destination, flags, 0o600)
        except FileExistsError:
            raise LunExistsError(f"{destination} exists already") from None
        try:
            fcntl.ioctl(fd, FICLONE, src.fileno())
        except OSError as exc:
            os.close(fd)
            if not replace:
                destination.unlink(missing_ok=True)
            if exc.errno in (errno.EOPNOTSUPP, errno.EXDEV, errno.EINVAL, errno.ENOTTY):
                raise LunPoolError(
                    f"cannot reflink {source} to {destination}: the pool's filesystem does not"
                    " support reflinks (make it with `mkfs.xfs -m reflink=1`)"
                ) from exc
            raise LunPoolError(f"cannot reflink {source} to {destination}: {exc}") from exc
        # No fsync: the clone is visible to every reader at once (the pool's journal orders
        # it); forcing the log to disk per image would make a snapshot cost tens of ms.
        os.close(fd)


def _losetup(*argv: str | Path) -> str:
    done = subprocess.run(
        ["losetup", *map(str, argv)], capture_output=True, text=True, check=False, timeout=60
    )
    if done.returncode != 0:
        raise LunPoolError(f"losetup {' '.join(map(str, argv))} failed: {done.stderr.strip()}")
    return done.stdout.strip()


def loop_devices_of(path: Path) -> list[str]:
    """Loop devices whose backing file is `path` (from /sys/block/loop*/loop/backing_file)."""
    target = os.path.realpath(path)
    try:
        stat = os.stat(target)
    except FileNotFoundError:
        return []
    devices: list[str] = []
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        try:
            backing_path = backing.read_text().strip().removesuffix(" (deleted)")
        except OSError:
            continue
        same = backing_path == target
        if not same:
            with contextlib.suppress(OSError):
                other = os.stat(backing_path)
                same = (other.st_dev, other.st_ino) == (stat.st_dev, stat.st_ino)
        if same:
            devices.append("/dev/" + backing.parent.parent.name)
    return devices


@dataclass(frozen=True)
class LunPool:
    """A pool directory holding LUN images and their snapshots."""

    root: Path
    #: Mapped clones are loop devices behind their by-id link (the sandbox; needs root and
    #: /dev/loop-control), else the link names the image (tests of the simulators alone).
    fabric_loops: bool = False

    def __post_init__(self) -> None:
        (self.root / "luns").mkdir(parents=True, exist_ok=True)
        (self.root / "snapshots").mkdir(parents=True, exist_ok=True)
        if self.fabric_loops:
            fabric.forget_devices(self.root)  # a new array has no mappings yet

    @property
    def luns_dir(self) -> Path:
        return self.root / "luns"

    @property
    def snapshots_dir(self) -> Path:
        return self.root / "snapshots"

    # LUNs

    def lun_path(self, volume: str) -> Path:
        return self.luns_dir / f"{check_name(volume, 'volume')}.img"

    def has_lun(self, volume: str) -> bool:
        return self.lun_path(volume).is_file()

    def list_luns(self) -> list[str]:
        return sorted(path.stem for path in self.luns_dir.glob("*.img") if path.is_file())

    def lun_size(self, volume: str) -> int:
        try:
            return self.lun_path(volume).stat().st_size
        except FileNotFoundError:
            raise LunNotFoundError(f"no LUN {volume!r} in {self.luns_dir}") from None

    def create_lun(self, volume: str, size_bytes: int) -> Path:
        """A sparse, empty LUN image (format it with mkfs before mounting)."""
        path = self.lun_path(volume)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            raise LunExistsError(f"LUN {volume!r} exists already: {path}") from None
        try:
            os.ftruncate(fd, size_bytes)
        finally:
            os.close(fd)
        return path

    def delete_lun(self, volume: str) -> bool:
        """Remove a LUN image; False if it was already gone. Refuses one held by a loop device."""
        path = self.lun_path(volume)
        self._ensure_unused(path, f"delete LUN {volume!r}")
        fabric.withdraw(self.root, path)
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        return True

    def present(self, volume: str, host_id: str) -> None:
        """Let hosts know LUN `volume` by `host_id`, the id its array gives it (`fabric`)."""
        fabric.present(self.root, self.lun_path(volume), host_id)

    def map_to_host(self, volume: str, host_id: str) -> None:
        """A mapping of a clone was made: hosts see it by `host_id` (`fabric`). Idempotent."""
        image = self.lun_path(volume)
        target = image
        if self.fabric_loops:
            devices = loop_devices_of(image)
            target = Path(devices[0]) if devices else Path(_losetup("--find", "--show", image))
        fabric.present(self.root, target, host_id)

    def unmap_from_host(self, volume: str, host_id: str) -> None:
        """The clone's last mapping went: no host sees it; its loop device is detached (one
        still mounted is detached by the kernel once unmounted)."""
        fabric.withdraw_id(self.root, host_id)
        if self.fabric_loops:
            for device in loop_devices_of(self.lun_path(volume)):
                _losetup("--detach", device)
                fabric.forget_device(self.root, device)

    # Snapshots

    def snapshot_path(self, volume: str, snapshot_id: str) -> Path:
        return (
            self.snapshots_dir
            / check_name(volume, "volume")
            / f"{check_name(snapshot_id, 'snapshot id')}.img"
        )

    def has_snapshot(self, volume: str, snapshot_id: str) -> bool:
        return self.snapshot_path(volume, snapshot_id).is_file()

    def list_snapshots(self, volume: str) -> list[str]:
        directory = self.snapshots_dir / check_name(volume, "volume")
        return sorted(path.stem for path in directory.glob("*.img"))

    def snapshot_count(self) -> int:
        """Snapshot images in the whole pool (tests use it to find leftovers)."""
        return sum(1 for _ in self.snapshots_dir.glob("*/*.img"))

    def snapshot(self, volume: str, snapshot_id: str) -> Path:
        """Reflink the LUN into a new snapshot image."""
        source = self.lun_path(volume)
        if not source.is_file():
            raise LunNotFoundError(f"no LUN {volume!r} in {self.luns_dir}")
        destination = self.snapshot_path(volume, snapshot_id)
        destination.parent.mkdir(exist_ok=True)
        reflink(source, destination)
        return destination

    def snapshot_group(self, members: Sequence[tuple[str, str]]) -> list[Path]:
        """Snapshot several (volume, snapshot id) pairs; all or nothing.

        The images are taken one after the other within milliseconds; the simulator cannot fence
        writes across LUNs, so crash consistency across volumes comes from the frozen
        filesystems, exactly as it would on a real array's write fence.
        """
        made: list[Path] = []
        try:
            for volume, snapshot_id in members:
                made.append(self.snapshot(volume, snapshot_id))
        except BaseException:
            for path in made:
                path.unlink(missing_ok=True)
            raise
        return made

    def delete_snapshot(self, volume: str, snapshot_id: str) -> bool:
        """Remove a snapshot image; False if it was already gone."""
        try:
            self.snapshot_path(volume, snapshot_id).unlink()
        except FileNotFoundError:
            return False
        return True

    def revert(self, volume: str, snapshot_id: str) -> None:
        """Put the snapshot's bytes back into the LUN, in place. The LUN must be unused."""
        source = self.snapshot_path(volume, snapshot_id)
        destination = self.lun_path(volume)
        if not source.is_file():
            raise LunNotFoundError(f"no snapshot {snapshot_id!r} of volume {volume!r}")
        if not destination.is_file():
            raise LunNotFoundError(f"no LUN {volume!r} in {self.luns_dir}")
        self._ensure_unused(destination, f"revert LUN {volume!r}")
        reflink(source, destination, replace=True)

    def clone(self, volume: str, snapshot_id: str, new_volume: str) -> Path:
        """A new LUN sharing the snapshot's blocks."""
        source = self.snapshot_path(volume, snapshot_id)
        if not source.is_file():
            raise LunNotFoundError(f"no snapshot {snapshot_id!r} of volume {volume!r}")
        destination = self.lun_path(new_volume)
        reflink(source, destination)
        return destination

    def allocated_bytes(self, path: Path) -> int:
        """Bytes the image occupies on disk (its extents, shared ones included)."""
        return path.stat().st_blocks * 512

    @staticmethod
    def _ensure_unused(path: Path, action: str) -> None:
        # Unmounting a `mount -o loop` detaches the device on last close, which can lag the
        # umount by a moment: give it a little time before calling the LUN busy.
        deadline = time.monotonic() + 2.0
        devices = loop_devices_of(path)
        while devices and time.monotonic() < deadline:
            time.sleep(0.05)
            devices = loop_devices_of(path)
        if devices:
            raise LunInUseError(
                f"cannot {action}: {path} is attached to {', '.join(devices)};"
                " unmount it and detach the loop device first"
            )


def supports_reflink(directory: Path) -> bool:
    """Whether files in `directory` can be reflinked (tries it on two scratch files)."""
    with tempfile.TemporaryDirectory(dir=directory, prefix=".reflink-probe-") as scratch:
        source = Path(scratch) / "a"
        source.write_bytes(b"probe")
        try:
            reflink(source, Path(scratch) / "b")
        except LunPoolError:
            return False
    return True


@contextlib.contextmanager
def temporary_xfs_pool(workdir: Path, size_bytes: int = 2 << 30) -> Iterator[LunPool]:
    """A fresh reflink-capable XFS pool: sparse image, `mkfs.xfs -m reflink=1`, loop mount.

    Needs root and loop devices. Always unmounted and removed on exit, even if LUNs of the pool
    are still mounted (they are lazily unmounted first).
    """
    missing = [tool for tool in ("mkfs.xfs", "mount", "umount") if shutil.which(tool) is None]
    if missing:
        raise LunPoolError(
            f"cannot make an XFS pool: missing {', '.join(missing)} (apt install xfsprogs)"
        )
    base = Path(tempfile.mkdtemp(prefix="lunpool-", dir=workdir))
    image = base / "pool.img"
    mountpoint = base / "pool"
    mountpoint.mkdir()
    mounted = False
    try:
        with open(image, "wb") as handle:
            handle.truncate(size_bytes)
        _run(["mkfs.xfs", "-q", "-f", "-m", "reflink=1", str(image)])
        _run(["mount", "-o", "loop", str(image), str(mountpoint)])
        mounted = True
        yield LunPool(mountpoint)
    finally:
        if mounted:
            release_mounts_under(mountpoint)
            subprocess.run(["umount", str(mountpoint)], check=False, capture_output=True)
            if os.path.ismount(mountpoint):
                subprocess.run(["umount", "-l", str(mountpoint)], check=False, capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def release_mounts_under(directory: Path) -> None:
    """Thaw and unmount every filesystem whose image lives under `directory`, and detach its loop
    devices (test clean-up)."""
    target = os.path.realpath(directory)
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        mountpoint = fields[4].replace("\\040", " ")
        source = fields[fields.index("-") + 2]
        backing = ""
        if source.startswith("/dev/loop"):
            backing_file = Path("/sys/block") / Path(source).name / "loop" / "backing_file"
            with contextlib.suppress(OSError):
                backing = backing_file.read_text().strip()
        if backing.startswith(target + os.sep):
            subprocess.run(["fsfreeze", "-u", mountpoint], check=False, capture_output=True)
            result = subprocess.run(["umount", mountpoint], check=False, capture_output=True)
            if result.returncode != 0:
                subprocess.run(["umount", "-l", mountpoint], check=False, capture_output=True)
    # Loop devices attached without a mount (losetup) would keep the pool busy.
    for backing_file in Path("/sys/block").glob("loop*/loop/backing_file"):
        with contextlib.suppress(OSError):
            if backing_file.read_text().strip().startswith(target + os.sep):
                device = "/dev/" + backing_file.parent.parent.name
                subprocess.run(["losetup", "-d", device], check=False, capture_output=True)


def _run(command: list[str]) -> None:
    result = subprocess.run(command, check=False, capture_output=True, text=True)
    if result.returncode != 0:
        raise LunPoolError(
            f"{' '.join(command)} failed: {result.stderr.strip() or result.stdout.strip()}"
        )
