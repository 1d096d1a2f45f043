"""What `ringsnap status` says of node-local (direct-attached) clusters (issue 21):

- per node, the room its next snapshot has: each thin pool's data and metadata use and each
  volume group's free space against what its thick snapshots need, asked of the node's agent
  (`CheckLocalSpace`, the check every backup makes before freezing anything), with the agent's
  warnings and the refusals the next backup would meet;
- each restorable backup whose node-local snapshots have no S3 copy: those snapshots live on the
  nodes' own disks and die with them, the export is the copy that survives.

Read in the command's own process from the coordinator's config (the agents' client certificate)
and catalog, as the point-in-time lines are: it works with or without the daemon.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ringsnap.api.v1 import node_snapshots_pb2 as pb
from ringsnap.coordinator.agents.connection import ClientTls
from ringsnap.coordinator.agents.node_snapshots import DRIVER, NODE_ATTRIBUTE, NodeSnapshotPort
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.cluster_clients import client_tls, node_local_agent
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.model import Backup, BackupState
from ringsnap.plugins.types import Volume

#: An agent that does not answer within this long is reported as such (status must not hang).
SPACE_TIMEOUT_SECONDS = 10.0
#: Backups without an S3 copy named one by one; the rest are counted.
NAMED_BACKUPS = 5
#: The newest backups of a cluster looked at for a missing copy.
LOOKED_AT = 200
MIB = 1 << 20
GIB = 1 << 30


@dataclass(frozen=True)
class NodeVolumes:
    """One node's volumes on its node-local array, as the config names them."""

    cluster: str
    node: str
    array: str
    address: str
    volumes: tuple[str, ...]


@dataclass(frozen=True)
class NodeRoom:
    """What a node's agent answered (`space`), or why it did not (`error`)."""

    of: NodeVolumes
    space: pb.LocalSpace | None = None
    error: str = ""


def node_local_volumes(config: CoordinatorConfig) -> list[NodeVolumes]:
    """Every node's volumes on an `agent-lvm` array, per cluster and node, in config order."""
    found: list[NodeVolumes] = []
    for cluster in config.clusters:
        for node in cluster.nodes:
            per_array: dict[str, list[str]] = {}
            for volume in node.volumes:
                section = config.arrays.get(volume.array)
                if section is not None and section.driver == DRIVER:
                    per_array.setdefault(volume.array, []).append(volume.volume)
            for array, volumes in per_array.items():
                _owner, address = node_local_agent(config, array, "<config>")
                found.append(NodeVolumes(cluster.name, node.name, array, address, tuple(volumes)))
    return found


async def _room(of: NodeVolumes, tls: ClientTls, timeout: float) -> NodeRoom:
    port = NodeSnapshotPort(of.array, of.node, of.address, tls, call_timeout=timeout)
    try:
        space = await port.space([Volume(name=v, id=v) for v in of.volumes])
    except Exception as exc:
        return NodeRoom(of, error=str(exc) or type(exc).__name__)
    finally:
        await port.close()
    return NodeRoom(of, space=space)


async def read_rooms(
    config: CoordinatorConfig, *, timeout: float = SPACE_TIMEOUT_SECONDS
) -> list[NodeRoom]:
    """Each node-local node's room, all agents asked at once."""
    wanted = node_local_volumes(config)
    if not wanted:
        return []
    tls = client_tls(config)
    return list(await asyncio.gather(*(_room(of, tls, timeout) for of in wanted)))


def _size(value: int) -> str:
    if value >= GIB:
        return f"{value / GIB:.2f} GiB"
    return f"{value / MIB:.0f} MiB"


def _pool_words(pool: pb.PoolUsage) -> str:
    if "/" in pool.pool:
        return (
            f"thin pool {pool.pool} data {pool.data_percent:.2f}%,"
            f" metadata {pool.metadata_percent:.2f}% used"
        )
    return (
        f"volume group {pool.pool} {_size(pool.free_bytes)} free, its thick snapshots need"
        f" {_size(pool.needed_bytes)}"
    )


def room_lines(rooms: Sequence[NodeRoom]) -> list[str]:
    """A line per node (its pools and volume groups), then its warnings and refusals indented."""
    lines: list[str] = []
    for room in rooms:
        who = f"{room.of.node} ({room.of.cluster}, array {room.of.array})"
        if room.space is None:
            lines.append(f"{who}: snapshot room unknown, its agent did not answer: {room.error}")
            continue
        figures = "; ".join(map(_pool_words, room.space.pools)) or "no pool reported"
        lines.append(f"{who}: {figures}")
        lines += [f"  warning: {warning}" for warning in room.space.warnings]
        lines += [f"  the next backup is refused: {refusal}" for refusal in room.space.refusals]
    return lines


def node_local_nodes(backup: Backup) -> list[str]:
    """The nodes whose own disks hold snapshots of `backup` (none: no node-local snapshot)."""
    return sorted({ref.attribute(NODE_ATTRIBUTE) for ref in backup.snapshots} - {""})


def uncopied_lines(catalog: Catalog, cluster: str) -> list[str]:
    """A line per restorable backup of `cluster` with node-local snapshots and no S3 copy (the
    newest `NAMED_BACKUPS` named, the others counted)."""
    page = catalog.list_backups(
        cluster, page_size=LOOKED_AT, states=(BackupState.COMPLETE, BackupState.PARTIAL)
    )
    local = [b for b in page.backups if b.restorable and node_local_nodes(b)]
    copied = catalog.exported_backups([b.id for b in local])
    missing = [b for b in local if b.id not in copied]
    lines = [
        f"{cluster}: backup {b.id} has no S3 copy: its snapshots are on the own disks of"
        f" {', '.join(node_local_nodes(b))} and die with them; export it"
        f" (ringsnap export {b.id})"
        for b in missing[:NAMED_BACKUPS]
    ]
    if len(missing) > NAMED_BACKUPS:
        lines.append(
            f"{cluster}: {len(missing) - NAMED_BACKUPS} older node-local backup(s) without an S3"
            " copy too"
        )
    return lines


def node_local_status_lines(config: CoordinatorConfig) -> list[str]:
    """`ringsnap status`'s node-local lines: each node's room, then the backups without a copy.
    A part that cannot be read is one line saying why (status still shows the rest)."""
    clusters = sorted({of.cluster for of in node_local_volumes(config)})
    if not clusters:
        return []
    lines: list[str] = []
    try:
        lines += room_lines(asyncio.run(read_rooms(config)))
    except Exception as exc:
        lines.append(f"(node-local snapshot room cannot be read: {exc})")
    if not Path(config.coordinator.catalog).exists():
        return lines  # no backup yet: nothing to copy
    try:
        with Catalog(config.coordinator.catalog, exclusive=False) as catalog:
            for cluster in clusters:
                lines += uncopied_lines(catalog, cluster)
    except Exception as exc:
        lines.append(f"(node-local backups without an S3 copy cannot be read: {exc})")
    return lines
