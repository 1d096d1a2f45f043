"""Fixtures and builders of the catalog tests: a catalog on a real SQLite file, nodes, snapshot
references and manifests the way the backup workflow records them."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.model import (
    BackupNode,
    NodeVerdict,
    NodeVolume,
    PhaseTiming,
    QuiesceMode,
    RestoreMode,
    RestoreNode,
    RestoreRecord,
    RestoreState,
    RestoreStep,
    RestoreVolume,
    VolumeRole,
)
from ringsnap.coordinator.ports import SSTable, SSTableComponent
from ringsnap.plugins.types import SnapshotRef, Volume, VolumeSnapshot

T0 = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)


@pytest.fixture
def catalog(tmp_path: Path) -> Iterator[Catalog]:
    with Catalog(tmp_path / "state" / "catalog.db") as opened:
        yield opened


def node(name: str, *arrays: str, excluded: str = "") -> BackupNode:
    arrays = arrays or ("a1",)
    return BackupNode(
        name=name,
        host_id=f"host-{name}",
        canary_id=f"canary-{name}",
        excluded_reason=excluded,
        volumes=tuple(
            NodeVolume(
                array=array,
                volume=f"{name}-{array}-{role.value}",
                role=role,
                volume_id=f"id-{name}-{array}-{role.value}",
            )
            for array in arrays
            for role in (VolumeRole.DATA, VolumeRole.COMMITLOG)
        ),
    )


def ref_for(backup_id: str, array: str, nodes: list[BackupNode]) -> SnapshotRef:
    return SnapshotRef(
        array=array,
        driver="ontap",
        group=f"cg-{backup_id}",
        snapshot_id=f"snap-{array}-{backup_id}",
        snapshot_name=backup_id,
        created_at=T0 + timedelta(seconds=5),
        members=tuple(
            VolumeSnapshot(
                volume=Volume(name=v.volume, id=v.volume_id, size_bytes=1 << 30, wwn="600a0b80"),
                snapshot_id=f"s-{v.volume}",
                snapshot_name=backup_id,
            )
            for n in nodes
            for v in n.volumes
            if v.array == array
        ),
        attributes=(("svm", "svm1"), ("cg_uuid", "1234")),
    )


def sstables(count: int, keyspace: str = "ks") -> list[SSTable]:
    out = []
    for i in range(count):
        directory = f"{keyspace}/tbl-5a1c3e{i % 3}"
        out.append(
            SSTable(
                data_directory="/var/lib/cassandra/data",
                keyspace=keyspace,
                table="tbl",
                table_directory=directory.split("/")[1],
                generation=str(i + 1),
                format="big",
                version="nb",
                components=tuple(
                    SSTableComponent(name, f"{directory}/nb-{i + 1}-big-{name}", 100 + i)
                    for name in ("Data.db", "Index.db", "TOC.txt")
                ),
                data_digest_crc32=str(1000 + i),
                complete=i % 5 != 0,
                problem="" if i % 5 else "TOC.txt lists Summary.db, which is missing",
            )
        )
    return out


def begin(catalog: Catalog, backup_id: str, nodes: list[BackupNode], **kwargs: object) -> None:
    catalog.begin_backup(
        backup_id=backup_id,
        cluster=str(kwargs.pop("cluster", "c1")),
        quiesce_mode=QuiesceMode.FREEZE,
        trigger=str(kwargs.pop("trigger", "schedule:hourly")),
        policy=str(kwargs.pop("policy", "hourly")),
        started_at=kwargs.pop("started_at", T0),  # type: ignore[arg-type]
        nodes=nodes,
    )
    assert not kwargs


def finish(catalog: Catalog, backup_id: str, nodes: list[BackupNode]) -> None:
    """Record everything a complete backup needs, then complete it."""
    included = [n for n in nodes if n.included]
    for array in sorted({v.array for n in included for v in n.volumes}):
        catalog.record_snapshot(backup_id, ref_for(backup_id, array, included))
    for n in included:
        catalog.record_manifest(backup_id, n.name, sstables(3))
    catalog.complete_backup(backup_id, finished_at=T0 + timedelta(minutes=1))


def fill(catalog: Catalog, count: int) -> list[str]:
    """`count` finished backups over two clusters, with several sharing a start time."""
    ids = []
    for i in range(count):
        backup_id = f"rs-{i:04d}"
        cluster = "c1" if i % 3 else "c2"
        begin(
            catalog, backup_id, [], cluster=cluster, started_at=T0 + (i // 4) * timedelta(hours=1)
        )
        catalog.fail_backup(backup_id, "x") if i % 7 == 0 else _complete_empty(catalog, backup_id)
        ids.append(backup_id)
    return ids


def _complete_empty(catalog: Catalog, backup_id: str) -> None:
    # Minimal complete backup: one node, one array, everything recorded.
    finish_nodes = [node("n1")]
    catalog.record_nodes(backup_id, finish_nodes)
    catalog.record_snapshot(backup_id, ref_for(backup_id, "a1", finish_nodes))
    catalog.record_manifest(backup_id, "n1", [])
    catalog.complete_backup(backup_id)


def page_through(catalog: Catalog, **filters: object) -> list[str]:
    seen: list[str] = []
    token = ""
    while True:
        page = catalog.list_backups(page_size=7, page_token=token, **filters)  # type: ignore[arg-type]
        assert len(page.backups) <= 7
        seen.extend(b.id for b in page.backups)
        token = page.next_page_token
        if not token:
            return seen


def restore_node(name: str, **fields: Any) -> RestoreNode:
    """A node well into its restore, with every field set to something other than its default."""
    values: dict[str, Any] = {
        "name": name,
        "host_id": f"host-{name}",
        "volumes": (
            RestoreVolume(
                array="a1",
                volume=f"{name}-data",
                role=VolumeRole.DATA,
                mount_point="/var/lib/cassandra/data",
                attached_volume=f"{name}-data",
            ),
            RestoreVolume(array="a1", volume=f"{name}-cl", role=VolumeRole.COMMITLOG),
        ),
        "was_running": False,
        "backup_canary": f"canary-{name}",
        "pre_restore_canary": f"pre-{name}",
        "manifest_ok": True,
        "step": RestoreStep.STARTED,
        "step_seconds": (("stopped", 12.5), ("restored", 0.25)),
        "verdict": NodeVerdict.NOT_PROVEN,
        "proof": ("canary present", "manifest: 3 SSTables match"),
        "unproven": ("no pre-restore canary: the node was down",),
        "next_step": f"start Cassandra on {name} by hand",
    }
    values.update(fields)
    return RestoreNode(**values)


def restore_record(restore_id: str, backup_id: str = "rs-1", **fields: Any) -> RestoreRecord:
    values: dict[str, Any] = {
        "id": restore_id,
        "cluster": "c1",
        "backup_id": backup_id,
        "mode": RestoreMode.CLONE,
        "nodes": (restore_node("n1"), restore_node("n2", manifest_ok=None)),
        "whole_ring": True,
        "requested_by": "cli:alice",
        "started_at": T0 + timedelta(hours=2),
        "state": RestoreState.RUNNING,
        "error": "",
        "warnings": ("run nodetool repair on the ring",),
        "arrays_done": (("a1", "cloned:rr1"),),
        "clones": (("a1", "n1-data", "n1-data-rr1"), ("a1", "n2-data", "n2-data-rr1")),
        "timings": (PhaseTiming(phase="plan", seconds=0.5), PhaseTiming(phase="stop", seconds=9)),
    }
    values.update(fields)
    return RestoreRecord(**values)
