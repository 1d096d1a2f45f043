"""After a clone-mode restore the catalog knows each node's disks are the clones: the next backup
snapshots the clones (saying so), records them, and refuses clearly when the config names a volume
no restore ever attached there."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from ringsnap.coordinator.backup import BackupRefused, BackupSettings, BackupWorkflow
from ringsnap.coordinator.backup.followed import followed_volumes, with_followed
from ringsnap.coordinator.backup.nodes import recorded_node
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.config import NodeSection, VolumeSection
from ringsnap.coordinator.model import (
    RestoreMode,
    RestoreNode,
    RestoreRecord,
    RestoreStep,
    RestoreVolume,
    VolumeRole,
)
from ringsnap.plugins.types import Volume
from tests.support.fakes import FakeAgent, FakeArray, node_targets, volumes_of

T0 = datetime(2026, 11, 29, 8, 0, tzinfo=UTC)


def _restore(
    restore_id: str,
    minutes: int,
    attached: dict[str, str],
    *,
    step: RestoreStep = RestoreStep.VERIFIED,
    cluster: str = "c",
    node: str = "n2",
) -> RestoreRecord:
    """A restore of `node`'s data volume: `attached` maps the backup's volume to what it attached."""
    ((volume, attached_volume),) = attached.items()
    return RestoreRecord(
        id=restore_id,
        cluster=cluster,
        backup_id="rs-1",
        mode=RestoreMode.CLONE if volume != attached_volume else RestoreMode.REVERT,
        nodes=(
            RestoreNode(
                name=node,
                step=step,
                volumes=(
                    RestoreVolume(
                        array="a1",
                        volume=volume,
                        role=VolumeRole.DATA,
                        attached_volume=attached_volume,
                    ),
                ),
            ),
        ),
        whole_ring=False,
        requested_by="test",
        started_at=T0 + timedelta(minutes=minutes),
        arrays_done=(("a1", "done"),),
    )


def test_the_newest_attach_is_the_disk_and_every_earlier_one_is_followed() -> None:
    restores = [
        _restore("r3", 30, {"n2-data": "n2-data"}),  # a revert puts the original back
        _restore("r1", 10, {"n2-data": "n2-data_r1"}),  # a clone restore
        _restore("r2", 20, {"n2-data_r1": "n2-data_r2"}),  # a clone of the clone's backup
        _restore("r4", 40, {"n2-data": "n2-data_r4"}, step=RestoreStep.RESTORED),  # not attached
        _restore("r5", 50, {"n2-data": "n2-data_r5"}, cluster="other"),
    ]
    (followed,) = followed_volumes("c", restores)["n2"]
    assert (followed.volume, followed.restore_id) == ("n2-data", "r3")
    assert followed.earlier == {"n2-data_r1", "n2-data_r2"}
    (clone,) = followed_volumes("c", restores[1:3])["n2"]
    assert (clone.volume, clone.earlier) == ("n2-data_r2", frozenset({"n2-data", "n2-data_r1"}))


def _cluster(
    events: list[str], restores: list[RestoreRecord]
) -> tuple[BackupWorkflow, list[FakeAgent], FakeArray]:
    """Three nodes; node n2's data disk is the clone `n2-data_r1` (its agent reports the clone)."""
    agents = [FakeAgent(f"n{i}", events) for i in range(1, 4)]
    clone = Volume("n2-data_r1", "id-clone", 1 << 30, "wwn-clone")
    volumes = [*volumes_of(a.node for a in agents), clone]
    array = FakeArray("a1", volumes, events=events, agents=agents)
    data, log = agents[1].filesystems
    agents[1].filesystems = (dataclasses.replace(data, wwn=clone.wwn), log)
    targets = with_followed(node_targets(agents), followed_volumes("c", restores))
    return BackupWorkflow("c", targets, {"a1": array}, None), agents, array


