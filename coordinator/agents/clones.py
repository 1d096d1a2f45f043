"""MountClones and UnmountClones over an agent connection: the one client piece the drill host,
table restores and exports share (see `clone_mounts` for the types)."""

from __future__ import annotations

from collections.abc import Sequence

from ringsnap.api.v1 import agent_pb2
from ringsnap.coordinator.agents.connection import AgentConnection, clone_volumes_message
from ringsnap.coordinator.clone_mounts import CloneToMount, MountedClone

#: Attaching and mounting runs the attach hook per clone; unmounting, the detach hook.
CLONE_MOUNTS_TIMEOUT_SECONDS = 900.0


class CloneMountingConnection(AgentConnection):
    """An agent connection that mounts clones on the agent's host and takes them down again."""

    async def mount_clones(
        self, run_id: str, clones: Sequence[CloneToMount], *, read_only: bool
    ) -> tuple[MountedClone, ...]:
        request = clone_volumes_message(run_id, clones, read_only=read_only)
        with self._calling("MountClones"):
            reply = await self._stub.MountClones(request, timeout=CLONE_MOUNTS_TIMEOUT_SECONDS)
        return tuple(
            MountedClone(m.role, m.volume, m.device, m.mount_point, m.source_mount_point)
            for m in reply.mounts
        )

    async def unmount_clones(self, run_id: str) -> tuple[str, ...]:
        request = agent_pb2.UnmountClonesRequest(run_id=run_id)
        with self._calling("UnmountClones"):
            reply = await self._stub.UnmountClones(request, timeout=CLONE_MOUNTS_TIMEOUT_SECONDS)
        return tuple(reply.detached_volumes)
