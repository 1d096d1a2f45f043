"""The export's orchestration with fakes of its own ports: every failure between two steps (clone,
mount, upload mid-way, unmount, clone deletion, a coordinator killed between steps) leaves a record
naming the node and step, and no mount or clone behind (a clone whose unmount was not confirmed is
never deleted and stays a pending cleanup); a rerun resumes.

The proof that exports work is tests/integration/test_s3_copy.py (real ring, S3 server, array).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from ringsnap.agent.errors import Conflict
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.clone_mounts import CloneToMount, MountedClone
from ringsnap.coordinator.export.model import (
    ExportFailed,
    ExportRecord,
    ExportRefused,
    ExportState,
    NodeStep,
    purpose_id,
)
from ringsnap.coordinator.export.plan import plan_export
from ringsnap.coordinator.export.ports import NodeUpload, UploadProgress
from ringsnap.coordinator.export.workflow import ExportWorkflow
from ringsnap.coordinator.model import (
    Backup,
    BackupState,
    SnapshotKind,
)
from ringsnap.coordinator.presentation import Presenter, RunOf
from ringsnap.coordinator.runs.resources import Resource
from ringsnap.plugins.types import Capabilities, HostInitiators, Presentation, SnapshotRef, Volume
from tests.support.clone_fakes import BACKUP_ID, CloneArray, Events, cloneable_backup
from tests.support.export_fakes import ExportJournal, ExportNode, Progress

NODES = ("node1", "node2")


class FakeNode(ExportNode):
    """A node's agent for exports: the clones it mounts are the backup's data and commit log."""

    def __init__(self, name: str, events: Events) -> None:
        super().__init__(name, events)
        self.exports: list[tuple[str, str]] = []

    async def mount_clones(
        self, purpose: str, volumes: Sequence[CloneToMount], *, read_only: bool
    ) -> list[MountedClone]:
        assert {(v.role, v.source_mount_point) for v in volumes} == {
            ("data", "/data"),
            ("commitlog", "/commitlog"),
        }
        return await super().mount_clones(purpose, volumes, read_only=read_only)

    async def upload(
        self, backup_id: str, purpose_id: str, snapshot_tag: str, progress: Progress
    ) -> NodeUpload:
        if purpose_id:
            assert purpose_id in self.mounted, "export from clones that are not mounted"
        self.exports.append((purpose_id, snapshot_tag))
        progress(UploadProgress("sstables", 10, 1000, 5, 500, 500, 100.0, 5.0))
        self._call("export")
        return NodeUpload(
            f"backups/{backup_id}/{self.name}.manifest", 10, 1000, 4, 400, 2, 64, "", 1
        )


class Setup:
    def __init__(self, backup: Backup | None = None) -> None:
        self.events: Events = []
        self.backup = backup or cloneable_backup(NODES)
        self.nodes = {n: FakeNode(n, self.events) for n in NODES}
        self.array = CloneArray(self.events)
        self.journal = ExportJournal()
        self.mirrored: list[str] = []

    def workflow(self) -> ExportWorkflow:
        async def mirror(record: ExportRecord) -> None:
            self.mirrored.append(record.backup_id)

        return ExportWorkflow(
            self.backup,
            self.nodes,
            {"array1": self.array},  # type: ignore[dict-item]
            self.journal,
            parallel_nodes=2,
            mirror=mirror,
        )

    def plan(self, previous: ExportRecord | None = None) -> ExportRecord:
        return plan_export(
            self.backup, (), previous, destination="s3://b/p/", configured=list(NODES)
        )

    async def run(self, previous: ExportRecord | None = None) -> ExportRecord:
        return await self.workflow().run(self.plan(previous))

    @property
    def last(self) -> ExportRecord:
        return self.journal.saved[-1]

    def assert_nothing_left(self) -> None:
        assert not self.array.live, f"clones left on the array: {self.array.live}"
        assert not any(n.mounted for n in self.nodes.values()), "clones left mounted"
        assert not self.journal.cleanups, "pending cleanups left"


def test_every_node_clones_mounts_exports_unmounts_and_deletes_in_order() -> None:
    setup = Setup()
    record = asyncio.run(setup.run())
    assert record.state is ExportState.SUCCEEDED and record.mirrored
    assert setup.mirrored == [BACKUP_ID]
    for name in NODES:
        node = record.node(name)
        assert node.exported and node.step is NodeStep.DONE and not node.error
        assert (node.files_uploaded, node.files_skipped, node.bytes_skipped) == (4, 6, 600)
        assert node.commitlog_segments == 2
        mine = [e for e in setup.events if e.startswith(f"{name}:")]
        assert mine == [f"{name}:mount", f"{name}:export", f"{name}:unmount"]
        assert setup.nodes[name].exports == [(purpose_id(BACKUP_ID), "")]
    # Each node's clones made before its mount, deleted after its unmount.
    for name in NODES:
        clone = setup.events.index(f"array:clone:{name}_cl,{name}_data")
        assert clone < setup.events.index(f"{name}:mount")
        deletes = [i for i, e in enumerate(setup.events) if e.startswith(f"array:delete:{name}_")]
        assert len(deletes) == 2 and min(deletes) > setup.events.index(f"{name}:unmount")
    setup.assert_nothing_left()


def test_a_clone_is_a_pending_cleanup_before_it_is_mounted() -> None:
    setup = Setup()
    seen: list[int] = []
    node = setup.nodes["node1"]
    original = node.mount_clones

    async def mount(
        purpose: str, volumes: Sequence[CloneToMount], *, read_only: bool
    ) -> list[MountedClone]:
        seen.append(len(setup.journal.cleanups))
        return await original(purpose, volumes, read_only=read_only)

    node.mount_clones = mount  # type: ignore[method-assign]
    asyncio.run(setup.run())
    assert seen and seen[0] >= 2


def test_a_clone_is_in_the_ledger_before_the_array_makes_it_with_its_node_and_purpose() -> None:
    setup = Setup()
    seen: list[list[object]] = []
    original = setup.array.clone

    async def clone(ref: SnapshotRef, suffix: str) -> Sequence[Volume]:
        seen.append([r for r in setup.journal.cleanups.values() if suffix in str(r)])
        return await original(ref, suffix)

    setup.array.clone = clone  # type: ignore[method-assign]
    asyncio.run(setup.run())
    assert len(seen) == 2  # one call per node
    for entries in seen:
        assert len(entries) == 2
        for entry in entries:
            assert isinstance(entry, Resource) and not entry.made, "named before the array answered"
            assert entry.node in NODES and entry.mount_purpose == purpose_id(BACKUP_ID)
            assert (entry.array, entry.run_id, entry.run_kind) == ("array1", BACKUP_ID, "export")
    setup.assert_nothing_left()


def test_clone_failure_names_node_and_step_and_leaves_nothing() -> None:
    setup = Setup()
    setup.array.fail_clone = RuntimeError("no space on aggregate")
    with pytest.raises(ExportFailed, match="node node1: clone: array array1: no space") as info:
        asyncio.run(setup.run())
    assert info.value.record is not None and info.value.record.state is ExportState.FAILED
    assert setup.last.node("node1").error.startswith("clone:")
    assert not any(e.endswith(":mount") for e in setup.events)
    assert setup.mirrored == []
    setup.assert_nothing_left()


def test_mount_failure_unmounts_and_deletes_the_clones() -> None:
    setup = Setup()
    setup.nodes["node2"].fail["mount"] = Conflict("clone holds no filesystem blkid knows")
    with pytest.raises(ExportFailed, match="node node2: mount: clone holds no filesystem"):
        asyncio.run(setup.run())
    record = setup.last
    assert record.node("node1").exported and not record.node("node2").exported
    assert "node2:unmount" in setup.events
    setup.assert_nothing_left()


def test_export_failing_mid_way_tears_down_and_a_rerun_exports_only_that_node() -> None:
    setup = Setup()
    setup.nodes["node1"].fail["export"] = RuntimeError("connection reset by peer")
    with pytest.raises(ExportFailed, match="node node1: export: connection reset"):
        asyncio.run(setup.run())
    setup.assert_nothing_left()
    first = setup.last
    assert first.node("node2").exported and not first.node("node1").exported
    setup.events.clear()
    record = asyncio.run(setup.run(first))
    assert record.state is ExportState.SUCCEEDED
    assert not any(e.startswith("node2:") for e in setup.events), "node2 exported twice"
    assert "node1:export" in setup.events
    setup.assert_nothing_left()


def test_unmount_failure_never_deletes_a_clone_that_may_be_mounted() -> None:
    setup = Setup()
    setup.nodes["node1"].fail["unmount"] = Conflict("target is busy")
    with pytest.raises(ExportFailed, match="node node1: unmount: target is busy"):
        asyncio.run(setup.run())
    left = setup.last.node("node1").clones_left
    assert len(left) == 2 and not any(c.unmounted for c in left)
    assert not any(e.startswith("array:delete:node1_") for e in setup.events)
    assert len(setup.journal.cleanups) == 2
    assert all("not confirmed unmounted" in e for e in setup.journal.failed.values())
    # The data is exported; the rerun only finishes the teardown.
    assert setup.last.node("node1").exported
    setup.events.clear()
    record = asyncio.run(setup.run(setup.last))
    assert record.state is ExportState.SUCCEEDED
    assert "node1:export" not in setup.events
    assert setup.events.index("node1:unmount") < min(
        i for i, e in enumerate(setup.events) if e.startswith("array:delete:node1_")
    )
    setup.assert_nothing_left()


def test_clone_delete_failure_stays_a_pending_cleanup_and_is_retried() -> None:
    setup = Setup(cloneable_backup(NODES, nodes=cloneable_backup(NODES).nodes[:1]))
    setup.nodes.pop("node2")
    setup.array.fail_delete = 1
    with pytest.raises(ExportFailed, match=r"delete-clones: array array1: clone .* not deleted"):
        asyncio.run(
            setup.workflow().run(
                plan_export(setup.backup, (), None, destination="", configured=["node1"])
            )
        )
    assert len(setup.journal.cleanups) == 1 and len(setup.array.live) == 1
    record = asyncio.run(
        setup.workflow().run(
            plan_export(setup.backup, (), setup.last, destination="", configured=["node1"])
        )
    )
    assert record.state is ExportState.SUCCEEDED
    setup.assert_nothing_left()


def test_coordinator_killed_between_steps_resumes_with_a_teardown_first() -> None:
    setup = Setup()

    class Killed(BaseException):
        pass

    world: dict[str, object] = {}

    def freeze_the_world() -> None:
        # What a SIGKILL leaves: the last record saved, clones made, mounted and pending cleanups
        # (no teardown runs in a killed process).
        world.update(
            record=setup.last,
            live=set(setup.array.live),
            cleanups=dict(setup.journal.cleanups),
            mounted={n: set(node.mounted) for n, node in setup.nodes.items()},
        )

    setup.nodes["node1"].before["export"] = lambda: None
    setup.nodes["node2"].before["export"] = freeze_the_world
    setup.nodes["node1"].fail["export"] = Killed()
    setup.nodes["node2"].fail["export"] = Killed()
    with pytest.raises(Killed):
        asyncio.run(setup.run())
    running = world["record"]
    assert isinstance(running, ExportRecord) and running.state is ExportState.RUNNING
    setup.array.live = world["live"]  # type: ignore[assignment]
    setup.journal.cleanups = world["cleanups"]  # type: ignore[assignment]
    for name, mounted in world["mounted"].items():  # type: ignore[attr-defined]
        setup.nodes[name].mounted = mounted
    assert setup.array.live and any(n.mounted for n in setup.nodes.values())
    setup.events.clear()
    record = asyncio.run(setup.run(running))
    assert record.state is ExportState.SUCCEEDED
    for name in NODES:
        mine = [e for e in setup.events if e.startswith(f"{name}:")]
        assert mine[0] == f"{name}:unmount", "a resume unmounts what the killed run mounted first"
    setup.assert_nothing_left()


def test_native_backup_exports_from_its_snapshot_tag_without_clones() -> None:
    backup = cloneable_backup(NODES, snapshot_kind=SnapshotKind.NATIVE, snapshots=())
    setup = Setup(backup)
    record = asyncio.run(setup.run())
    assert record.state is ExportState.SUCCEEDED
    assert all(n.exports == [("", BACKUP_ID)] for n in setup.nodes.values())
    assert not any(e.startswith("array:") for e in setup.events)


def test_plan_refuses_what_cannot_be_exported() -> None:
    with pytest.raises(ExportRefused, match="is failed"):
        plan_export(
            cloneable_backup(NODES, state=BackupState.FAILED),
            (),
            None,
            destination="",
            configured=list(NODES),
        )
    with pytest.raises(ExportRefused, match="no included node node9"):
        plan_export(
            cloneable_backup(NODES), ("node9",), None, destination="", configured=list(NODES)
        )
    with pytest.raises(ExportRefused, match=r"node node2 .* not in the cluster's configuration"):
        plan_export(cloneable_backup(NODES), (), None, destination="", configured=["node1"])


def test_bounded_parallelism_across_nodes() -> None:
    setup = Setup()
    active = 0
    peak = 0

    for node in setup.nodes.values():
        original = node.export_to_s3

        async def export(  # type: ignore[no-untyped-def]
            backup_id: str, *, original=original, **kwargs
        ) -> NodeUpload:
            nonlocal active, peak
            active += 1
            peak = max(peak, active)
            await asyncio.sleep(0.01)
            active -= 1
            upload: NodeUpload = await original(backup_id, **kwargs)
            return upload

        node.export_to_s3 = export  # type: ignore[method-assign]
    workflow = setup.workflow()
    workflow.parallel_nodes = 1
    asyncio.run(workflow.run(setup.plan()))
    assert peak == 1


def test_cancelled_during_the_array_clone_records_and_deletes_what_it_made() -> None:
    setup = Setup(cloneable_backup(NODES, nodes=cloneable_backup(NODES).nodes[:1]))
    setup.nodes.pop("node2")
    original = setup.array.clone

    async def main() -> None:
        started, gate = asyncio.Event(), asyncio.Event()

        async def slow_clone(ref: SnapshotRef, suffix: str) -> Sequence[Volume]:
            started.set()
            await gate.wait()  # the array still works on it when the run is cancelled
            return await original(ref, suffix)

        setup.array.clone = slow_clone  # type: ignore[method-assign]
        record = plan_export(setup.backup, (), None, destination="", configured=["node1"])
        task = asyncio.create_task(setup.workflow().run(record))
        await started.wait()
        task.cancel()
        await asyncio.sleep(0.05)
        gate.set()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert any(e.startswith("array:delete:node1_") for e in setup.events)
    setup.assert_nothing_left()


class _PresentingArray:
    """The array's presentation side: each call an event beside the clones' and the nodes'."""

    def __init__(self, events: Events) -> None:
        self.events = events

    def capabilities(self) -> Capabilities:
        return Capabilities(atomic_group_snapshot=True, clone=True, present=True)

    async def list_volumes(self) -> Sequence[Volume]:
        return []

    async def present(
        self, volumes: Sequence[Volume], host: HostInitiators
    ) -> Sequence[Presentation]:
        self.events.extend(f"array:present:{v.name}:{host.array_host}" for v in volumes)
        return [Presentation(v, host.array_host, 1, f"600a0980{v.name}") for v in volumes]

    async def unpresent(self, volumes: Sequence[Volume], host: HostInitiators) -> None:
        self.events.extend(f"array:unpresent:{v.name}:{host.array_host}" for v in volumes)


