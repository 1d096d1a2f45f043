"""Presentation in the coordinator (`coordinator.presentation`): each mapping is a ledger entry
before the array is asked, the clone reaches the agent with the identity the array gave,
unpresenting empties the ledger, failures keep the entry with the error, and the ledger's retry
unmounts, unmaps, and only then deletes the clone. Arrays and agents are fakes; the catalog is
real."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.clone_mounts import CloneToMount
from ringsnap.coordinator.model import RestoreNode, RestoreVolume, VolumeRole
from ringsnap.coordinator.ports import VolumeState
from ringsnap.coordinator.presentation import (
    DRILL_HOST_NODE,
    NoInitiators,
    Presenter,
    RunOf,
    host_of,
    present_restored_clones,
    presenting,
)
from ringsnap.coordinator.runs.ledger import Ledger, LedgerRetry
from ringsnap.coordinator.runs.resources import Resource, ResourceType
from ringsnap.errors import RingsnapError
from ringsnap.plugins.types import Capabilities, HostInitiators, Presentation, Volume

HOST = HostInitiators(iqns=("iqn.2026-11.net.x:node1",), array_host="node1")


class FakeArray:
    """Presents and unpresents; each call checks what the ledger holds at that moment."""

    def __init__(self, catalog: Catalog, events: list[str], *, refuse: str = "") -> None:
        self.catalog = catalog
        self.events = events
        self.refuse = refuse
        self.mapped: dict[str, str] = {}
        self.volumes = [Volume("c_data", "v-1"), Volume("c_log", "v-2"), Volume("data", "v-0")]

    def capabilities(self) -> Capabilities:
        return Capabilities(atomic_group_snapshot=True, present=True, clone=True)

    async def list_volumes(self) -> Sequence[Volume]:
        return list(self.volumes)

    async def present(
        self, volumes: Sequence[Volume], host: HostInitiators
    ) -> Sequence[Presentation]:
        found = []
        for volume in volumes:
            recorded = [
                e.resource.name
                for e in self.catalog.resources()
                if e.resource.type is ResourceType.MAPPING
            ]
            assert volume.name in recorded, "mapped before the ledger knew it"
            assert volume.id, "presented without its id"
            if self.refuse:
                raise RingsnapError(self.refuse)
            self.events.append(f"present:{volume.name}:{host.array_host}")
            self.mapped[volume.name] = host.array_host
            found.append(Presentation(volume, host.array_host, 1, f"600a0980{volume.id}"))
        return found

    async def unpresent(self, volumes: Sequence[Volume], host: HostInitiators) -> None:
        if self.refuse:
            raise RingsnapError(self.refuse)
        for volume in volumes:
            self.events.append(f"unpresent:{volume.name}:{host.array_host}")
            self.mapped.pop(volume.name, None)

    async def delete_clone(self, volume: Volume) -> None:
        assert volume.name not in self.mapped, "a clone deleted while still mapped"
        self.events.append(f"delete:{volume.name}")
        self.volumes = [v for v in self.volumes if v.name != volume.name]


async def _hosts(node: str) -> HostInitiators:
    return HOST


CLONES = [
    CloneToMount(role="data", array="array1", volume="c_data", source_mount_point="/d"),
    CloneToMount(role="commitlog", array="array1", volume="c_log", volume_id="v-2"),
]


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    opened = Catalog(tmp_path / "catalog.db")
    opened.__enter__()
    return opened


def _presenter(catalog: Catalog, array: FakeArray) -> Presenter:
    return Presenter({"array1": array}, catalog, RunOf("c1", "b-1", "export"), _hosts)


def test_present_records_each_mapping_first_and_gives_the_identity(catalog: Catalog) -> None:
    events: list[str] = []
    array = FakeArray(catalog, events)
    presented = asyncio.run(_presenter(catalog, array).present("node1", "exp-b-1", CLONES))
    assert [c.wwn for c in presented] == ["600a0980v-1", "600a0980v-2"]
    assert presented[0].source_mount_point == "/d"
    entries = catalog.resources()
    assert [(e.resource.type, e.resource.name, e.resource.volume_id) for e in entries] == [
        (ResourceType.MAPPING, "c_data", "v-1"),  # its id listed from the array
        (ResourceType.MAPPING, "c_log", "v-2"),
    ]
    assert {(e.resource.node, e.resource.mount_purpose, e.resource.host) for e in entries} == {
        ("node1", "exp-b-1", "node1")
    }
    # Asked again (a resumed run): the same entries, the array asked again (idempotent).
    asyncio.run(_presenter(catalog, array).present("node1", "exp-b-1", CLONES))
    assert len(catalog.resources()) == 2
    asyncio.run(_presenter(catalog, array).unpresent("node1", "exp-b-1"))
    assert catalog.resources() == []
    assert array.mapped == {}
    assert events[-2:] == ["unpresent:c_data:node1", "unpresent:c_log:node1"]


def test_a_refused_present_keeps_the_entry_with_the_error(catalog: Catalog) -> None:
    array = FakeArray(catalog, [], refuse="host object node1 not found")
    with pytest.raises(RingsnapError, match="did not present clone c_data to node node1"):
        asyncio.run(_presenter(catalog, array).present("node1", "exp-b-1", CLONES))
    (entry,) = catalog.resources()
    assert "host object node1 not found" in entry.last_error


def test_a_refused_unpresent_keeps_the_entries(catalog: Catalog) -> None:
    array = FakeArray(catalog, [])
    asyncio.run(_presenter(catalog, array).present("node1", "exp-b-1", CLONES))
    array.refuse = "array unreachable"
    with pytest.raises(RingsnapError, match="kept in the ledger"):
        asyncio.run(_presenter(catalog, array).unpresent("node1", "exp-b-1"))
    assert [e.last_error for e in catalog.resources()] == ["array unreachable"] * 2


def test_kept_mappings_leave_the_ledger_once_made(catalog: Catalog) -> None:
    """A clone-mode restore: the clones become the node's disks; no retry may unmap them."""
    array = FakeArray(catalog, [])
    asyncio.run(_presenter(catalog, array).present("node1", "r-1", CLONES, keep=True))
    assert catalog.resources() == []
    assert array.mapped == {"c_data": "node1", "c_log": "node1"}


