"""The drill workflow against fakes of the drill host, the production agents and the arrays, with a
real catalog: the order of the steps, the verdicts, and above all the failure paths (a clone that
fails on the array, a mount that fails, a drill that fails, a drill host lost mid-drill, a clone
that cannot be deleted): teardown always runs, each failure is recorded, and no clone is forgotten.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.drill.model import DrillState, DrillStep, DrillVerdict, purpose_id
from ringsnap.coordinator.drill.plan import DrillRequest, DrillSettings, plan_drill
from ringsnap.coordinator.drill.session import CatalogDrillJournal
from ringsnap.coordinator.drill.workflow import DrillRefused, DrillWorkflow
from ringsnap.coordinator.model import (
    QuiesceMode,
    SnapshotKind,
    Verification,
)
from ringsnap.coordinator.runs.ledger import Ledger, LedgerRetry
from ringsnap.plugins.errors import DriverError, SnapshotLostError
from ringsnap.plugins.types import SnapshotInfo, SnapshotRef
from tests.support.drill_fakes import (
    T0,
    DrillArray,
    FakeFacts,
    FakeHost,
    drill_node,
    drill_ref,
    drill_sstables,
)

NODES = ("n1", "n2", "n3")


@pytest.fixture
def catalog(tmp_path: Path) -> Iterator[Catalog]:
    with Catalog(tmp_path / "catalog.db") as opened:
        nodes = [drill_node(n) for n in NODES]
        opened.begin_backup(
            backup_id="rs-1",
            cluster="c1",
            quiesce_mode=QuiesceMode.FREEZE,
            trigger="cli:test",
            policy="",
            started_at=T0,
            nodes=nodes,
        )
        opened.record_snapshot("rs-1", drill_ref(nodes))
        for n in NODES:
            opened.record_manifest("rs-1", n, drill_sstables(n))
        opened.complete_backup("rs-1", finished_at=T0 + timedelta(minutes=1))
        yield opened


class Rig:
    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.events: list[str] = []
        self.array = DrillArray(self.events)
        self.host = FakeHost(self.events)
        self.facts = {n: FakeFacts(n) for n in NODES}
        self.settings = DrillSettings(max_parallel=2, poll_seconds=0.0, deadline_seconds=60)

    def plan(self, drill_id: str = "dr-20261121-100000-0001", **request: Any) -> Any:
        return asyncio.run(self._plan(drill_id, **request))

    async def _plan(self, drill_id: str, **request: Any) -> Any:
        values: dict[str, Any] = {"cluster": "c1", "backup_id": "rs-1"}
        values.update(request)
        return await plan_drill(
            drill_id,
            DrillRequest(**values),
            self.catalog.get_backup("rs-1"),
            self.facts,
            {"a1": self.array},  # type: ignore[dict-item]
            self.host.address,
            "ringsnap",
            self.settings,
        )

    def drill(self, drill_id: str = "dr-20261121-100000-0001", **request: Any) -> Any:
        return asyncio.run(self._drill(drill_id, **request))

    async def _drill(self, drill_id: str, **request: Any) -> Any:
        plan = await self._plan(drill_id, **request)
        workflow = DrillWorkflow(
            self.host,
            {"a1": self.array},  # type: ignore[dict-item]
            CatalogDrillJournal(self.catalog),
            settings=self.settings,
        )
        return await workflow.run(plan, "cli:test", "test")

    def nothing_left(self) -> None:
        assert self.array.clones == {}
        assert self.host.mounted == set()
        assert self.host.running == set()
        assert self.catalog.pending_cleanups() == []
        assert self.catalog.resources() == []


@pytest.fixture
def rig(catalog: Catalog) -> Rig:
    return Rig(catalog)


def test_a_ring_drill_proves_every_node_one_at_a_time_and_marks_the_backup(rig: Rig) -> None:
    record = rig.drill(ring=True)
    assert record.state is DrillState.PROVEN
    assert [n.verdict for n in record.nodes] == [DrillVerdict.PROVEN] * 3
    assert all(n.step is DrillStep.TORN_DOWN for n in record.nodes)
    n1 = record.node("n1")
    assert n1.proof[-1] == "manifest: all 2 recorded SSTables present, sizes and digests equal"
    assert n1.bytes_verified == 300
    assert [step for step, _ in n1.step_seconds] == [
        "cloned",
        "mounted",
        "started",
        "drilled",
        "checked",
        "torn-down",
    ]
    assert all(c.deleted for c in record.clones) and len(record.clones) == 6
    # One node at a time by default: n1's teardown ends before n2's clone begins.
    first = rig.events.index(f"array:delete:n1_commitlog_{n1.purpose_id.replace('-', '_')}")
    assert first < rig.events.index(f"array:clone:{record.node('n2').purpose_id.replace('-', '_')}")
    assert rig.catalog.get_drill(record.id) == record
    backup = rig.catalog.get_backup("rs-1")
    assert backup.verification is Verification.PROVEN and backup.verified_by == record.id
    rig.nothing_left()
    spec = rig.host.specs[0]
    assert (spec.node, spec.cluster_name, spec.address) == ("n1", "Sandbox", "127.0.0.1")
    assert spec.host_id == "00000000-0000-0000-0000-000000000001"
    assert spec.canary_key == "backup:rs-1:n1:0" and spec.backup_id == "rs-1"
    assert spec.data_directories == ("/srv/n1/data/data",)
    assert (spec.num_tokens, spec.datacenter, spec.rack) == (16, "dc1", "rack1")
    mounts = {m.role: m for m in rig.host.mount_requests[0]}
    assert mounts["data"].source_mount_point == "/srv/n1/data"
    assert mounts["commitlog"].source_mount_point == "/srv/n1/commitlog"
    # Each clone with its id on the array, which presenting it needs (E-Series: no volume lists
    # a snapshot volume).
    made = {c.name: c.id for c in record.clones}
    assert all(made[m.volume] == m.volume_id != "" for m in mounts.values())


def test_node_by_node_the_backup_is_proven_when_its_last_node_is(rig: Rig) -> None:
    first = rig.drill("dr-20261121-100000-0001")
    assert [n.name for n in first.nodes] == ["n1"]  # one node by default, never drilled first
    assert rig.catalog.get_backup("rs-1").verification is Verification.UNVERIFIED
    rig.drill("dr-20261121-100100-0002", nodes=("n2",))
    assert rig.catalog.get_backup("rs-1").verification is Verification.UNVERIFIED
    last = rig.drill("dr-20261121-100200-0003", nodes=("n3",))
    backup = rig.catalog.get_backup("rs-1")
    assert backup.verification is Verification.PROVEN and backup.verified_by == last.id
    assert "dr-20261121-100000-0001" in backup.verification_detail


def test_a_clone_failing_on_the_array_fails_the_node_and_mounts_nothing(rig: Rig) -> None:
    rig.array.fail_clone = DriverError("FlexClone quota reached", array="a1")
    record = rig.drill(nodes=("n1",))
    assert record.state is DrillState.FAILED
    n1 = record.node("n1")
    assert n1.verdict is DrillVerdict.FAILED
    assert "clone: array a1: cloning snapshot rs-1 failed" in n1.problems[0]
    assert "FlexClone quota reached" in record.error
    assert not [e for e in rig.events if e.startswith("host:")]
    assert rig.catalog.get_backup("rs-1").verification is Verification.UNVERIFIED
    rig.nothing_left()


def test_a_mount_failing_still_unmounts_and_deletes_the_clones(rig: Rig) -> None:
    rig.host.fail["mount"] = RuntimeError("attach hook exited 1: no such LUN")
    record = rig.drill(nodes=("n2",))
    n2 = record.node("n2")
    assert record.state is DrillState.FAILED and n2.verdict is DrillVerdict.FAILED
    assert n2.problems == ("mount: attach hook exited 1: no such LUN",)
    assert n2.step is DrillStep.TORN_DOWN and n2.teardown == ()
    purpose = n2.purpose_id
    assert f"host:unmount:{purpose}" in rig.events
    assert f"host:start:{purpose}" not in rig.events
    assert f"host:stop:{purpose}" not in rig.events
    assert all(c.deleted for c in record.clones)
    rig.nothing_left()


def test_a_failed_drill_is_not_proven_names_why_and_fails_the_backup(rig: Rig) -> None:
    rig.host.final = "failed"
    rig.host.failing_step = "canary"
    record = rig.drill(nodes=("n1",))
    n1 = record.node("n1")
    assert record.state is DrillState.NOT_PROVEN
    assert n1.verdict is DrillVerdict.NOT_PROVEN
    assert n1.problems == ("canary: canary row absent (failed)",)
    backup = rig.catalog.get_backup("rs-1")
    assert backup.verification is Verification.FAILED
    assert "n1 (canary: canary row absent (failed))" in backup.verification_detail
    events = [e for e in rig.events if e.startswith("host:")]
    assert events[-2:] == [f"host:stop:{n1.purpose_id}", f"host:unmount:{n1.purpose_id}"]
    rig.nothing_left()


class LostOnN2(DrillArray):
    """n2's node-local snapshot overflowed its copy-on-write space (as `agent-lvm` reports it)."""

    async def get_snapshot(self, ref: SnapshotRef) -> SnapshotInfo:
        if any(m.volume.name.startswith("n2_") for m in ref.members):
            raise SnapshotLostError(
                "node n2: snapshot rs-1 is invalid: vg/n2_data.rs overflowed its copy-on-write"
                " space, its contents are lost; restore this node from the backup's S3 copy",
                array="a1",
            )
        return await super().get_snapshot(ref)


