"""A clone as the coordinator asks an agent to mount it, and as the agent mounted it: one pair of
types for the drill host, table restores and exports."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CloneToMount:
    """One clone for an agent to attach and mount (MountClones' CloneVolume): as the attach hook
    is given it, and the production mount point the backed-up volume stood at."""

    role: str
    array: str
    volume: str
    serial: str = ""
    wwn: str = ""
    source_mount_point: str = ""


@dataclass(frozen=True)
class MountedClone:
    """A clone the agent attached and mounted, and the production mount point it stands for."""

    role: str
    volume: str
    device: str
    mount_point: str
    source_mount_point: str
