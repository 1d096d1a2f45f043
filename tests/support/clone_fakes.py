"""Fakes for the workflows that read a backup through clones (table restores, exports): a backup
of data and commit-log volumes on one array, a node's agent that mounts and unmounts clones, and
an array that makes and deletes them.

A test steers them through their attributes (`fail`, `before`, `fail_clone`, `fail_delete`,
`running`) and reads what happened from them (`events`, `mounted`, `live`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime

from ringsnap.coordinator.clone_mounts import CloneToMount, MountedClone
from ringsnap.coordinator.model import (
    Backup,
    BackupNode,
    BackupState,
    NodeVolume,
    QuiesceMode,
    VolumeRole,
)
from ringsnap.coordinator.ports import NodeVolumeFacts, VolumeState
from ringsnap.plugins.types import Capabilities, SnapshotRef, Volume, VolumeSnapshot

NOW = datetime(2026, 11, 24, 3, 0, tzinfo=UTC)
BACKUP_ID = "rs-20261124-030000-abcd"
Events = list[str]


def cloneable_backup(names: Sequence[str], /, **changes: object) -> Backup:
    """A complete freeze backup of nodes `names`, each with volumes `<node>_data` and `<node>_cl` on
    array1, in one snapshot; `changes` replace its fields."""
    members = tuple(
        BackupNode(
            name=n,
            host_id=f"host-{n}",
            volumes=(
                NodeVolume(array="array1", volume=f"{n}_data", role=VolumeRole.DATA),
                NodeVolume(array="array1", volume=f"{n}_cl", role=VolumeRole.COMMITLOG),
            ),
        )
        for n in names
    )
    ref = SnapshotRef(
        array="array1",
        driver="fake",
        group="g",
        snapshot_id="s1",
        snapshot_name="rs-1",
        created_at=NOW,
        members=tuple(
            VolumeSnapshot(Volume(f"{n}_{kind}", f"id-{n}-{kind}"), f"snap-{n}-{kind}")
            for n in names
            for kind in ("data", "cl")
        ),
    )
    backup = Backup(
        id=BACKUP_ID,
        cluster="prod",
        state=BackupState.COMPLETE,
        quiesce_mode=QuiesceMode.FREEZE,
        trigger="test",
        policy="",
        started_at=NOW,
        finished_at=NOW,
        nodes=members,
        snapshots=(ref,),
    )
    return replace(backup, **changes)  # type: ignore[arg-type]


class CloneNode:
    """A node's agent: its volume state and read-only clone mounts. Every call is an event
    `<node>:<call>`; `before[call]` runs first, then `fail[call]` is raised once."""

    def __init__(self, name: str, events: Events) -> None:
        self.name = name
        self.events = events
        self.running = True
        self.fail: dict[str, BaseException] = {}
        self.before: dict[str, Callable[[], None]] = {}
        self.mounted: set[str] = set()

    @property
    def node(self) -> str:
        return self.name

    def _call(self, what: str) -> None:
        self.events.append(f"{self.name}:{what}")
        if what in self.before:
            self.before.pop(what)()
        if what in self.fail:
            raise self.fail.pop(what)

    async def volume_state(self) -> VolumeState:
        return VolumeState(
            cassandra_running=self.running,
            detail="nodetool info answered",
            volumes=(
                NodeVolumeFacts("/data", "/dev/sdb", "xfs", "u1", ("data",)),
                NodeVolumeFacts("/commitlog", "/dev/sdc", "xfs", "u2", ("commitlog",)),
            ),
        )

    async def mount_clones(
        self, purpose_id: str, volumes: Sequence[CloneToMount], *, read_only: bool
    ) -> list[MountedClone]:
        assert read_only
        self._call("mount")
        self.mounted.add(purpose_id)
        return [
            MountedClone(
                v.role,
                v.volume,
                "/dev/loop9",
                f"/state/clones/{purpose_id}/{v.role}",
                v.source_mount_point,
            )
            for v in volumes
        ]

    async def unmount_clones(self, purpose_id: str) -> list[str]:
        self._call("unmount")
        self.mounted.discard(purpose_id)
        return ["clone"]


class CloneArray:
    """An array that clones a snapshot's members (`<volume>_<suffix>`) and deletes clones; `live`
    holds the clones not deleted. `fail_clone` is raised by every clone; `fail_delete` deletes
    fail (event `array:delete-failed:<volume>`) before they succeed again."""

    def __init__(self, events: Events) -> None:
        self.events = events
        self.fail_clone: BaseException | None = None
        self.fail_delete = 0
        self.live: set[str] = set()

    def capabilities(self) -> Capabilities:
        return Capabilities(atomic_group_snapshot=True, clone=True)

    async def clone(self, ref: SnapshotRef, suffix: str) -> Sequence[Volume]:
        self.events.append("array:clone:" + ",".join(sorted(m.volume.name for m in ref.members)))
        if self.fail_clone is not None:
            raise self.fail_clone
        made = [Volume(f"{m.volume.name}_{suffix}", f"c-{m.volume.id}") for m in ref.members]
        self.live.update(v.name for v in made)
        return made

    async def delete_clone(self, volume: Volume) -> None:
        if self.fail_delete:
            self.fail_delete -= 1
            self.events.append(f"array:delete-failed:{volume.name}")
            raise RuntimeError("array busy")
        self.events.append(f"array:delete:{volume.name}")
        self.live.discard(volume.name)
