"""The probe of every freeze test: a write that returns only once its filesystem takes writes."""

from __future__ import annotations

import os
from pathlib import Path


def write_and_fsync(path: Path) -> None:
    """Create `path` and write and fsync a few bytes: blocks while its filesystem is frozen."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, b"probe")
        os.fsync(fd)
    finally:
        os.close(fd)