def test_a_drill_of_a_lost_snapshot_is_not_proven_naming_why_and_drills_the_others(
    rig: Rig,
) -> None:
    rig.array = LostOnN2(rig.events)
    plan = rig.plan(ring=True)
    assert not plan.refused, plan.refusals
    assert any(w.startswith("node n2 will be NOT PROVEN") for w in plan.warnings), plan.warnings

    record = rig.drill(ring=True)

    n2 = record.node("n2")
    assert n2.verdict is DrillVerdict.NOT_PROVEN
    (problem,) = n2.problems
    assert problem.startswith("snapshot lost: ") and "node n2: snapshot rs-1 is invalid" in problem
    assert "overflowed its copy-on-write space" in problem
    assert n2.proof == () and n2.clones == ()
    assert [record.node(n).verdict for n in ("n1", "n3")] == [DrillVerdict.PROVEN] * 2
    assert record.state is DrillState.NOT_PROVEN
    # Nothing of n2 was cloned, mounted or started.
    assert not [e for e in rig.events if n2.purpose_id in e or "n2_" in e], rig.events
    backup = rig.catalog.get_backup("rs-1")
    assert backup.verification is Verification.FAILED
    assert "not proven on n2 (snapshot lost: " in backup.verification_detail
    assert "node n2: snapshot rs-1 is invalid" in backup.verification_detail
    rig.nothing_left()