def test_a_clone_restore_gives_each_mount_point_its_clones_identity(catalog: Catalog) -> None:
    """What AttachVolume.identity carries: by mount point, the identity the array gave each
    clone presented to the node's host, so that an agent with no attach hook finds it."""
    array = FakeArray(catalog, [])
    node = RestoreNode(
        name="node1",
        volumes=(
            RestoreVolume(
                array="array1",
                volume="data",
                role=VolumeRole.DATA,
                mount_point="/d",
                attached_volume="c_data",
            ),
            RestoreVolume(
                array="array1",
                volume="log",
                role=VolumeRole.COMMITLOG,
                mount_point="/l",
                attached_volume="c_log",
            ),
        ),
    )
    presenter = lambda restore_id: _presenter(catalog, array)  # noqa: E731
    identities = asyncio.run(present_restored_clones(presenter, "r-1", node))
    assert identities == {"/d": "600a0980v-1", "/l": "600a0980v-2"}
    assert array.mapped == {"c_data": "node1", "c_log": "node1"}

    # A revert attaches the node's own volume again: nothing presented, no identity to give.
    reverted = RestoreNode(
        name="node2",
        volumes=(
            RestoreVolume(
                array="array1",
                volume="data",
                role=VolumeRole.DATA,
                mount_point="/d",
                attached_volume="data",
            ),
        ),
    )
    assert asyncio.run(present_restored_clones(presenter, "r-2", reverted)) == {}
    assert asyncio.run(present_restored_clones(None, "r-1", node)) == {}
    assert "node2" not in array.mapped.values()


def test_a_driver_that_cannot_present_is_passed_over() -> None:
    class Lvm:
        def capabilities(self) -> Capabilities:
            return Capabilities(atomic_group_snapshot=True)

    assert presenting(Lvm()) is None


class _Agent:
    def __init__(self, **initiators: tuple[str, ...]) -> None:
        self.state = VolumeState(False, "stopped", (), **initiators)

    async def volume_state(self) -> VolumeState:
        return self.state


def test_the_host_is_the_agents_initiators_and_the_configured_host_object() -> None:
    host = asyncio.run(host_of(_Agent(wwpns=("10000090fa1b2c3d",)), "h-node1", "node node1"))
    assert host == HostInitiators(wwpns=("10000090fa1b2c3d",), array_host="h-node1")
    with pytest.raises(NoInitiators, match=r"node node1.*set array_host"):
        asyncio.run(host_of(_Agent(), None, "node node1"))


class _Node:
    def __init__(self, events: list[str]) -> None:
        self.events = events

    async def unmount_clones(self, purpose_id: str) -> Sequence[str]:
        self.events.append(f"unmount:{purpose_id}")
        return ["c_data"]

    async def clear_snapshot(self, tag: str) -> None:
        raise AssertionError("no tag here")


