"""The resource ledger: an entry written before a clone is made, by a process then SIGKILLed, is
undone after a restart by the one retry path: unmounted on the node that mounts it, then deleted
on the array, never deleted while its unmount is not confirmed; held clusters are left alone."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from ringsnap.agent.errors import Conflict
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.ports import AgentError
from ringsnap.coordinator.runs.lease import Lease, RunKind
from ringsnap.coordinator.runs.ledger import UNNAMED_GRACE, Ledger, LedgerRetry
from ringsnap.coordinator.runs.resources import Resource, ResourceType
from ringsnap.plugins.errors import NotFoundError
from ringsnap.plugins.types import Volume

ROOT = Path(__file__).resolve().parents[3]
CLONE = Resource(
    type=ResourceType.CLONE,
    cluster="c1",
    run_id="export-b1",
    run_kind="export",
    reason="clone of data1 made to export backup b1 from node node2",
    array="array1",
    name_hint="rsx_1234",
    node="node2",
    mount_purpose="export-abc",
)

#: The process that records the clone, then (optionally) its name, then dies.
_KILLED = """
import os, signal, sys
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.ports import AgentError
from tests.unit.runs.test_ledger import CLONE
with Catalog(sys.argv[1]) as catalog:
    entry = catalog.add_resource(CLONE)
    if sys.argv[2] == "made":
        catalog.resource_made(entry.id, "data1_rsx_1234", "vol-77")
    os.kill(os.getpid(), signal.SIGKILL)