def test_a_manifest_differing_from_the_backup_is_not_proven(rig: Rig) -> None:
    rig.host.manifest["n1"] = drill_sstables("n1", digest="999")[:1]
    record = rig.drill(nodes=("n1",))
    problem = record.node("n1").problems[0]
    assert record.state is DrillState.NOT_PROVEN
    assert "1 missing (ks.tbl generation 2)" in problem
    assert "data digest 777 != 999" in problem
    rig.nothing_left()


def test_a_drill_host_lost_mid_drill_keeps_the_clones_in_the_ledger(rig: Rig) -> None:
    lost = ConnectionError("drill host (127.0.0.1:7450): GetDrill: UNAVAILABLE")
    rig.host.fail.update(get=lost, stop=lost, unmount=lost)
    record = rig.drill(nodes=("n1",))
    n1 = record.node("n1")
    assert record.state is DrillState.FAILED and n1.verdict is DrillVerdict.FAILED
    assert n1.problems[0].startswith("drill: drill host (127.0.0.1:7450): GetDrill: UNAVAILABLE")
    assert n1.teardown[0].startswith("stop the drill: ")
    assert n1.teardown[1].startswith("unmount the clones: ")
    assert all(
        "kept, because the drill host did not confirm the unmount" in t for t in n1.teardown[2:]
    )
    assert n1.step is DrillStep.STARTED  # not torn down
    # Never a volume deleted under a mount: the clones stay, recorded for the retries.
    assert not [e for e in rig.events if e.startswith("array:delete")]
    assert rig.catalog.pending_cleanups() == []
    kept = rig.catalog.resources()
    assert len(kept) == 2 and all(e.attempts == 1 for e in kept)
    assert sorted(e.resource.name for e in kept) == sorted(c.name for c in n1.clones)
    assert all(
        (e.resource.cluster, e.resource.mount_purpose, e.resource.drill_host, e.resource.run_id)
        == ("c1", n1.purpose_id, True, record.id)
        for e in kept
    )
    assert "teardown incomplete" in record.warnings[-1]
    # The coordinator's retry stops the drill and unmounts the purpose on the drill host, then
    # deletes the clone.
    rig.host.fail.clear()
    rig.events.clear()
    retry = LedgerRetry(
        Ledger(rig.catalog),
        {"a1": rig.array},  # type: ignore[dict-item]
        node_agent=lambda cluster, node: None,
        tag_agent=lambda cluster, node: None,
        drill_host=lambda cluster: rig.host if cluster == "c1" else None,
        held=lambda cluster: None,
        now=lambda: datetime.now(UTC),
    )
    assert asyncio.run(retry.run()) == 0
    first_delete = next(i for i, e in enumerate(rig.events) if e.startswith("array:delete"))
    assert f"host:unmount:{n1.purpose_id}" in rig.events[:first_delete]
    rig.nothing_left()


