"""The restore workflow's order, records and refusals, with fakes of our own ports.

The proof that restores work is tests/integration/test_restore.py on the real ring; these pin the
rules that must hold in every failure: nothing touched before every node is stopped and released,
a record after every step, resume from each node's last step, refusals that name the node.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from ringsnap.coordinator.model import (
    NodeVerdict,
    RestoreMode,
    RestoreRecord,
    RestoreState,
    RestoreStep,
    Verification,
)
from ringsnap.coordinator.ports import NodeFacts
from ringsnap.coordinator.restore.plan import RestoreRequest
from ringsnap.coordinator.restore.proof import CanaryCheck, compare_manifests, verdict
from ringsnap.coordinator.restore.record import next_step_for
from ringsnap.coordinator.restore.workflow import RestoreFailed, RestoreRefused
from ringsnap.plugins.errors import DriverError
from tests.support.restore_world import (
    NODES,
    NOW,
    FakeAgent,
    Rig,
    first_index,
    last_index,
    restore_backup,
    restore_sstable,
)


def test_whole_ring_stops_and_releases_every_node_before_the_array_and_starts_the_seed_first() -> (
    None
):
    rig = Rig()
    plan = rig.plan(RestoreRequest("rs-1"))
    assert not plan.refused and plan.whole_ring

    record = asyncio.run(rig.workflow().run(plan, "me"))

    events = rig.events
    assert last_index(events, ":stop") < first_index(events, ":release")
    assert last_index(events, ":release") < first_index(events, "array:revert")
    assert last_index(events, "array:revert") < first_index(events, ":attach:node1-data,node1-log")
    assert last_index(events, ":manifest") < first_index(events, ":start")
    assert events.index("node2:start:gossip") < events.index("node1:start")
    assert events.index("node2:start:gossip") < events.index("node3:start")
    assert "node1:discard:hints=True" in events
    assert record.state is RestoreState.PROVEN
    assert all(n.verdict is NodeVerdict.PROVEN for n in record.nodes)
    assert rig.journal.verified == [("rs-1", Verification.PROVEN, "rr-1")]
    # A record was saved after every node's every step.
    steps = {(n.name, n.step) for r in rig.journal.saved for n in r.nodes}
    skipped = {RestoreStep.PLANNED, RestoreStep.DOWNLOADED}  # DOWNLOADED: restores from S3 only
    assert {(n, s) for n in NODES for s in RestoreStep if s not in skipped} <= steps


def test_a_pre_restore_canary_still_present_fails_that_node() -> None:
    rig = Rig()
    rig.ring.present.add("pre:host-node3")
    record = asyncio.run(rig.workflow().run(rig.plan(RestoreRequest("rs-1")), "me"))
    assert record.state is RestoreState.NOT_PROVEN
    assert record.node("node3").verdict is NodeVerdict.NOT_PROVEN
    assert any("did NOT go back in time" in line for line in record.node("node3").proof)
    assert record.node("node1").verdict is NodeVerdict.PROVEN
    assert rig.journal.verified[0][1] is Verification.FAILED


def test_a_node_down_before_the_restore_is_proven_with_the_point_in_time_unproven() -> None:
    rig = Rig()
    rig.agents["node1"].running = False
    plan = rig.plan(RestoreRequest("rs-1"))
    assert any("node1" in w and "not running" in w for w in plan.warnings)
    record = asyncio.run(rig.workflow().run(plan, "me"))
    node1 = record.node("node1")
    assert node1.verdict is NodeVerdict.PROVEN
    assert node1.pre_restore_canary == ""
    assert any("not proven" in line for line in node1.unproven)


def test_a_revert_failing_leaves_every_node_stopped_and_unmounted_with_the_next_step() -> None:
    rig = Rig()
    rig.array.fail_revert = DriverError(
        "volumes ['node1-data'] were already reverted", array="array1"
    )
    with pytest.raises(RestoreFailed, match="revert failed"):
        asyncio.run(rig.workflow().run(rig.plan(RestoreRequest("rs-1")), "me"))
    last = rig.journal.saved[-1]
    assert last.state is RestoreState.FAILED
    assert not any(e.endswith(":start") or ":attach" in e for e in rig.events)
    for node in last.nodes:
        assert node.step is RestoreStep.RELEASED
        assert "UNMOUNTED" in node.next_step and "--resume rr-1" in node.next_step

    # Resume: the revert runs again (nothing attached meanwhile) and the rest follows.
    rig.array.fail_revert = None
    rig.events.clear()
    backup = restore_backup()
    snapshots = {"array1": backup.snapshots[0]}
    final = asyncio.run(rig.workflow().resume(last, snapshots))
    assert final.state is RestoreState.PROVEN
    assert not any(e.endswith(":stop") or e.endswith(":release") for e in rig.events)
    assert any(e.startswith("array:revert") for e in rig.events)


def test_resume_after_the_revert_was_recorded_never_reverts_again() -> None:
    rig = Rig()
    rig.agents["node3"].fail["attach:node3-data,node3-log"] = OSError("mount failed")
    with pytest.raises(RestoreFailed, match="node node3: attached"):
        asyncio.run(rig.workflow().run(rig.plan(RestoreRequest("rs-1")), "me"))
    last = rig.journal.saved[-1]
    assert last.node("node1").step is RestoreStep.ATTACHED
    assert last.node("node3").step is RestoreStep.RESTORED
    rig.agents["node3"].fail.clear()
    rig.events.clear()
    final = asyncio.run(rig.workflow().resume(last, {"array1": restore_backup().snapshots[0]}))
    assert final.state is RestoreState.PROVEN
    assert not any(e.startswith("array:") for e in rig.events)
    assert not any(e.startswith("node1:attach") for e in rig.events)
    assert any(e.startswith("node3:attach") for e in rig.events)


def test_one_node_alone_reverts_only_its_own_volumes_keeps_hints_and_names_the_repair() -> None:
    rig = Rig()
    plan = rig.plan(RestoreRequest("rs-1", ("node1",)))
    assert not plan.whole_ring and not plan.refused
    assert any("nodetool repair -full" in w for w in plan.warnings)
    record = asyncio.run(rig.workflow().run(plan, "me"))
    assert record.state is RestoreState.PROVEN
    assert "array:revert:node1-data,node1-log" in rig.events
    assert "node1:discard:hints=False" in rig.events
    assert not any(e.startswith(("node2:", "node3:")) for e in rig.events)


def test_clone_mode_attaches_the_clones_and_records_them() -> None:
    rig = Rig()
    plan = rig.plan(RestoreRequest("rs-1", mode=RestoreMode.CLONE))
    assert plan.destroyed == ("nothing: the original volumes are kept untouched beside the clones",)
    record = asyncio.run(rig.workflow().run(plan, "me"))
    assert record.state is RestoreState.PROVEN
    assert "node1:attach:node1-data_rr_1,node1-log_rr_1" in rig.events
    assert ("array1", "node1-data", "node1-data_rr_1") in record.clones


@pytest.mark.parametrize(
    ("break_it", "expected"),
    [
        (
            lambda rig: rig.agents["node2"].fail.update(volume_state=OSError("refused")),
            "node node2: the agent cannot be reached",
        ),
        (lambda rig: setattr(rig.array, "missing", True), "snapshot rs-1 is missing"),
        (
            lambda rig: rig.agents.__setitem__("node3", _ReplacedAgent("node3", rig.events)),
            "node node3: Cassandra's host id is other",
        ),
    ],
)
def test_the_plan_refuses_and_touches_nothing(break_it: Any, expected: str) -> None:
    rig = Rig()
    break_it(rig)
    plan = rig.plan(RestoreRequest("rs-1"))
    assert plan.refused
    assert any(expected in r for r in plan.refusals), plan.refusals
    assert all(e.endswith(("volume_state", "node_info")) for e in rig.events)
    with pytest.raises(RestoreRefused):
        asyncio.run(rig.workflow().run(plan, "me"))
    assert rig.journal.saved == []


class _ReplacedAgent(FakeAgent):
    async def node_info(self) -> NodeFacts:
        return NodeFacts("c", "other", "dc1", "r1", "5.0.7", "127.0.0.1")


def test_a_partial_restore_from_a_backup_older_than_gc_grace_needs_force() -> None:
    rig = Rig()
    rig.ring.gc_grace = (600, "ks.t")
    refused = rig.plan(RestoreRequest("rs-1", ("node1",)))
    assert any("gc_grace_seconds of ks.t" in r and "--force" in r for r in refused.refusals)
    forced = rig.plan(RestoreRequest("rs-1", ("node1",), force=True))
    assert not forced.refused
    assert any("because of --force" in w for w in forced.warnings)
    # A whole-ring restore brings every replica back together: no resurrection, no refusal.
    assert not rig.plan(RestoreRequest("rs-1")).refused


def test_ontap_revert_marks_the_newer_backups_lost() -> None:
    rig = Rig()
    rig.array.deletes_newer = True
    newer = restore_backup(NOW + timedelta(hours=1), "rs-2")
    plan = rig.plan(RestoreRequest("rs-1"), newer_backups=[newer])
    assert plan.lost_backups == ("rs-2",)
    assert any("deleted by restore_to" in line for line in plan.destroyed)
    asyncio.run(rig.workflow().run(plan, "me"))
    assert rig.journal.lost == ["rs-2"]


def test_manifest_comparison_names_missing_and_changed_sstables() -> None:
    recorded = [restore_sstable("1"), restore_sstable("2"), restore_sstable("3", digest="aa")]
    found = [restore_sstable("1"), restore_sstable("3", digest="bb"), restore_sstable("9")]
    check = compare_manifests(recorded, found)
    assert not check.ok
    assert check.missing == ("ks.t generation 2",)
    assert check.changed == ("ks.t generation 3: data digest aa != bb",)
    assert compare_manifests(recorded[:1], found).ok


def test_verdict_needs_the_manifest_and_the_backup_canary() -> None:
    ok = verdict(True, ["manifest: all"], CanaryCheck(True, False), backup="b")
    assert ok.proven and not ok.unproven
    assert not verdict(False, ["manifest: x"], CanaryCheck(True, False), backup="b").proven
    assert not verdict(True, ["m"], CanaryCheck(False, False), backup="b").proven
    assert not verdict(True, ["m"], CanaryCheck(None, None, "timeout"), backup="b").proven
    unproven = verdict(True, ["m"], CanaryCheck(True, None), backup="b")
    assert unproven.proven and unproven.unproven


def test_next_steps_say_what_state_each_node_is_in() -> None:
    record = RestoreRecord(
        id="rr-9",
        cluster="c",
        backup_id="b",
        mode=RestoreMode.REVERT,
        nodes=(),
        whole_ring=True,
        requested_by="me",
        started_at=NOW,
    )
    node = replace(_node(), step=RestoreStep.STOPPED)
    assert "STOPPED" in next_step_for(record, node) and "--resume rr-9" in next_step_for(
        record, node
    )
    assert "nothing was changed" in next_step_for(record, replace(node, step=RestoreStep.PLANNED))
    # A stop whose answer was lost leaves the node at the canary step with Cassandra down.
    at_canary = next_step_for(record, replace(node, step=RestoreStep.CANARY))
    assert "STOPPED" in at_canary and "--resume rr-9" in at_canary
    assert "not verified" in next_step_for(record, replace(node, step=RestoreStep.STARTED))
    assert next_step_for(record, replace(node, step=RestoreStep.VERIFIED)) == ""


def _node() -> Any:
    from ringsnap.coordinator.model import RestoreNode

    return RestoreNode(name="node1")
