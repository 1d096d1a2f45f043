"""A backup's nodes from the config: the arrays a cluster's volumes are on, the nodes a backup
starts with, and each node as the run recorded it."""

from __future__ import annotations

from ringsnap.coordinator.backup import NodeOutcome
from ringsnap.coordinator.config import ClusterSection, NodeSection
from ringsnap.coordinator.model import BackupNode, NodeVolume


def arrays_of(cluster: ClusterSection) -> set[str]:
    """The arrays the cluster's volumes are on."""
    return {v.array for node in cluster.nodes for v in node.volumes}


def planned_nodes(cluster: ClusterSection) -> list[BackupNode]:
    """The nodes and volumes a backup of the cluster starts with, as configured."""
    return [
        BackupNode(
            name=node.name,
            volumes=tuple(
                NodeVolume(array=v.array, volume=v.volume, role=v.role) for v in node.volumes
            ),
        )
        for node in cluster.nodes
    ]


def recorded_node(node: NodeSection, outcome: NodeOutcome) -> BackupNode:
    """The node as configured, with what the run learned (ids, canary, exclusion, and the volume
    snapshotted for each configured one: another after a clone-mode restore, see
    `ringsnap.coordinator.backup.followed`)."""
    resolved = dict(zip((v.volume for v in node.volumes), outcome.volumes, strict=False))
    return BackupNode(
        name=node.name,
        host_id=outcome.host_id,
        canary_id=outcome.canary_id,
        excluded_reason=outcome.excluded_reason,
        volumes=tuple(
            NodeVolume(
                array=v.array,
                volume=resolved[v.volume].name if v.volume in resolved else v.volume,
                role=v.role,
                volume_id=resolved[v.volume].id if v.volume in resolved else "",
                size_bytes=resolved[v.volume].size_bytes if v.volume in resolved else 0,
                wwn=resolved[v.volume].wwn if v.volume in resolved else "",
            )
            for v in node.volumes
        ),
    )