def test_a_clone_that_cannot_be_deleted_stays_in_the_ledger(rig: Rig) -> None:
    rig.array.fail_delete = DriverError("volume busy", array="a1")
    record = rig.drill(nodes=("n3",))
    assert record.state is DrillState.PROVEN  # the proof stands; the leftover is a warning
    assert [c.deleted for c in record.clones] == [False, False]
    kept = rig.catalog.resources()
    assert sorted(e.resource.array for e in kept) == ["a1", "a1"]
    assert all("volume busy" in e.last_error for e in kept)
    assert "teardown incomplete" in record.warnings[-1]


def test_the_plan_refuses_what_it_cannot_drill(rig: Rig) -> None:
    rig.array.can_clone = False
    plan = rig.plan(nodes=("n1", "n9"), parallel=5)
    assert (
        "array a1: its driver (ontap) cannot clone a snapshot, so no drill can run from it"
        in plan.refusals
    )
    assert any("node n9 is not among the nodes backup rs-1 holds" in r for r in plan.refusals)
    assert any("--parallel 5 is outside 1..2" in r for r in plan.refusals)
    with pytest.raises(DrillRefused):
        workflow = DrillWorkflow(
            rig.host,
            {},
            CatalogDrillJournal(rig.catalog),
        )
        asyncio.run(workflow.run(plan, "cli:test", "test"))
    assert rig.events == [] and rig.catalog.list_drills() == []