def test_after_a_clone_restore_the_backup_snapshots_the_clone_and_says_so() -> None:
    events: list[str] = []
    workflow, _, _ = _cluster(events, [_restore("r1", 10, {"n2-data": "n2-data_r1"})])
    run = asyncio.run(workflow.run(BackupSettings(), trigger="test"))
    (ref,) = run.snapshots
    members = {m.volume.name for m in ref.members}
    assert "n2-data_r1" in members and "n2-data" not in members
    assert [v.name for v in run.nodes["n2"].volumes] == ["n2-data_r1", "n2-cl"]
    (warning,) = run.warnings
    assert "node n2: the data volume snapshotted is a1:n2-data_r1" in warning
    assert "restore r1 attached in place of the configured n2-data" in warning
    # Recorded under the clone's name, so that a restore of this backup reverts the clone.
    section = NodeSection(
        name="n2",
        agent="127.0.0.1:7000",
        volumes=[
            VolumeSection(array="a1", volume="n2-data", role=VolumeRole.DATA),
            VolumeSection(array="a1", volume="n2-cl", role=VolumeRole.COMMITLOG),
        ],
    )
    recorded = recorded_node(section, run.nodes["n2"])
    assert [(v.volume, v.wwn) for v in recorded.volumes] == [
        ("n2-data_r1", "wwn-clone"),
        ("n2-cl", "wwn-n2-cl"),
    ]


def test_without_the_catalog_the_same_backup_is_refused() -> None:
    """Today's behaviour without the restores' records: the originals are not the disk."""
    workflow, _, _ = _cluster([], [])
    with pytest.raises(BackupRefused, match="a1:n2-data_r1"):
        asyncio.run(workflow.run(BackupSettings(), trigger="test"))


def test_a_config_naming_a_volume_no_restore_attached_is_refused_naming_the_catalogs() -> None:
    events: list[str] = []
    workflow, _, array = _cluster(events, [_restore("r1", 10, {"n2-data": "n2-data_r1"})])
    array.volumes.append(Volume("n2-other", "id-other", 1 << 30, "wwn-other"))
    targets = list(workflow.nodes)
    targets[1] = dataclasses.replace(
        targets[1],
        volumes=(
            dataclasses.replace(targets[1].volumes[0], volume="n2-other"),
            targets[1].volumes[1],
        ),
    )
    workflow.nodes = targets
    with pytest.raises(BackupRefused) as refused:
        asyncio.run(workflow.run(BackupSettings(), trigger="test"))
    message = str(refused.value)
    assert "volume a1:n2-other (host id wwn-other)" in message
    assert "the catalog has a1:n2-data_r1 as node n2's data volume since restore r1" in message
    assert events == []


def test_a_disk_moved_back_by_hand_to_the_configured_volume_is_snapshotted_as_configured() -> None:
    events: list[str] = []
    workflow, agents, _ = _cluster(events, [_restore("r1", 10, {"n2-data": "n2-data_r1"})])
    data, log = agents[1].filesystems
    agents[1].filesystems = (dataclasses.replace(data, wwn="wwn-n2-data"), log)
    run = asyncio.run(workflow.run(BackupSettings(), trigger="test"))
    assert [v.name for v in run.nodes["n2"].volumes] == ["n2-data", "n2-cl"]
    assert run.warnings == []


def test_an_array_without_san_ids_follows_the_catalog() -> None:
    """LVM: nothing to compare with, so the catalog's word is the only one."""
    workflow, _, array = _cluster([], [_restore("r1", 10, {"n2-data": "n2-data_r1"})])
    array.identifies_volumes = False
    run = asyncio.run(workflow.run(BackupSettings(), trigger="test"))
    assert [v.name for v in run.nodes["n2"].volumes] == ["n2-data_r1", "n2-cl"]


def test_the_catalog_lists_a_clusters_array_restores_oldest_first(tmp_path: Path) -> None:
    with Catalog(tmp_path / "catalog.db") as catalog:
        catalog.save_restore(_restore("r2", 20, {"n2-data_r1": "n2-data_r2"}))
        catalog.save_restore(_restore("r1", 10, {"n2-data": "n2-data_r1"}))
        catalog.save_restore(_restore("r9", 5, {"n2-data": "x"}, cluster="other"))
        native = dataclasses.replace(_restore("r3", 30, {"n2-data": "y"}), arrays_done=())
        catalog.save_restore(native)
        assert [r.id for r in catalog.array_restores("c")] == ["r1", "r2"]