"""

Events = list[str]


class FakeArray:
    def __init__(self, events: Events, volumes: Sequence[Volume] = ()) -> None:
        self.events = events
        self.volumes = list(volumes)

    async def list_volumes(self) -> Sequence[Volume]:
        return list(self.volumes)

    async def delete_clone(self, volume: Volume) -> None:
        if volume.name not in {v.name for v in self.volumes}:
            raise NotFoundError(f"no volume {volume.name}")
        self.events.append(f"array1:delete:{volume.name}")
        self.volumes = [v for v in self.volumes if v.name != volume.name]


class FakeNode:
    def __init__(self, name: str, events: Events, *, answers: bool = True) -> None:
        self.name = name
        self.events = events
        self.answers = answers

    async def unmount_clones(self, purpose_id: str) -> Sequence[str]:
        if not self.answers:
            raise Conflict(f"agent of {self.name} unreachable")
        self.events.append(f"{self.name}:unmount:{purpose_id}")
        return ["/mnt/x"]

    async def clear_snapshot(self, tag: str) -> None:
        self.events.append(f"{self.name}:clearsnapshot:{tag}")


class FakeDrillHost:
    """The cluster's drill host: StopDrill and UnmountClones of a purpose record an event, or
    raise `fail` (the purpose unknown: NOT_FOUND, as the agent answers)."""

    def __init__(self, events: Events, fail: Exception | None = None) -> None:
        self.events = events
        self.fail = fail

    async def stop_drill(self, purpose_id: str) -> None:
        self.events.append(f"host:stop:{purpose_id}")
        if self.fail is not None:
            raise self.fail

    async def unmount_clones(self, purpose_id: str) -> Sequence[str]:
        self.events.append(f"host:unmount:{purpose_id}")
        if self.fail is not None:
            raise self.fail
        return ["/mnt/x"]


def retry(
    catalog: Catalog,
    array: FakeArray,
    nodes: dict[str, FakeNode],
    *,
    held: Lease | None = None,
    now: datetime | None = None,
    host: FakeDrillHost | None = None,
) -> int:
    ledger = LedgerRetry(
        Ledger(catalog),
        {"array1": array},
        node_agent=lambda cluster, node: nodes.get(node) if cluster == "c1" else None,
        tag_agent=lambda cluster, node: nodes.get(node),
        drill_host=lambda cluster: host if cluster == "c1" else None,
        held=lambda cluster: held,
        now=lambda: now or datetime.now(UTC),
    )
    return asyncio.run(ledger.run())


@pytest.mark.parametrize("killed_after", ["recorded", "made"])
def test_a_clone_left_by_a_killed_process_is_unmounted_on_its_node_then_deleted(
    tmp_path: Path, killed_after: str
) -> None:
    path = tmp_path / "catalog.db"
    died = subprocess.run(
        [sys.executable, "-c", _KILLED, str(path), killed_after], cwd=ROOT, check=False
    )
    assert died.returncode == -signal.SIGKILL
    events: Events = []
    # The array made the clone (its name holds the hint), whether or not the process heard.
    array = FakeArray(events, [Volume("data1_rsx_1234", "vol-77"), Volume("data1", "vol-1")])
    nodes = {n: FakeNode(n, events) for n in ("node1", "node2")}
    with Catalog(path) as catalog:
        assert [e.resource.name for e in catalog.resources()] == [
            "data1_rsx_1234" if killed_after == "made" else ""
        ]
        assert retry(catalog, array, nodes) == 0
        assert catalog.resources() == []
    assert events == ["node2:unmount:export-abc", "array1:delete:data1_rsx_1234"]
    assert [v.name for v in array.volumes] == ["data1"]


def test_a_node_that_does_not_confirm_the_unmount_keeps_the_clone(tmp_path: Path) -> None:
    events: Events = []
    array = FakeArray(events, [Volume("data1_rsx_1234", "vol-77")])
    with Catalog(tmp_path / "catalog.db") as catalog:
        entry = catalog.add_resource(CLONE)
        catalog.resource_made(entry.id, "data1_rsx_1234", "vol-77")
        assert retry(catalog, array, {"node2": FakeNode("node2", events, answers=False)}) == 1
        (kept,) = catalog.resources()
        assert kept.attempts == 1 and "did not confirm it is unmounted" in kept.last_error
        # A node no longer configured: kept too, saying what to do.
        assert retry(catalog, array, {}) == 1
        assert "not in the configuration" in catalog.resources()[0].last_error
        # Answering again: unmounted, then deleted.
        assert retry(catalog, array, {"node2": FakeNode("node2", events)}) == 0
    assert events == ["node2:unmount:export-abc", "array1:delete:data1_rsx_1234"]


EXPORT_B1 = Lease("c1", RunKind.EXPORT, run_id="b1", backup_id="b1")


def test_a_held_cluster_is_left_alone(tmp_path: Path) -> None:
    events: Events = []
    with Catalog(tmp_path / "catalog.db") as catalog:
        entry = catalog.add_resource(CLONE)
        catalog.resource_made(entry.id, "data1_rsx_1234", "vol-77")
        array = FakeArray(events, [Volume("data1_rsx_1234", "vol-77")])
        assert retry(catalog, array, {"node2": FakeNode("node2", events)}, held=EXPORT_B1) == 1
        assert catalog.resources()[0].attempts == 0
    assert events == []


def test_a_clone_not_named_yet_is_looked_for_until_the_grace_ends(tmp_path: Path) -> None:
    events: Events = []
    array = FakeArray(events, [Volume("data1", "vol-1")])
    nodes = {"node2": FakeNode("node2", events)}
    with Catalog(tmp_path / "catalog.db") as catalog:
        catalog.add_resource(CLONE)
        assert retry(catalog, array, nodes) == 1
        assert "not on the array yet" in catalog.resources()[0].last_error
        later = datetime.now(UTC) + UNNAMED_GRACE + timedelta(seconds=1)
        assert retry(catalog, array, nodes, now=later) == 0
    assert [v.name for v in array.volumes] == ["data1"], "a volume without the hint was deleted"


def test_a_clone_already_gone_and_a_native_tag_are_undone(tmp_path: Path) -> None:
    events: Events = []
    with Catalog(tmp_path / "catalog.db") as catalog:
        entry = catalog.add_resource(CLONE)
        catalog.resource_made(entry.id, "data1_rsx_1234", "vol-77")
        catalog.add_resource(
            Resource(
                type=ResourceType.NATIVE_TAG,
                cluster="c1",
                run_id="b1",
                run_kind="backup",
                reason="native snapshot of backup b1",
                name="b1",
                node="node1",
            )
        )
        staging = Resource(
            type=ResourceType.STAGING,
            cluster="c1",
            run_id="tr-1",
            run_kind="table-restore",
            reason="staged SSTables",
            name="tr-1",
            node="node1",
        )
        catalog.add_resource(staging)
        nodes = {n: FakeNode(n, events) for n in ("node1", "node2")}
        assert retry(catalog, FakeArray(events), nodes) == 1
        # Staging is the run's to remove (a resume needs it), never the retries'.
        assert [e.resource for e in catalog.resources()] == [staging]
    assert events == ["node2:unmount:export-abc", "node1:clearsnapshot:b1"]


DRILL_CLONE = Resource(
    type=ResourceType.CLONE,
    cluster="c1",
    run_id="dr-1",
    run_kind="drill",
    reason="clone of data1 made by drill dr-1 of backup b1 for node2",
    array="array1",
    name_hint="dr_1_node2",
    mount_purpose="dr-1-node2",
    drill_host=True,
)


def test_a_drill_clone_is_unmounted_on_the_drill_host_before_the_array_deletes_it(
    tmp_path: Path,
) -> None:
    events: Events = []
    array = FakeArray(events, [Volume("data1_dr_1_node2", "vol-9")])
    with Catalog(tmp_path / "catalog.db") as catalog:
        entry = catalog.add_resource(DRILL_CLONE)
        catalog.resource_made(entry.id, "data1_dr_1_node2", "vol-9")
        # No drill host configured: kept, never deleted while it may be mounted.
        assert retry(catalog, array, {}) == 1
        assert "has no drill host configured" in catalog.resources()[0].last_error
        # The host does not answer: kept too.
        down = FakeDrillHost(events, fail=Conflict("drill host unreachable"))
        assert retry(catalog, array, {}, host=down) == 1
        assert "did not confirm it is unmounted" in catalog.resources()[0].last_error
        assert not [e for e in events if e.startswith("array1:")]
        events.clear()
        # It answers: the drill stopped, the purpose unmounted, then the clone deleted.
        assert retry(catalog, array, {}, host=FakeDrillHost(events)) == 0
    assert events == [
        "host:stop:dr-1-node2",
        "host:unmount:dr-1-node2",
        "array1:delete:data1_dr_1_node2",
    ]


def test_a_drill_the_host_no_longer_knows_is_unmounted_and_deleted(tmp_path: Path) -> None:
    events: Events = []
    array = FakeArray(events, [Volume("data1_dr_1_node2", "vol-9")])
    gone = AgentError("drill host: StopDrill: NOT_FOUND: no drill dr-1-node2", code="NOT_FOUND")

    class Host(FakeDrillHost):
        async def unmount_clones(self, purpose_id: str) -> Sequence[str]:
            self.events.append(f"host:unmount:{purpose_id}")
            return []

    with Catalog(tmp_path / "catalog.db") as catalog:
        entry = catalog.add_resource(DRILL_CLONE)
        catalog.resource_made(entry.id, "data1_dr_1_node2", "vol-9")
        assert retry(catalog, array, {}, host=Host(events, fail=gone)) == 0
    assert events[-1] == "array1:delete:data1_dr_1_node2"


def test_a_snapshot_entry_is_never_undone_as_a_clone(tmp_path: Path) -> None:
    events: Events = []
    array = FakeArray(events, [Volume("b1", "vol-1")])
    with Catalog(tmp_path / "catalog.db") as catalog:
        catalog.add_resource(
            Resource(
                type=ResourceType.SNAPSHOT,
                cluster="c1",
                run_id="b1",
                run_kind="backup",
                reason="array snapshot of backup b1",
                array="array1",
                name="b1",
            )
        )
        assert retry(catalog, array, {}) == 1
        assert "does not undo snapshot entries" in catalog.resources()[0].last_error
    assert events == [] and [v.name for v in array.volumes] == ["b1"]
