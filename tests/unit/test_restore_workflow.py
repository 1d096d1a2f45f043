"""The restore workflow's order, records and refusals, with fakes of our own ports.

The proof that restores work is tests/integration/test_restore.py on the real ring; these pin the
rules that must hold in every failure: nothing touched before every node is stopped and released,
a record after every step, resume from each node's last step, refusals that name the node.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from ringsnap.coordinator.model import (
    Backup,
    BackupNode,
    BackupState,
    NodeVerdict,
    NodeVolume,
    QuiesceMode,
    RestoreMode,
    RestoreRecord,
    RestoreState,
    RestoreStep,
    Verification,
    VolumeRole,
)
from ringsnap.coordinator.ports import (
    DiscardedDirectory,
    NodeFacts,
    NodeVolumeFacts,
    SSTable,
    SSTableComponent,
    VolumeState,
)
from ringsnap.coordinator.proof import CanaryCheck, compare_manifests, verdict
from ringsnap.coordinator.restore import (
    RestoreFailed,
    RestoreRefused,
    RestoreWorkflow,
)
from ringsnap.coordinator.restore_plan import RestoreRequest, plan_restore
from ringsnap.coordinator.restore_record import next_step_for
from ringsnap.plugins.errors import DriverError, NotFoundError
from ringsnap.plugins.types import Capabilities, SnapshotInfo, SnapshotRef, Volume, VolumeSnapshot

NODES = ("node1", "node2", "node3")
NOW = datetime(2026, 11, 24, 3, 0, tzinfo=UTC)


def _sstable(generation: str, size: int = 100, digest: str = "1234") -> SSTable:
    return SSTable(
        data_directory="/data",
        keyspace="ks",
        table="t",
        table_directory="t-abc",
        generation=generation,
        format="big",
        version="nb",
        components=(
            SSTableComponent("Data.db", f"/data/ks/t-abc/nb-{generation}-big-Data.db", size),
        ),
        data_digest_crc32=digest,
        complete=True,
    )


class Events(list[str]):
    pass


class FakeAgent:
    def __init__(self, name: str, events: Events, *, running: bool = True) -> None:
        self._name = name
        self.events = events
        self.running = running
        self.fail: dict[str, Exception] = {}
        self.manifest_found = [_sstable("1")]

    @property
    def node(self) -> str:
        return self._name

    def _call(self, what: str) -> None:
        self.events.append(f"{self._name}:{what}")
        if what in self.fail:
            raise self.fail[what]

    async def volume_state(self) -> VolumeState:
        self._call("volume_state")
        facts = (
            NodeVolumeFacts(
                mount_point=f"/{self._name}/data",
                device="/dev/loop1",
                fs_type="ext4",
                fs_uuid="u1",
                kinds=("data", "hints"),
                serial="",
                wwn="",
                loop_backing_file="",
                mounted=True,
                released_by="",
            ),
            NodeVolumeFacts(
                mount_point=f"/{self._name}/commitlog",
                device="/dev/loop2",
                fs_type="ext4",
                fs_uuid="u2",
                kinds=("commitlog",),
                serial="",
                wwn="",
                loop_backing_file="",
                mounted=True,
                released_by="",
            ),
        )
        return VolumeState(cassandra_running=self.running, detail="", volumes=facts)

    async def node_info(self) -> NodeFacts:
        self._call("node_info")
        return NodeFacts("c", f"host-{self._name}", "dc1", "r1", "5.0.7", "127.0.0.1")

    async def stop_cassandra(self, *, drain: bool) -> bool:
        self._call("stop")
        return drain

    async def release_volumes(
        self, operation_id: str, mount_points: Sequence[str]
    ) -> tuple[Any, ...]:
        self._call("release")
        return ()

    async def attach_volumes(
        self, operation_id: str, volumes: Sequence[tuple[str, str]]
    ) -> tuple[Any, ...]:
        self._call("attach:" + ",".join(v for _, v in volumes))
        return ()

    async def discard_replay_state(
        self, operation_id: str, *, hints: bool
    ) -> tuple[DiscardedDirectory, ...]:
        self._call(f"discard:hints={hints}")
        return ()

    async def manifest(self, snapshot_tag: str = "") -> list[SSTable]:
        self._call("manifest")
        return self.manifest_found

    async def start_cassandra(self, *, wait_seconds: float, until_gossip: bool = False) -> float:
        self._call("start:gossip" if until_gossip else "start")
        return 1.0


class FakeArray:
    def __init__(self, events: Events, *, deletes_newer: bool = False) -> None:
        self.events = events
        self.deletes_newer = deletes_newer
        self.fail_revert: Exception | None = None
        self.missing = False

    def capabilities(self) -> Capabilities:
        return Capabilities(
            atomic_group_snapshot=True,
            revert=True,
            clone=True,
            revert_deletes_newer=self.deletes_newer,
        )

    async def get_snapshot(self, ref: SnapshotRef) -> SnapshotInfo:
        if self.missing:
            raise NotFoundError("gone", array="array1")
        return SnapshotInfo(ref)

    async def revert_plan(self, ref: SnapshotRef) -> Sequence[str]:
        return ["snapshot newer is deleted by restore_to"] if self.deletes_newer else []

    async def revert(self, ref: SnapshotRef) -> None:
        self.events.append("array:revert:" + ",".join(sorted(m.volume.name for m in ref.members)))
        if self.fail_revert is not None:
            raise self.fail_revert

    async def clone(self, ref: SnapshotRef, suffix: str) -> Sequence[Volume]:
        self.events.append("array:clone")
        return [Volume(f"{m.volume.name}_{suffix}", f"c-{m.volume.id}") for m in ref.members]


class FakeRing:
    def __init__(self, events: Events) -> None:
        self.events = events
        self.present: set[str] = set()
        self.gc_grace = (864000, "ks.t")

    async def write_pre_restore_canaries(
        self, restore_id: str, host_ids: Sequence[str]
    ) -> dict[str, str]:
        self.events.append("ring:pre-restore canary")
        return {h: f"pre:{h}" for h in host_ids}

    async def canary_present(self, key: str, host_id: str) -> bool:
        return key in self.present

    async def min_gc_grace(self) -> tuple[int, str]:
        return self.gc_grace

    async def wait_for_ring(self, host_ids: Sequence[str], timeout: float) -> None:
        self.events.append("ring:up")

    def reconnect(self) -> None:
        pass


class MemoryJournal:
    def __init__(self) -> None:
        self.saved: list[RestoreRecord] = []
        self.verified: list[tuple[str, Verification, str]] = []
        self.lost: list[str] = []

    async def save(self, record: RestoreRecord) -> None:
        self.saved.append(record)

    async def manifest(self, backup_id: str, node: str) -> Iterable[SSTable]:
        return [_sstable("1")]

    async def mark_verified(
        self, backup_id: str, result: Verification, detail: str, by: str
    ) -> None:
        self.verified.append((backup_id, result, by))

    async def mark_snapshots_lost(self, backup_ids: Sequence[str], reason: str) -> None:
        self.lost.extend(backup_ids)


def _backup(started: datetime = NOW, backup_id: str = "rs-1") -> Backup:
    volumes = {
        n: (
            NodeVolume(array="array1", volume=f"{n}-data", role=VolumeRole.DATA),
            NodeVolume(array="array1", volume=f"{n}-log", role=VolumeRole.COMMITLOG),
        )
        for n in NODES
    }
    members = tuple(
        VolumeSnapshot(Volume(v.volume, f"id-{v.volume}"), f"s-{v.volume}", backup_id)
        for n in NODES
        for v in volumes[n]
    )
    return Backup(
        id=backup_id,
        cluster="c",
        state=BackupState.COMPLETE,
        quiesce_mode=QuiesceMode.FREEZE,
        trigger="test",
        policy="",
        started_at=started,
        nodes=tuple(
            BackupNode(name=n, host_id=f"host-{n}", volumes=volumes[n], canary_id=f"canary:{n}")
            for n in NODES
        ),
        snapshots=(SnapshotRef("array1", "fake", "g", "s1", backup_id, started, members),),
    )


class Rig:
    def __init__(self) -> None:
        self.events = Events()
        self.agents: dict[str, Any] = {n: FakeAgent(n, self.events) for n in NODES}
        self.array: Any = FakeArray(self.events)
        self.ring = FakeRing(self.events)
        self.ring.present = {f"canary:{n}" for n in NODES}
        self.journal = MemoryJournal()

    def plan(self, request: RestoreRequest, backup: Backup | None = None, **kwargs: Any) -> Any:
        return asyncio.run(
            plan_restore(
                "rr-1",
                request,
                backup or _backup(),
                self.agents,
                ["node2"],
                {"array1": self.array},
                self.ring,
                now=NOW + timedelta(hours=1),
                **kwargs,
            )
        )

    def workflow(self) -> RestoreWorkflow:
        return RestoreWorkflow(
            self.agents, {"array1": self.array}, self.ring, self.journal, seeds=["node2"]
        )


def _first(events: Sequence[str], suffix: str) -> int:
    return min(i for i, e in enumerate(events) if e.endswith(suffix) or e.startswith(suffix))


def _last(events: Sequence[str], suffix: str) -> int:
    return max(i for i, e in enumerate(events) if e.endswith(suffix) or e.startswith(suffix))


def test_whole_ring_stops_and_releases_every_node_before_the_array_and_starts_the_seed_first() -> (
    None
):
    rig = Rig()
    plan = rig.plan(RestoreRequest("rs-1"))
    assert not plan.refused and plan.whole_ring

    record = asyncio.run(rig.workflow().run(plan, "me"))

    events = rig.events
    assert _last(events, ":stop") < _first(events, ":release")
    assert _last(events, ":release") < _first(events, "array:revert")
    assert _last(events, "array:revert") < _first(events, ":attach:node1-data,node1-log")
    assert _last(events, ":manifest") < _first(events, ":start")
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
    assert record.state is RestoreState.FAILED_VERIFICATION
    assert record.node("node3").verdict is NodeVerdict.FAILED
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
    backup = _backup()
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
    final = asyncio.run(rig.workflow().resume(last, {"array1": _backup().snapshots[0]}))
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
    newer = _backup(NOW + timedelta(hours=1), "rs-2")
    plan = rig.plan(RestoreRequest("rs-1"), newer_backups=[newer])
    assert plan.lost_backups == ("rs-2",)
    assert any("deleted by restore_to" in line for line in plan.destroyed)
    asyncio.run(rig.workflow().run(plan, "me"))
    assert rig.journal.lost == ["rs-2"]


def test_manifest_comparison_names_missing_and_changed_sstables() -> None:
    recorded = [_sstable("1"), _sstable("2"), _sstable("3", digest="aa")]
    found = [_sstable("1"), _sstable("3", digest="bb"), _sstable("9")]
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
    assert "nothing was changed" in next_step_for(record, replace(node, step=RestoreStep.CANARY))
    assert "not verified" in next_step_for(record, replace(node, step=RestoreStep.STARTED))
    assert next_step_for(record, replace(node, step=RestoreStep.VERIFIED)) == ""


def _node() -> Any:
    from ringsnap.coordinator.model import RestoreNode

    return RestoreNode(name="node1")