def test_each_nodes_clones_are_presented_to_its_host_before_the_mount_and_after(
    tmp_path: Path,
) -> None:
    """present → mount (by the identity the array gave) → export → unmount → unpresent →
    delete, per node, every mapping in the ledger until the array unmapped it."""
    setup = Setup()
    mounted: dict[str, list[str]] = {}
    for name, node in setup.nodes.items():
        original = node.mount_clones

        async def mount(
            purpose: str,
            volumes: Sequence[CloneToMount],
            *,
            read_only: bool,
            _name: str = name,
            _original: Any = original,
        ) -> list[MountedClone]:
            mounted[_name] = sorted(v.wwn for v in volumes)
            result: list[MountedClone] = await _original(purpose, volumes, read_only=read_only)
            return result

        node.mount_clones = mount  # type: ignore[method-assign]

    async def hosts(node: str) -> HostInitiators:
        return HostInitiators(iqns=(f"iqn.x:{node}",), array_host=f"host-{node}")

    with Catalog(tmp_path / "catalog.db") as catalog:
        presenter = Presenter(
            {"array1": _PresentingArray(setup.events)},
            catalog,
            RunOf("c1", BACKUP_ID, "export"),
            hosts,
        )
        workflow = setup.workflow()
        workflow.presenter = presenter
        record = asyncio.run(workflow.run(setup.plan()))
        assert record.state is ExportState.SUCCEEDED
        assert catalog.resources() == [], "a mapping left in the ledger"
    for name in NODES:
        clones = [c.clone for c in record.node(name).clones]
        assert len(clones) == 2
        assert mounted[name] == sorted(f"600a0980{c}" for c in clones)
        at = setup.events.index
        for clone in clones:
            present = at(f"array:present:{clone}:host-{name}")
            unpresent = at(f"array:unpresent:{clone}:host-{name}")
            assert present < at(f"{name}:mount") < at(f"{name}:unmount") < unpresent
            assert unpresent < at(f"array:delete:{clone}")
    setup.assert_nothing_left()
