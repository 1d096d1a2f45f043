"""A clone as the coordinator asks an agent to mount it, and as the agent mounted it: one pair of
types for the drill host, table restores and exports."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from ringsnap.coordinator.ports import VolumeState


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
    #: The source volume's filesystem UUID: the agent refuses a device holding another.
    fs_uuid: str = ""
    #: The clone's id on the array (presenting it needs it; never sent to the agent).
    volume_id: str = ""


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


class VolumeReporter(Protocol):
    """A node's agent as GetVolumeState answers (the filesystems under its Cassandra
    directories, with their UUIDs)."""

    async def volume_state(self) -> VolumeState: ...


async def with_source_uuids(
    node: VolumeReporter, clones: Sequence[CloneToMount]
) -> list[CloneToMount]:
    """`clones` with the filesystem UUID of the volume each stands for, as the node reports it
    mounted at the source mount point: the agent refuses a device that holds another."""
    state = await node.volume_state()
    uuids = {v.mount_point: v.fs_uuid for v in state.volumes if v.mounted}
    return [replace(c, fs_uuid=c.fs_uuid or uuids.get(c.source_mount_point, "")) for c in clones]
