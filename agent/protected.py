"""The filesystems the agent never freezes and never releases: one rule for freeze and restore.

The agent needs them writable, or runs from them: `/`, the filesystem of its state, the one of its
own program (the interpreter's prefix and this package's directory), and for a restore the one of
its restore records (a record the agent could not write after the release would lose the volume).
A path that does not exist yet counts by the nearest parent that does: the filesystem it will be
created on.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

#: The agent's own package directory: freezing or releasing it would stop the agent's imports.
PROGRAM_DIRECTORY = os.path.dirname(os.path.abspath(__file__))


def existing(path: Path) -> Path:
    """`path`, or its nearest parent that exists (the filesystem it will be created on)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def protected_paths(
    state_directory: Path, more: Sequence[tuple[Path, str]] = ()
) -> list[tuple[str, str]]:
    """Paths whose filesystems are never frozen or released, with the reason; "/" first."""
    return [
        ("/", "it holds /"),
        (str(existing(state_directory)), f"it holds the agent's state ({state_directory})"),
        *((str(existing(path)), why) for path, why in more),
        (sys.prefix, f"it holds the agent's own program ({sys.prefix})"),
        (PROGRAM_DIRECTORY, "it holds the agent's own program"),
    ]


def protected_devices(
    paths: Sequence[tuple[str, str]], device_of: Callable[[str], int]
) -> dict[int, str]:
    """{device number: why it is protected} of `protected_paths`, the reasons of one device
    joined."""
    reasons: dict[int, list[str]] = {}
    for path, why in paths:
        found = reasons.setdefault(device_of(path), [])
        if why not in found:
            found.append(why)
    return {device: " and ".join(why) for device, why in reasons.items()}


def stat_device(path: str) -> int:
    return os.stat(path).st_dev
