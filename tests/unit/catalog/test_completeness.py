"""The completeness rule on plain `Backup` values, without SQL: what keeps a backup from being
recorded as complete, and when it is partial."""

from __future__ import annotations

from dataclasses import replace

from ringsnap.coordinator.catalog.completeness import finished_state, missing_parts
from ringsnap.coordinator.model import (
    Backup,
    BackupNode,
    BackupState,
    NodeVolume,
    QuiesceMode,
    VolumeRole,
)
from ringsnap.plugins.types import SnapshotRef, Volume, VolumeSnapshot

from .conftest import T0, node, ref_for


def backup(nodes: list[BackupNode], snapshots: list[SnapshotRef]) -> Backup:
    return Backup(
        id="rs-1",
        cluster="c1",
        state=BackupState.RUNNING,
        quiesce_mode=QuiesceMode.FREEZE,
        trigger="test",
        policy="",
        started_at=T0,
        nodes=tuple(nodes),
        snapshots=tuple(snapshots),
    )


def test_nothing_is_missing_when_every_node_and_array_is_covered() -> None:
    nodes = [node("n1", "a1", "a2"), node("n2", "a1")]
    refs = [ref_for("rs-1", "a1", nodes), ref_for("rs-1", "a2", nodes)]
    complete = backup(nodes, refs)
    assert missing_parts(complete, {"n1", "n2"}) == []
    assert finished_state(complete) is BackupState.COMPLETE


def test_every_missing_part_is_named() -> None:
    nodes = [node("n1", "a1", "a2"), node("n2", "a1")]
    partial_ref = ref_for("rs-1", "a1", nodes[:1])  # lacks n2's volumes
    assert set(missing_parts(backup(nodes, [partial_ref]), {"n1"})) == {
        "node n2: no manifest",
        "node n2: volume n2-a1-data (data) is not in the snapshot of array a1",
        "node n2: volume n2-a1-commitlog (commitlog) is not in the snapshot of array a1",
        "array a2: no snapshot",
    }


def test_no_nodes_every_node_excluded_or_no_volumes_is_never_complete() -> None:
    assert missing_parts(backup([], []), set()) == ["no nodes recorded"]
    excluded = [node("n1", excluded="agent unreachable")]
    assert missing_parts(backup(excluded, []), set()) == [
        "every node is excluded, nothing was backed up"
    ]
    assert missing_parts(backup([BackupNode(name="n1")], []), {"n1"}) == ["node n1: no volumes"]


def test_excluded_nodes_need_nothing_and_make_the_backup_partial() -> None:
    nodes = [node("n1", "a1"), node("n2", "a2", excluded="agent unreachable: refused")]
    result = backup(nodes, [ref_for("rs-1", "a1", nodes)])
    assert missing_parts(result, {"n1"}) == []
    assert finished_state(result) is BackupState.PARTIAL


def test_a_volume_is_covered_by_its_name_or_by_its_array_id() -> None:
    volume = NodeVolume(array="a1", volume="n1-data", role=VolumeRole.DATA, volume_id="uuid-1")
    nodes = [BackupNode(name="n1", volumes=(volume,))]
    renamed = SnapshotRef(
        array="a1",
        driver="ontap",
        group="cg",
        snapshot_id="s",
        snapshot_name="rs-1",
        created_at=T0,
        members=(
            VolumeSnapshot(
                volume=Volume(name="renamed-on-the-array", id="uuid-1"),
                snapshot_id="s1",
                snapshot_name="rs-1",
            ),
        ),
    )
    assert missing_parts(backup(nodes, [renamed]), {"n1"}) == []
    unknown = replace(nodes[0], volumes=(replace(volume, volume_id=""),))
    assert missing_parts(backup([unknown], [renamed]), {"n1"}) == [
        "node n1: volume n1-data (data) is not in the snapshot of array a1"
    ]