def test_the_plan_refuses_native_backups_and_clusters_without_a_drill_host(rig: Rig) -> None:
    backup = replace(rig.catalog.get_backup("rs-1"), snapshot_kind=SnapshotKind.NATIVE)
    plan = asyncio.run(
        plan_drill(
            "dr-20261121-100000-0001",
            DrillRequest(cluster="c1", ring=True),
            backup,
            rig.facts,
            {"a1": rig.array},  # type: ignore[dict-item]
            "",
            "ringsnap",
            DrillSettings(),
        )
    )
    assert any("native snapshots" in r for r in plan.refusals)
    assert any("cluster c1 has no drill host" in r for r in plan.refusals)


def test_purpose_ids_are_what_agents_accept() -> None:
    assert (
        purpose_id("dr-20261121-100000-0001", "Node_1.dc1") == "dr-20261121-100000-0001-node-1-dc1"
    )
    assert len(purpose_id("dr-20261121-100000-0001", "x" * 60)) == 63


def test_a_drill_the_host_stopped_before_a_verdict_fails_without_judging_the_backup(
    rig: Rig,
) -> None:
    rig.host.final = "stopped"
    rig.host.failing_step = "start"
    record = rig.drill(nodes=("n2",))
    n2 = record.node("n2")
    assert record.state is DrillState.FAILED and n2.verdict is DrillVerdict.FAILED
    assert n2.problems[0].startswith("drill: the drill host stopped the drill at step start")
    assert rig.catalog.get_backup("rs-1").verification is Verification.UNVERIFIED
    rig.nothing_left()


class _FactsWithWwns(FakeFacts):
    """n1's facts, its data filesystem on the device of WWN `data_wwn`, its commit log on one of
    WWN `log_wwn`."""

    def __init__(self, node: str, data_wwn: str, log_wwn: str) -> None:
        super().__init__(node)
        self.wwns = {"data": data_wwn, "commitlog": log_wwn}

    async def drill_facts(self) -> Any:
        facts = await super().drill_facts()
        volumes = tuple(replace(v, wwn=self.wwns[v.kinds[0]]) for v in facts.volumes)
        return replace(facts, volumes=volumes)


def test_the_drill_host_is_given_the_source_filesystem_uuid_of_the_backed_up_volume(
    rig: Rig,
) -> None:
    """The clone of a volume holds its filesystem: the drill host refuses a device holding another
    UUID. Passed only where the node's disk is the backed-up volume itself (by WWN); where it is
    another volume now (its clone after a clone-mode restore), nothing is claimed."""
    backup = rig.catalog.get_backup("rs-1")
    n1 = backup.node("n1")
    wwns = ("600a0980aaaa", "600a0980bbbb")
    n1 = replace(
        n1, volumes=tuple(replace(v, wwn=w) for v, w in zip(n1.volumes, wwns, strict=True))
    )
    backup = replace(backup, nodes=tuple(n1 if n.name == "n1" else n for n in backup.nodes))
    rig.facts["n1"] = _FactsWithWwns("n1", "naa.600A0980AAAA", "600a0980cccc")

    plan = asyncio.run(
        plan_drill(
            "dr-20261121-100000-0001",
            DrillRequest(cluster="c1", backup_id="rs-1", nodes=("n1",)),
            backup,
            rig.facts,
            {"a1": rig.array},  # type: ignore[dict-item]
            rig.host.address,
            "ringsnap",
            rig.settings,
        )
    )
    assert not plan.refused, plan.refusals
    workflow = DrillWorkflow(
        rig.host,
        {"a1": rig.array},  # type: ignore[dict-item]
        CatalogDrillJournal(rig.catalog),
        settings=rig.settings,
    )
    record = asyncio.run(workflow.run(plan, "cli:test", "test"))
    assert record.state is DrillState.PROVEN
    mounts = {m.role: m for m in rig.host.mount_requests[0]}
    assert mounts["data"].fs_uuid == "u1"  # the data volume itself
    assert mounts["commitlog"].fs_uuid == ""  # another device than the backed-up volume
