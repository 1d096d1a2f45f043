"""An array that does not finish a clone in time: the run fails with a message that says clones
may still appear and where to look (none of them are recorded), in every workflow that clones
through `clone_in_time`."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from ringsnap.coordinator.clone_session import CloneSession, CloneTimedOut
from ringsnap.coordinator.model import RestoreMode
from ringsnap.coordinator.restore.plan import RestoreRequest
from ringsnap.coordinator.restore.workflow import RestoreFailed, RestoreSettings, RestoreWorkflow
from ringsnap.plugins.types import SnapshotRef, Volume
from tests.support.restore_world import FakeArray, Rig


class _SlowCloneArray(FakeArray):
    async def clone(self, ref: SnapshotRef, suffix: str) -> Sequence[Volume]:
        self.events.append("array:clone")
        await asyncio.sleep(3600)
        raise AssertionError("the clone should have timed out")


def test_a_clone_restore_whose_array_does_not_answer_says_clones_may_still_appear() -> None:
    rig = Rig()
    rig.array = _SlowCloneArray(rig.events)
    plan = rig.plan(RestoreRequest("rs-1", mode=RestoreMode.CLONE))
    workflow = RestoreWorkflow(
        rig.agents,
        {"array1": rig.array},
        rig.ring,
        rig.journal,
        seeds=["node2"],
        settings=RestoreSettings(array_timeout=0.05),
    )
    with pytest.raises(RestoreFailed) as failed:
        asyncio.run(workflow.run(plan, "me"))
    message = str(failed.value)
    assert "array array1 did not finish cloning snapshot rs-1 within 0 s" in message
    assert "names built from 'rr_1'" in message
    assert "look for them on the array and delete them" in message
    assert "array:clone" in rig.events


def test_the_clone_session_names_the_array_snapshot_and_suffix() -> None:
    rig = Rig()
    session = CloneSession({"array1": _SlowCloneArray(rig.events)}, cleanups=None, timeout=0.05)  # type: ignore[arg-type, dict-item]
    ref = rig.plan(RestoreRequest("rs-1")).backup.snapshots[0]
    with pytest.raises(CloneTimedOut, match=r"array array1 did not finish cloning .*'tr_9'"):
        asyncio.run(session.clone("array1", ref, "tr_9"))
