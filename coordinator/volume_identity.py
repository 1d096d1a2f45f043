"""Is the array volume a plan will snapshot or revert the disk actually under the node's Cassandra
directories? Compared before anything is flushed, frozen or stopped, per node and directory.

The agent reports the ids of the device under each directory (WWN/NAA id, NVMe NGUID/EUI-64,
`ringsnap.agent.volumes`); the array tells how a host sees each volume (`host_identities` of its
driver). Both are put in one spelling (`ringsnap.device_ids`) and must share an id. Without this,
a config naming the wrong volume (two swapped, or the old volumes after a clone-mode restore)
makes every backup a snapshot of disks Cassandra no longer writes to, recorded complete.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ringsnap import device_ids
from ringsnap.coordinator.model import VolumeRole
from ringsnap.coordinator.ports import FilesystemFacts

#: Which Cassandra directories a volume of each role holds.
KINDS = {
    VolumeRole.DATA: {"data"},
    VolumeRole.COMMITLOG: {"commitlog"},
    VolumeRole.DATA_AND_COMMITLOG: {"data", "commitlog"},
}
#: The kinds of directory on a filesystem, from the role the agent reports for it.
_KINDS_OF_ROLE = {
    "data": {"data"},
    "commitlog": {"commitlog"},
    "data+commitlog": {"data", "commitlog"},
}


@dataclass(frozen=True)
class ExpectedVolume:
    """A volume the plan will snapshot or revert for a node, and how a host sees it."""

    array: str
    volume: str
    role: VolumeRole
    #: The ids the array gives it (any spelling); empty when the array tells none.
    host_ids: tuple[str, ...]


def _kinds(filesystem: FilesystemFacts) -> set[str]:
    return _KINDS_OF_ROLE.get(filesystem.role, set())


def is_on(filesystem: FilesystemFacts, volume: ExpectedVolume) -> bool:
    """Whether `filesystem` holds `volume`'s directories and is that volume by its ids."""
    return bool(KINDS[volume.role] & _kinds(filesystem)) and device_ids.same_volume(
        filesystem.identifiers(), volume.host_ids
    )


def _shown(ids: Sequence[str]) -> str:
    shown = [i for i in ids if i]
    return " / ".join(shown) if shown else "none"


def _where(filesystem: FilesystemFacts) -> str:
    directories = ", ".join(filesystem.cassandra_directories) or filesystem.mount_point
    return f"{directories} (on {filesystem.device} at {filesystem.mount_point})"


def _owner(filesystem: FilesystemFacts, others: Mapping[tuple[str, str], tuple[str, ...]]) -> str:
    """The array volume whose ids the device has, as `array:volume`, or ""."""
    for (array, volume), ids in others.items():
        if device_ids.same_volume(filesystem.identifiers(), ids):
            return f"{array}:{volume}"
    return ""


@dataclass(frozen=True)
class Mismatch:
    """One directory whose disk is not the volume the plan has for it."""

    message: str
    #: The device has ids, and they are no volume the plan knows (`known`): e.g. the clones a
    #: clone-mode restore mounted, which no catalog record holds yet.
    unknown_disk: bool = False


def mismatches(
    node: str,
    filesystems: Sequence[FilesystemFacts],
    expected: Sequence[ExpectedVolume],
    *,
    known: Mapping[tuple[str, str], tuple[str, ...]] | None = None,
    fix: str,
) -> list[str]:
    """Why `expected` (the node's volumes as the plan has them) are not the disks the agent
    reports under the node's directories: one line per directory, naming the node, the
    directory, both identities and `fix` (which setting to edit). [] when every one matches.

    `known`: every volume the arrays listed, by (array, volume), with its host ids: names the
    volume a mismatched device actually is, when it is one of them.
    """
    return [m.message for m in find_mismatches(node, filesystems, expected, known=known, fix=fix)]


def find_mismatches(
    node: str,
    filesystems: Sequence[FilesystemFacts],
    expected: Sequence[ExpectedVolume],
    *,
    known: Mapping[tuple[str, str], tuple[str, ...]] | None = None,
    fix: str,
) -> list[Mismatch]:
    """`mismatches`, each telling whether the device is a disk `known` does not hold."""
    known = known or {}
    found: list[Mismatch] = []
    for volume in expected:
        wanted = KINDS[volume.role]
        candidates = [f for f in filesystems if wanted & _kinds(f)]
        label = f"{volume.array}:{volume.volume} ({volume.role.value})"
        if not candidates:
            found.append(
                Mismatch(
                    f"node {node}: its agent reports no filesystem holding the"
                    f" {volume.role.value} directories that volume {label} should hold; check"
                    " the agent's [cassandra] directories"
                )
            )
            continue
        if not device_ids.canonical_set(volume.host_ids):
            found.append(
                Mismatch(
                    f"node {node}: array {volume.array} tells no host id for volume"
                    f" {volume.volume} (an ONTAP volume must hold the node's LUN), so it cannot be"
                    f" checked to be the disk under {', '.join(_where(f) for f in candidates)};"
                    f" {fix}"
                )
            )
            continue
        if any(device_ids.same_volume(f.identifiers(), volume.host_ids) for f in candidates):
            continue
        for filesystem in candidates:
            found.append(_mismatch(node, filesystem, volume, known, fix))
    return found


def _mismatch(
    node: str,
    filesystem: FilesystemFacts,
    volume: ExpectedVolume,
    known: Mapping[tuple[str, str], tuple[str, ...]],
    fix: str,
) -> Mismatch:
    label = f"volume {volume.array}:{volume.volume} (host id {_shown(volume.host_ids)})"
    if not filesystem.identifiers():
        why = f" ({filesystem.identity_source})" if filesystem.identity_source else ""
        return Mismatch(
            f"node {node}: the {volume.role.value} directory {_where(filesystem)} is on a"
            f" device with no WWN or NGUID{why}, a local disk as far as the agent can tell,"
            f" not the configured array {label}; back this node up with native snapshots, or"
            " put the directory on the array volume (if it is one, its by-id links are missing:"
            f" check [volumes] by_id_dir in the agent's config); {fix}"
        )
    owner = _owner(filesystem, known)
    actual = (
        f" (array volume {owner})" if owner else " (no volume the arrays listed)" if known else ""
    )
    return Mismatch(
        f"node {node}: the {volume.role.value} directory {_where(filesystem)} is on device"
        f" {filesystem.described()}{actual}, but the plan would use {label}: they are not"
        f" the same disk; {fix}",
        unknown_disk=not owner,
    )
