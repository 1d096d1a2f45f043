"""A clone as the coordinator asks an agent to mount it, and as the agent mounted it: one pair of
types for the drill host, table restores and exports."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


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


class CloneMounter(Protocol):
    """An agent that mounts clones for a purpose (a drill, a table restore, an export) and takes
    them down again. Every call raises `AgentError` naming who was called."""

    async def mount_clones(
        self, purpose_id: str, clones: Sequence[CloneToMount], *, read_only: bool
    ) -> Sequence[MountedClone]: ...

    async def unmount_clones(self, purpose_id: str) -> Sequence[str]: ...
