"""A node's disks as its restores left them, for the next backup.

A clone-mode restore mounts a clone where each original volume was; the originals stay on the
array, untouched. The coordinator's config still names the originals until someone edits it, and a
backup of the originals would snapshot disks Cassandra no longer writes to. The catalog holds every
restore's record, with the volume each node attached in each role: read oldest first, they tell
which volume is each node's disk now, and which volumes were before it. A configured volume that
was the node's disk earlier is followed to the newest one, and the backup says so in its warnings;
a configured volume no restore ever attached there is the config's word against the catalog's, and
the plan's identity check decides (its refusal names the catalog's volume too).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ringsnap.coordinator.backup.model import FollowedVolume, NodeTarget
from ringsnap.coordinator.model import NodeVolume, RestoreRecord, RestoreStep, VolumeRole


def followed_volumes(
    cluster: str, restores: Iterable[RestoreRecord]
) -> dict[str, tuple[FollowedVolume, ...]]:
    """Per node of `cluster`, its disk in each (array, role) that a restore attached, from
    `restores` (any order). Only nodes that reached the attach step count: before it, the node's
    disk was not changed (and a failed attach leaves the restore open, refusing backups anyway)."""
    ordered = sorted(
        (r for r in restores if r.cluster == cluster), key=lambda r: (r.started_at, r.id)
    )
    state: dict[tuple[str, str, VolumeRole], FollowedVolume] = {}
    for record in ordered:
        for node in record.nodes:
            if node.step.order < RestoreStep.ATTACHED.order:
                continue
            for v in node.volumes:
                if not v.attached_volume:
                    continue  # not a restore of array volumes (native snapshots, S3)
                key = (node.name, v.array, v.role)
                before = state.get(key)
                earlier = before.earlier | {before.volume} if before else frozenset()
                state[key] = FollowedVolume(
                    array=v.array,
                    role=v.role,
                    volume=v.attached_volume,
                    restore_id=record.id,
                    earlier=(earlier | {v.volume}) - {v.attached_volume},
                )
    found: dict[str, list[FollowedVolume]] = {}
    for (node_name, _, _), followed in sorted(state.items(), key=lambda kv: kv[0]):
        found.setdefault(node_name, []).append(followed)
    return {name: tuple(volumes) for name, volumes in found.items()}


def with_followed(
    targets: Sequence[NodeTarget], followed: Mapping[str, tuple[FollowedVolume, ...]]
) -> list[NodeTarget]:
    """`targets` carrying what the catalog knows of their disks (the plan decides per volume)."""
    return [
        NodeTarget(t.name, t.agent, t.volumes, followed.get(t.name, ())) for t in targets
    ]


@dataclass(frozen=True)
class Choice:
    """The volume a backup snapshots for one configured volume of a node."""

    volume: str
    #: What the backup's warnings say when it is not the configured one.
    warning: str = ""
    #: What a refusal of the node's identity check adds: the catalog's volume there.
    note: str = ""


def follow(node: str, configured: NodeVolume, followed: Sequence[FollowedVolume]) -> Choice:
    """Which volume to snapshot for `configured`: the configured one, or, when it was the node's
    disk in its role before a restore attached another, the one attached since."""
    known = next(
        (f for f in followed if f.array == configured.array and f.role is configured.role), None
    )
    if known is None or known.volume == configured.volume:
        return Choice(configured.volume)
    if configured.volume in known.earlier:
        return Choice(
            known.volume,
            warning=(
                f"node {node}: the {configured.role.value} volume snapshotted is"
                f" {configured.array}:{known.volume}, which restore {known.restore_id} attached"
                f" in place of the configured {configured.volume}; name"
                f" {known.volume} in node {node}'s volumes in the coordinator's config"
            ),
        )
    return Choice(
        configured.volume,
        note=(
            f"the catalog has {configured.array}:{known.volume} as node {node}'s"
            f" {configured.role.value} volume since restore {known.restore_id}, and the config"
            f" names {configured.volume}, which no restore attached there"
        ),
    )
