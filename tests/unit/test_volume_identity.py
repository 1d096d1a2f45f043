"""Backups refuse, before any flush or freeze, volumes that are not the disks under Cassandra."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from ringsnap.coordinator.backup import BackupRefused, BackupSettings, BackupWorkflow
from ringsnap.coordinator.model import VolumeRole
from ringsnap.coordinator.ports import FilesystemFacts
from ringsnap.coordinator.volume_identity import ExpectedVolume, mismatches
from ringsnap.plugins.types import Volume
from tests.support.fakes import FakeAgent, FakeArray, node_targets, volumes_of

DATA = FilesystemFacts(
    "/mnt/data",
    "/dev/sdb1",
    "ext4",
    "data",
    wwn="naa.600a098038303053453f463045727a30",
    cassandra_directories=("/mnt/data/cassandra",),
)
LOG = FilesystemFacts(
    "/mnt/log",
    "/dev/dm-3",
    "xfs",
    "commitlog",
    wwn="3600a098038303053453f463045727a31",
    cassandra_directories=("/mnt/log/commitlog",),
)
KNOWN = {
    ("fas1", "n1_data"): ("600a098038303053453f463045727a30",),
    ("fas1", "n1_log"): ("600a098038303053453f463045727a31",),
}


def test_matching_volumes_pass_in_any_spelling() -> None:
    expected = [
        ExpectedVolume("fas1", "n1_data", VolumeRole.DATA, KNOWN[("fas1", "n1_data")]),
        ExpectedVolume(
            "fas1", "n1_log", VolumeRole.COMMITLOG, ("wwn-0x600A098038303053453F463045727A31",)
        ),
    ]
    assert mismatches("n1", [DATA, LOG], expected, known=KNOWN, fix="FIX") == []


def test_swapped_volumes_name_node_directory_both_ids_the_real_volume_and_the_fix() -> None:
    expected = [
        ExpectedVolume("fas1", "n1_log", VolumeRole.DATA, KNOWN[("fas1", "n1_log")]),
        ExpectedVolume("fas1", "n1_data", VolumeRole.COMMITLOG, KNOWN[("fas1", "n1_data")]),
    ]
    data, log = mismatches("n1", [DATA, LOG], expected, known=KNOWN, fix="edit X")
    assert data.startswith("node n1: the data directory /mnt/data/cassandra (on /dev/sdb1")
    assert "naa.600a098038303053453f463045727a30 (array volume fas1:n1_data)" in data
    assert "fas1:n1_log (host id 600a098038303053453f463045727a31)" in data
    assert data.endswith("; edit X")
    assert "commitlog directory /mnt/log/commitlog" in log
    assert "3600a098038303053453f463045727a31 (array volume fas1:n1_log)" in log


def test_a_local_disk_under_an_array_volume_is_refused_saying_so() -> None:
    local = dataclasses.replace(DATA, wwn="", identity_source="")
    expected = [ExpectedVolume("fas1", "n1_data", VolumeRole.DATA, KNOWN[("fas1", "n1_data")])]
    (problem,) = mismatches("n1", [local], expected, known=KNOWN, fix="F")
    assert "no WWN or NGUID, a local disk as far as the agent can tell" in problem
    assert "[volumes] by_id_dir" in problem and "native snapshots" in problem


def test_a_volume_the_array_tells_no_id_for_is_refused() -> None:
    expected = [ExpectedVolume("fas1", "n1_data", VolumeRole.DATA, ())]
    (problem,) = mismatches("n1", [DATA], expected, fix="F")
    assert "array fas1 tells no host id for volume n1_data" in problem


def test_an_nvme_namespace_matches_by_nguid() -> None:
    nvme = dataclasses.replace(DATA, wwn="", nguid="003b7b308d98f94224a9375e00018816")
    expected = [
        ExpectedVolume(
            "fa",
            "v",
            VolumeRole.DATA,
            ("624a93703b7b308d98f9425e00018816", "003b7b308d98f94224a9375e00018816"),
        )
    ]
    assert mismatches("n1", [nvme], expected, fix="F") == []


def _cluster(events: list[str]) -> tuple[BackupWorkflow, list[FakeAgent], FakeArray]:
    agents = [FakeAgent(f"n{i}", events) for i in range(1, 4)]
    array = FakeArray("a1", volumes_of(a.node for a in agents), events=events, agents=agents)
    return BackupWorkflow("c", node_targets(agents), {"a1": array}, None), agents, array


def test_a_backup_of_swapped_volumes_is_refused_before_any_flush_or_freeze() -> None:
    events: list[str] = []
    workflow, agents, _ = _cluster(events)
    data, log = agents[1].filesystems
    agents[1].filesystems = (
        dataclasses.replace(data, wwn=log.wwn),
        dataclasses.replace(log, wwn=data.wwn),
    )
    with pytest.raises(BackupRefused) as refused:
        asyncio.run(workflow.run(BackupSettings(), trigger="test"))
    message = str(refused.value)
    assert "node n2: the data directory /data/data" in message
    assert "device wwn-n2-cl (array volume a1:n2-cl)" in message
    assert "volume a1:n2-data (host id wwn-n2-data)" in message
    assert 'name = "n2"' in message and "node n1" not in message and "node n3" not in message
    assert events == []  # nothing flushed, frozen or snapshotted


def test_a_driver_that_identifies_no_volume_is_not_compared() -> None:
    """LVM: its logical volumes are on the node; nothing to compare, the backup runs."""
    events: list[str] = []
    workflow, agents, array = _cluster(events)
    array.identifies_volumes = False
    agents[0].filesystems = ()
    run = asyncio.run(workflow.run(BackupSettings(), trigger="test"))
    assert len(run.snapshots) == 1


def test_the_host_id_an_ontap_listing_lacks_is_recorded_with_the_backup() -> None:
    events: list[str] = []
    agents = [FakeAgent("n1", events)]
    bare = [Volume(v.name, v.id, v.size_bytes) for v in volumes_of(["n1"])]

    class NoWwnInListing(FakeArray):
        async def host_identities(self, volumes: object) -> dict[str, tuple[str, ...]]:
            return {v.name: (f"wwn-{v.name}",) for v in bare}

    array = NoWwnInListing("a1", bare, events=events, agents=agents)
    workflow = BackupWorkflow("c", node_targets(agents), {"a1": array}, None)
    run = asyncio.run(workflow.run(BackupSettings(), trigger="test"))
    assert [v.wwn for v in run.nodes["n1"].volumes] == ["wwn-n1-data", "wwn-n1-cl"]


# -- restores ----------------------------------------------------------------------------------------


def test_a_revert_of_a_backup_recorded_with_swapped_volumes_is_refused_before_any_stop() -> None:
    """The issue's backup: node1's volumes recorded under each other's role. Reverting it would put
    the commit log's disk under the data directory; refused in the plan, naming both ids."""
    from ringsnap.coordinator.restore.plan import RestoreRequest
    from tests.support.restore_world import Rig, restore_backup

    good = restore_backup()
    nodes = []
    for node in good.nodes:
        data, log = node.volumes
        swapped_volumes = (
            dataclasses.replace(data, role=log.role),
            dataclasses.replace(log, role=data.role),
        )
        nodes.append(
            dataclasses.replace(node, volumes=swapped_volumes) if node.name == "node1" else node
        )
    swapped = dataclasses.replace(good, nodes=tuple(nodes))
    rig = Rig()
    plan = rig.plan(RestoreRequest("rs-1"), swapped)
    assert len(plan.refusals) == 2, plan.refusals
    data_line = next(r for r in plan.refusals if "the data directory" in r)
    assert data_line.startswith("node node1: the data directory /node1/data")
    assert "device wwn-node1-data (array volume array1:node1-data)" in data_line
    assert "array1:node1-log (host id wwn-node1-log)" in data_line
    assert "named the wrong volumes" in data_line
    assert not any(e.endswith(":stop") for e in rig.events)


