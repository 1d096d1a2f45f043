"""The restore to a time on the restore workflow's fakes: the commit log is placed on every node
after the manifest check and before any start, the restore lines go once the ring serves, and a
node whose time canaries do not show T is not proven; a single node is refused."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from ringsnap.coordinator.model import NodeVerdict, RestoreState
from ringsnap.coordinator.pitr.time_canary import TimeProof
from ringsnap.coordinator.restore.pitr import PointInTime, PointInTimeWorkflow
from ringsnap.coordinator.restore.pitr_ports import NodePlacement, PlacedSegment
from ringsnap.coordinator.restore.plan import RestoreRequest
from ringsnap.coordinator.restore.workflow import RestoreRefused
from tests.support.restore_world import (
    NODES,
    Events,
    Rig,
    first_index,
    last_index,
    restore_backup,
)
from tests.support.s3_restore_fakes import S3, S3Rig

TARGET = 1_764_396_000_123


class FakePitr:
    def __init__(self, name: str, events: Events) -> None:
        self._name = name
        self.events = events

    async def place_point_in_time(
        self, run_id: str, target_ms: int, *, dry_run: bool
    ) -> NodePlacement:
        assert target_ms == TARGET and not dry_run
        self.events.append(f"{self._name}:place")
        return NodePlacement(
            "CommitLog-7-1.log", (PlacedSegment("CommitLog-7-1.log", 9, True),), "x", 9
        )

    async def finish_point_in_time(self, run_id: str) -> None:
        self.events.append(f"{self._name}:finish")


def _workflow(rig: Rig, proofs: dict[str, TimeProof]) -> PointInTimeWorkflow:
    async def prove(host_id: str, target_ms: int) -> TimeProof:
        rig.events.append(f"prove:{host_id}")
        return proofs.get(host_id, TimeProof(True, "time canary at T present"))

    point = PointInTime(TARGET, {n: FakePitr(n, rig.events) for n in NODES}, prove)
    return PointInTimeWorkflow(
        rig.agents, {"array1": rig.array}, rig.ring, rig.journal, seeds=["node2"], point=point
    )


def test_the_log_is_placed_between_the_manifest_check_and_the_start() -> None:
    rig = Rig()
    plan = rig.plan(RestoreRequest("rs-1"))
    record = asyncio.run(_workflow(rig, {}).run(plan, "me"))
    assert record.state is RestoreState.PROVEN, record.error
    events = rig.events
    assert last_index(events, ":manifest") < first_index(events, ":place")
    assert last_index(events, ":place") < first_index(events, ":start:gossip")
    assert first_index(events, ":finish") > last_index(events, ":start")
    assert all(
        any(line.startswith("point in time: time canary at T") for line in n.proof)
        for n in record.nodes
    )


def test_a_node_not_at_the_time_is_not_proven() -> None:
    rig = Rig()
    plan = rig.plan(RestoreRequest("rs-1"))
    one = plan.nodes[0]
    wrong = TimeProof(False, "time canary at 5 ms is after the point")
    record = asyncio.run(_workflow(rig, {one.host_id: wrong}).run(plan, "me"))
    assert record.state is not RestoreState.PROVEN
    node = record.node(one.name)
    assert node.verdict is NodeVerdict.NOT_PROVEN
    assert "time canary at 5 ms is after the point" in node.unproven


def test_a_single_node_is_refused_before_anything_changes() -> None:
    rig = Rig()
    plan = rig.plan(RestoreRequest("rs-1", nodes=("node1",)))
    with pytest.raises(RestoreRefused, match="whole ring"):
        asyncio.run(_workflow(rig, {}).run(plan, "me"))
    assert not [e for e in rig.events if e.endswith((":stop", ":place"))]


def test_from_the_s3_copy_the_log_is_placed_after_the_copy_s_own_commit_log() -> None:
    """The array lost: the base comes from its S3 copy (downloaded, installed, its own segments
    put in the emptied commit-log directory), then the shipped log is placed before the start."""
    rig = S3Rig()
    rig.array.missing = True
    plan = rig.plan(S3, replace(restore_backup(), lost_reason="array destroyed"))
    assert not plan.refused, plan.refusals

    async def prove(host_id: str, target_ms: int) -> TimeProof:
        return TimeProof(True, "time canary at T present")

    point = PointInTime(TARGET, {n: FakePitr(n, rig.events) for n in NODES}, prove)
    workflow = PointInTimeWorkflow(
        rig.agents,
        {"array1": rig.array},
        rig.ring,
        rig.journal,
        seeds=["node2"],
        s3_agents=rig.s3,
        point=point,
    )
    record = asyncio.run(workflow.run(plan, "me"))
    assert record.state is RestoreState.PROVEN, record.error
    events = rig.events
    assert last_index(events, ":commitlog") < first_index(events, ":place")
    assert last_index(events, ":place") < first_index(events, ":start:gossip")
    assert not any(e.startswith("array:") for e in events)
