"""A revert puts the backup's volumes back: refused, before anything is stopped, where the disk
mounted under a node's directory is another volume of the backup (`volume_identity`).

That is a backup taken while the coordinator's config named the wrong volumes (recorded complete
by a version without the backup's check, as in the incident of issue 20): reverting would put
another directory's disk under this one. A disk the backup does not hold (the clones a clone-mode
restore mounted) is only a warning: the revert puts the backup's volume back in its place.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from ringsnap.coordinator.model import BackupNode, NodeVolume
from ringsnap.coordinator.ports import ArrayPort, FilesystemFacts, NodeVolumeFacts
from ringsnap.coordinator.volume_identity import ExpectedVolume, find_mismatches
from ringsnap.plugins.types import Volume


def filesystem_of(facts: NodeVolumeFacts) -> FilesystemFacts:
    """What the agent's volume state says of a mounted filesystem, as the check reads it."""
    kinds = set(facts.kinds)
    role = (
        "data+commitlog"
        if {"data", "commitlog"} <= kinds
        else "data"
        if "data" in kinds
        else "commitlog"
        if "commitlog" in kinds
        else "unknown"
    )
    return FilesystemFacts(
        facts.mount_point,
        facts.device,
        facts.fs_type,
        role,
        serial=facts.serial,
        wwn=facts.wwn,
        loop_backing_file=facts.loop_backing_file,
        fs_uuid=facts.fs_uuid,
    )


async def revert_identity_check(
    backup_id: str,
    targets: Sequence[BackupNode],
    mounted: Mapping[str, Sequence[NodeVolumeFacts]],
    arrays: Mapping[str, ArrayPort],
    timeout: float,
) -> tuple[list[str], list[str]]:
    """(refusals, warnings) of a revert onto `targets`, per directory whose mounted disk is not
    the backup volume the revert puts back.

    Refused: the disk is another volume of the backup (the backup was taken with volumes swapped
    in the config: reverting would put another directory's disk here), or has no id (a local
    disk). A warning only: a disk the backup does not hold, as after a clone-mode restore (the
    node runs on the clones; the revert puts the originals back in their place, which is how a
    ring goes back onto its original volumes). Each volume's ids come from its array now, and
    from what the backup recorded; arrays that identify no volume (LVM) are not compared."""
    wanted: dict[str, list[Volume]] = {}
    for node in targets:
        for v in node.volumes:
            wanted.setdefault(v.array, []).append(
                Volume(v.volume, v.volume_id, v.size_bytes, v.wwn)
            )
    identifying = sorted(
        name for name in wanted if name in arrays and arrays[name].identifies_volumes
    )
    answers = await asyncio.gather(
        *(
            asyncio.wait_for(arrays[name].host_identities(wanted[name]), timeout)
            for name in identifying
        ),
        return_exceptions=True,
    )
    ids: dict[str, Mapping[str, tuple[str, ...]]] = {}
    refusals: list[str] = []
    warnings: list[str] = []
    for name, answer in zip(identifying, answers, strict=True):
        if isinstance(answer, BaseException):
            refusals.append(
                f"array {name}: the host ids of the backup's volumes cannot be read ({answer}),"
                " so they cannot be checked to be the disks the nodes run on"
            )
        else:
            ids[name] = answer

    def host_ids(v: NodeVolume) -> tuple[str, ...]:
        return tuple(i for i in (*ids[v.array].get(v.volume, ()), v.wwn) if i)

    known = {(v.array, v.volume): host_ids(v) for n in targets for v in n.volumes if v.array in ids}
    refuse = (
        f"backup {backup_id} was taken while the coordinator's config named the wrong volumes"
        " (or the node's disks moved since): it holds snapshots of other disks and cannot be"
        " reverted onto this node"
    )
    warn = (
        "the revert puts the backup's volume back in its place (as after a clone-mode restore,"
        " whose clones stay on the array: delete them there once no longer needed)"
    )
    for node in targets:
        if node.name not in mounted:
            continue  # unreachable: refused already
        expected = [
            ExpectedVolume(v.array, v.volume, v.role, host_ids(v))
            for v in node.volumes
            if v.array in ids
        ]
        if not expected:
            continue
        filesystems = [filesystem_of(f) for f in mounted[node.name]]
        for found in find_mismatches(node.name, filesystems, expected, known=known, fix=refuse):
            if not found.unknown_disk:
                refusals.append(found.message)
        for found in find_mismatches(node.name, filesystems, expected, known=known, fix=warn):
            if found.unknown_disk:
                warnings.append(found.message)
    return refusals, warnings
