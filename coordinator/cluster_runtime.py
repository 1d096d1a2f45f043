"""A configured cluster as the daemon holds it: its section of the configuration and the live
handles to reach it (its nodes' agents, its CQL canary writer)."""

from __future__ import annotations

from dataclasses import dataclass

from ringsnap.coordinator.backup.model import NodeTarget
from ringsnap.coordinator.config import ClusterSection
from ringsnap.coordinator.model import NodeVolume
from ringsnap.coordinator.ports import AgentPort, CanaryWriter
from ringsnap.errors import RingsnapError


class UnknownClusterError(RingsnapError):
    exit_code = 2


@dataclass
class ClusterRuntime:
    """One configured cluster and the live handles to reach it."""

    config: ClusterSection
    agents: dict[str, AgentPort]
    canaries: CanaryWriter | None

    def targets(self) -> list[NodeTarget]:
        return [
            NodeTarget(
                node.name,
                self.agents[node.name],
                tuple(
                    NodeVolume(array=v.array, volume=v.volume, role=v.role) for v in node.volumes
                ),
            )
            for node in self.config.nodes
        ]
