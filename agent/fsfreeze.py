"""The FIFREEZE/FITHAW ioctls (what `fsfreeze -f/-u` does) and syncfs(2).

Blocking calls: FIFREEZE flushes the filesystem's dirty data inside the ioctl. The freeze manager
runs them in worker threads so that its lease watchdog never waits behind one.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import time
from dataclasses import dataclass

# _IOWR('X', 119, int) and _IOWR('X', 120, int) from <linux/fs.h>.
FIFREEZE = 0xC0045877
FITHAW = 0xC0045878

_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True, slots=True)
class IoctlResult:
    """What one freeze or thaw call did; `changed` is False when the filesystem already was so."""

    changed: bool
    seconds: float


def _open_directory(mount_point: str) -> int:
    # O_NOFOLLOW: a mount point we resolved ourselves is never a symlink; refuse to be redirected.
    return os.open(mount_point, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)


def syncfs(mount_point: str) -> float:
    """Write back the filesystem's dirty data (so that the freeze that follows is short)."""
    started = time.monotonic()
    fd = _open_directory(mount_point)
    try:
        if _libc.syncfs(fd) != 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code), mount_point)
    finally:
        os.close(fd)
    return time.monotonic() - started


def freeze(mount_point: str) -> IoctlResult:
    """Freeze the filesystem mounted at `mount_point`.

    Raises OSError(EBUSY) if it is frozen already: the kernel cannot tell us by whom, so the caller
    must not treat that as success.
    """
    fd = _open_directory(mount_point)
    try:
        started = time.monotonic()
        fcntl.ioctl(fd, FIFREEZE, 0)
        return IoctlResult(changed=True, seconds=time.monotonic() - started)
    finally:
        os.close(fd)


def thaw(mount_point: str) -> IoctlResult:
    """Thaw the filesystem mounted at `mount_point`; thawing one that is not frozen is not an error."""
    fd = _open_directory(mount_point)
    try:
        started = time.monotonic()
        try:
            fcntl.ioctl(fd, FITHAW, 0)
        except OSError as exc:
            if exc.errno == errno.EINVAL:
                return IoctlResult(changed=False, seconds=time.monotonic() - started)
            raise
        return IoctlResult(changed=True, seconds=time.monotonic() - started)
    finally:
        os.close(fd)
