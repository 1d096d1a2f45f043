"""A snapshot an array describes as holding other volumes than planned (`SnapshotMismatchError`)
fails the run once every array is finished: the other arrays' describes and finishes complete
first, then the failed run's discard deletes every snapshot, the refused one as the array made it.
The same against the FlashArray, ONTAP and E-Series simulators: tests/plugins."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from ringsnap.coordinator.backup import BackupFailed, BackupSettings
from ringsnap.coordinator.model import QuiesceMode
from ringsnap.plugins.api import PreparedSnapshot
from ringsnap.plugins.errors import SnapshotMismatchError
from ringsnap.plugins.types import SnapshotRef, Volume, VolumeSnapshot
from tests.unit.test_backup_staged import StagedArray, cluster


class _Refusing(StagedArray):
    """Its describe refuses the snapshot: the group also held a stranger volume."""

    async def describe_group_snapshot(
        self, prepared: PreparedSnapshot, ref: SnapshotRef
    ) -> SnapshotRef:
        await self._step("describe")
        stranger = VolumeSnapshot(Volume(name="stranger", id="id-stranger"), "s-1")
        made = replace(ref, members=(*ref.members, stranger))
        raise SnapshotMismatchError(
            array=self.array, group="group g1", snapshot=made, missing=(), unexpected=("stranger",)
        )

    async def delete_snapshot(self, ref: SnapshotRef) -> None:
        self.deleted = ref
        await super().delete_snapshot(ref)


def test_a_refused_snapshot_fails_the_run_after_every_array_finished() -> None:
    workflow, agents, ports, events = cluster(("a1", "a2"))
    refusing = _Refusing("a1", events, agents)
    refusing.volumes = ports["a1"].volumes
    workflow.arrays["a1"] = refusing
    ports["a2"].delays = {"describe": 0.2}  # still describing when a1 refuses
    settings = BackupSettings(quiesce=QuiesceMode.NONE)

    with pytest.raises(BackupFailed) as failed:
        asyncio.run(workflow.run(settings, trigger="test"))

    said = str(failed.value)
    assert "array a1: " in said and "unexpected: stranger" in said and "group g1" in said, said
    assert "deleted with this failed run" in said
    # a2 described and finished before the run failed; then both snapshots were deleted.
    assert events.index("finish a2") < events.index("delete a1"), events
    assert {"delete a1", "delete a2", "finish a1"} <= set(events), events
    assert "stranger" in {m.volume.name for m in refusing.deleted.members}
    assert refusing.snapshots == {} and ports["a2"].snapshots == {}
