"""Whether this machine can run the sandbox test bed at all (a real Cassandra ring on loop devices
in containers), for the integration tests that need it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def sandbox_unavailable() -> str | None:
    """Why the sandbox cannot run here, or None."""
    if os.geteuid() != 0:
        return "the sandbox needs root (loop devices, mounts, dockerd)"
    if not Path("/dev/loop-control").exists():
        return "no /dev/loop-control: this kernel gives no loop devices"
    for tool in ("docker", "dockerd", "debootstrap", "mkfs.xfs", "mvn", "java"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (run `make system-deps`)"
    return None
