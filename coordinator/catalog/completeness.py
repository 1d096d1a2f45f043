"""When a backup may be recorded as complete: a pure rule over the backup and its manifests.

A backup is complete when every included node has its manifest and volumes, and every array of the
plan a snapshot covering those volumes. A native backup has no volumes or arrays: each included
node's snapshot is its own, and its manifest (read from that snapshot) is what proves it was taken.
Excluded nodes (each with its reason) need nothing, but make the backup `partial`; a backup without
any included node is never complete.
"""

from __future__ import annotations

from collections.abc import Collection

from ringsnap.coordinator.model import Backup, BackupState, SnapshotKind


def missing_parts(backup: Backup, manifests: Collection[str]) -> list[str]:
    """Everything that keeps `backup` from being complete, one sentence each; empty when nothing
    does. `manifests` names the nodes whose manifest is recorded."""
    refs = {ref.array: ref for ref in backup.snapshots}
    missing: list[str] = []
    included = [node for node in backup.nodes if node.included]
    if not backup.nodes:
        missing.append("no nodes recorded")
    elif not included:
        missing.append("every node is excluded, nothing was backed up")
    for node in included:
        if node.name not in manifests:
            missing.append(f"node {node.name}: no manifest")
        if backup.snapshot_kind is SnapshotKind.NATIVE:
            continue
        if not node.volumes:
            missing.append(f"node {node.name}: no volumes")
        for volume in node.volumes:
            ref = refs.get(volume.array)
            if ref is None:
                continue  # reported once per array below
            covered = any(
                m.volume.name == volume.volume
                or (volume.volume_id and m.volume.id == volume.volume_id)
                for m in ref.members
            )
            if not covered:
                missing.append(
                    f"node {node.name}: volume {volume.volume} ({volume.role}) is not in the"
                    f" snapshot of array {volume.array}"
                )
    if backup.snapshot_kind is SnapshotKind.ARRAY:
        missing.extend(
            f"array {array}: no snapshot" for array in backup.arrays if array not in refs
        )
    return missing


def finished_state(backup: Backup) -> BackupState:
    """What a backup with nothing missing is recorded as: partial when it left nodes out."""
    if any(not node.included for node in backup.nodes):
        return BackupState.PARTIAL
    return BackupState.COMPLETE
