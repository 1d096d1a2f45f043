"""Real filesystems on LUN images for the marker tests: format, loop-mount, freeze, markers.

Every helper that changes state undoes it on the way out (thaw before unmount, unmount always),
so a failing test never leaves a frozen filesystem or a mounted loop device behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

MARKER_PREFIX = "ringsnap-marker-"


class MountError(Exception):
    pass


def missing_preconditions() -> list[str]:
    """What this machine lacks for loop mounts and freezing (empty when all is there)."""
    missing: list[str] = []
    if os.geteuid() != 0:
        missing.append("root (loop mounts and fsfreeze need it)")
    if not Path("/dev/loop-control").exists():
        missing.append("/dev/loop-control (loop device support)")
    for tool in ("mount", "umount", "fsfreeze", "mkfs.ext4", "mkfs.xfs"):
        if shutil.which(tool) is None:
            missing.append(f"the {tool} command")
    return missing


def run(command: Sequence[str]) -> str:
    result = subprocess.run(list(command), check=False, capture_output=True, text=True)
    if result.returncode != 0:
        raise MountError(
            f"{' '.join(command)} failed ({result.returncode}): {result.stderr.strip() or result.stdout.strip()}"
        )
    return result.stdout


def format_image(image: Path, fstype: str = "ext4") -> None:
    if fstype == "ext4":
        run(["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", str(image)])
    elif fstype == "xfs":
        run(["mkfs.xfs", "-q", "-f", str(image)])
    else:
        raise MountError(f"unsupported filesystem {fstype!r}")


def mount_image(image: Path, mountpoint: Path, *, options: str = "") -> None:
    mountpoint.mkdir(parents=True, exist_ok=True)
    run(["mount", "-o", ",".join(filter(None, ["loop", options])), str(image), str(mountpoint)])


def unmount(mountpoint: Path) -> None:
    """Thaw (harmless if not frozen) and unmount; lazily if something still holds it."""
    if not os.path.ismount(mountpoint):
        return
    subprocess.run(["fsfreeze", "-u", str(mountpoint)], check=False, capture_output=True)
    result = subprocess.run(
        ["umount", str(mountpoint)], check=False, capture_output=True, text=True
    )
    if result.returncode != 0:
        subprocess.run(["umount", "-l", str(mountpoint)], check=False, capture_output=True)


@contextlib.contextmanager
def mounted(image: Path, mountpoint: Path, *, options: str = "") -> Iterator[Path]:
    mount_image(image, mountpoint, options=options)
    try:
        yield mountpoint
    finally:
        unmount(mountpoint)


@contextlib.contextmanager
def frozen(mountpoints: Sequence[Path]) -> Iterator[None]:
    """Freeze every mount (FIFREEZE), always thaw all of them afterwards."""
    done: list[Path] = []
    try:
        for mountpoint in mountpoints:
            run(["fsfreeze", "-f", str(mountpoint)])
            done.append(mountpoint)
        yield
    finally:
        failures = []
        for mountpoint in done:
            result = subprocess.run(
                ["fsfreeze", "-u", str(mountpoint)], check=False, capture_output=True, text=True
            )
            if result.returncode != 0:
                failures.append(f"{mountpoint}: {result.stderr.strip()}")
        if failures:
            raise MountError("could not thaw " + "; ".join(failures))


def write_marker(mountpoint: Path, name: str, content: bytes) -> None:
    """A marker file, durably written (file and directory fsynced)."""
    path = mountpoint / f"{MARKER_PREFIX}{name}"
    with open(path, "wb") as handle:
        handle.write(content)
        handle.flush()
        os.fsync(handle.fileno())
    directory = os.open(mountpoint, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def read_markers(mountpoint: Path) -> dict[str, bytes]:
    """Every marker on the filesystem, by name."""
    return {
        path.name.removeprefix(MARKER_PREFIX): path.read_bytes()
        for path in sorted(mountpoint.glob(f"{MARKER_PREFIX}*"))
    }