def test_the_retry_unmounts_then_unmaps_then_deletes(catalog: Catalog) -> None:
    """What a killed run leaves: a clone (made) and its mapping (made). The clone is recorded
    first, yet the retry undoes the mapping first: never a mapped clone deleted."""
    events: list[str] = []
    array = FakeArray(catalog, events)
    clone = catalog.add_resource(
        Resource(
            type=ResourceType.CLONE,
            cluster="c1",
            run_id="b-1",
            run_kind="export",
            reason="clone",
            array="array1",
            name_hint="rsx",
            node="node1",
            mount_purpose="exp-b-1",
        )
    )
    catalog.resource_made(clone.id, "c_data", "v-1")
    asyncio.run(_presenter(catalog, array).present("node1", "exp-b-1", CLONES[:1]))
    events.clear()
    retry = LedgerRetry(
        Ledger(catalog),
        {"array1": array},
        node_agent=lambda cluster, node: _Node(events),
        tag_agent=lambda cluster, node: None,
        held=lambda cluster: None,
        now=lambda: datetime.now(UTC),
    )
    assert asyncio.run(retry.run()) == 0
    assert events == [
        "unmount:exp-b-1",
        "unpresent:c_data:node1",
        "unmount:exp-b-1",
        "delete:c_data",
    ]


def test_a_clone_whose_mapping_is_not_undone_is_not_deleted(catalog: Catalog) -> None:
    events: list[str] = []
    array = FakeArray(catalog, events)
    clone = catalog.add_resource(
        Resource(ResourceType.CLONE, "c1", "b-1", "export", "clone", "array1", name="c_data")
    )
    asyncio.run(_presenter(catalog, array).present("node1", "exp-b-1", CLONES[:1]))
    array.refuse = "array unreachable"
    retry = LedgerRetry(
        Ledger(catalog),
        {"array1": array},
        node_agent=lambda cluster, node: _Node(events),
        tag_agent=lambda cluster, node: None,
        held=lambda cluster: None,
        now=lambda: datetime.now(UTC),
    )
    assert asyncio.run(retry.run()) == 2
    assert not any(e.startswith("delete") for e in events)
    left = {e.id: e.last_error for e in catalog.resources()}
    assert "unmapped first" in left[clone.id]


def test_a_drill_mapping_has_one_spelling_and_is_retried_on_the_drill_hosts_agent(
    catalog: Catalog,
) -> None:
    """A clone presented to the drill host is one ledger entry with the `drill_host` flag (no
    node); a killed drill's mapping is retried on the drill host's agent (its drill stopped,
    its purpose unmounted), never on a node's, then unmapped from the drill host's host."""
    events: list[str] = []
    array = FakeArray(catalog, events)
    hosts_asked: list[str] = []

    async def hosts(node: str) -> HostInitiators:
        hosts_asked.append(node)
        return HostInitiators(iqns=("iqn.2026-11.net.x:drill",), array_host="drillhost")

    presenter = Presenter({"array1": array}, catalog, RunOf("c1", "dr-1", "drill"), hosts)
    asyncio.run(presenter.present(DRILL_HOST_NODE, "dr-1-node2", CLONES[:1]))
    (entry,) = catalog.resources()
    assert (entry.resource.node, entry.resource.drill_host) == ("", True)
    assert "the drill host" in entry.resource.describe()
    events.clear()

    class DrillHost:
        async def stop_drill(self, purpose_id: str) -> None:
            events.append(f"host:stop:{purpose_id}")

        async def unmount_clones(self, purpose_id: str) -> Sequence[str]:
            events.append(f"host:unmount:{purpose_id}")
            return []

    def no_node(cluster: str, node: str) -> _Node:
        raise AssertionError(f"a drill-host mapping was retried on node {node!r}")

    retry = LedgerRetry(
        Ledger(catalog),
        {"array1": array},
        node_agent=no_node,
        tag_agent=lambda cluster, node: None,
        drill_host=lambda cluster: DrillHost() if cluster == "c1" else None,
        held=lambda cluster: None,
        now=lambda: datetime.now(UTC),
    )
    assert asyncio.run(retry.run()) == 0
    assert events == [
        "host:stop:dr-1-node2",
        "host:unmount:dr-1-node2",
        "unpresent:c_data:drillhost",
    ]
    # The presenter's own unpresent finds the entry by the drill host too.
    asyncio.run(presenter.present(DRILL_HOST_NODE, "dr-1-node2", CLONES[:1]))
    asyncio.run(presenter.unpresent(DRILL_HOST_NODE, "dr-1-node2"))
    assert catalog.resources() == []