def test_a_revert_onto_the_clones_of_a_clone_restore_warns_and_puts_the_originals_back() -> None:
    from ringsnap.coordinator.model import RestoreMode
    from ringsnap.coordinator.restore.plan import RestoreRequest
    from tests.support.restore_world import Rig, host_id

    rig = Rig()
    rig.agents["node1"].wwns["data"] = host_id("node1-data_rr-0")  # the clone's
    plan = rig.plan(RestoreRequest("rs-1"))
    assert not plan.refused, plan.refusals
    (warning,) = [w for w in plan.warnings if "wwn-node1-data_rr-0" in w]
    assert warning.startswith("node node1: the data directory /node1/data")
    assert "puts the backup's volume back in its place" in warning
    assert not rig.plan(RestoreRequest("rs-1", mode=RestoreMode.CLONE)).refused


def test_a_revert_onto_a_local_disk_is_refused_and_lvm_is_not_compared() -> None:
    from ringsnap.coordinator.restore.plan import RestoreRequest
    from tests.support.restore_world import Rig

    rig = Rig()
    assert not rig.plan(RestoreRequest("rs-1")).refused
    rig.agents["node1"].wwns["data"] = ""
    (refusal,) = rig.plan(RestoreRequest("rs-1")).refusals
    assert "no WWN or NGUID, a local disk" in refusal
    rig.array.identifies_volumes = False
    assert not rig.plan(RestoreRequest("rs-1")).refused
