"""Small files the agent must find again after a crash or a reboot: written atomically and durably."""

from __future__ import annotations

import os
from pathlib import Path


def write_durably(target: Path, payload: bytes) -> None:
    """Write `target` (mode 0600, its directory created 0700) through a temporary file, the file
    and then its directory fsynced: after a crash the old or the new content is there, whole."""
    directory = target.parent
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    fd = os.open(
        temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600
    )
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, payload)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, target)
    fsync_directory(directory)


def fsync_directory(directory: Path | str) -> None:
    """Make the entries of `directory` (new names, renames, links) durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
