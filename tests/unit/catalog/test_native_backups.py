"""Native backups in the catalog: their kind kept, complete with a manifest per included node (no
volumes, no arrays), and deleted into one ledger entry per node that holds the tag."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from ringsnap.coordinator.catalog import Catalog, IncompleteBackupError
from ringsnap.coordinator.catalog import schema as catalog_schema
from ringsnap.coordinator.model import (
    BackupNode,
    BackupState,
    QuiesceMode,
    SnapshotKind,
)
from ringsnap.coordinator.runs.resources import ResourceType

from .conftest import T0, sstables


def _begin_native(catalog: Catalog, backup_id: str, nodes: list[BackupNode]) -> None:
    catalog.begin_backup(
        backup_id=backup_id,
        cluster="c1",
        quiesce_mode=QuiesceMode.FLUSH_ONLY,
        trigger="test",
        started_at=T0,
        nodes=nodes,
        snapshot_kind=SnapshotKind.NATIVE,
    )


def _nodes() -> list[BackupNode]:
    return [
        BackupNode(name="n1", host_id="h1"),
        BackupNode(name="n2", host_id="h2"),
        BackupNode(name="n3", excluded_reason="agent unreachable"),
    ]


def test_a_native_backup_is_complete_with_a_manifest_per_included_node(catalog: Catalog) -> None:
    _begin_native(catalog, "rs-1", _nodes())
    catalog.record_manifest("rs-1", "n1", sstables(3))
    with pytest.raises(IncompleteBackupError) as refused:
        catalog.complete_backup("rs-1")
    assert refused.value.missing == ("node n2: no manifest",)
    catalog.record_manifest("rs-1", "n2", sstables(2))

    done = catalog.complete_backup("rs-1")

    assert done.state is BackupState.PARTIAL  # n3 is excluded, with its reason
    assert done.snapshot_kind is SnapshotKind.NATIVE
    assert done.snapshots == () and done.arrays == ()
    assert catalog.backup_summaries("c1")[0].snapshot_kind is SnapshotKind.NATIVE


def test_an_array_backup_still_needs_its_volumes_and_snapshots(catalog: Catalog) -> None:
    catalog.begin_backup(
        backup_id="rs-1", cluster="c1", quiesce_mode=QuiesceMode.FREEZE, trigger="t", nodes=_nodes()
    )
    catalog.record_manifest("rs-1", "n1", [])
    catalog.record_manifest("rs-1", "n2", [])
    with pytest.raises(IncompleteBackupError, match="node n1: no volumes"):
        catalog.complete_backup("rs-1")
    assert catalog.get_backup("rs-1").snapshot_kind is SnapshotKind.ARRAY


def test_deleting_a_native_backup_leaves_a_ledger_entry_per_node_that_holds_the_tag(
    catalog: Catalog,
) -> None:
    _begin_native(catalog, "rs-1", _nodes())
    for name in ("n1", "n2"):
        catalog.record_manifest("rs-1", name, sstables(1))
    catalog.complete_backup("rs-1")

    pending = catalog.delete_backup("rs-1", reason="retention (hourly): beyond all buckets")

    assert pending == [] and catalog.pending_cleanups() == []
    tags = catalog.resources("rs-1")
    assert [
        (e.resource.type, e.resource.cluster, e.resource.node, e.resource.name) for e in tags
    ] == [
        (ResourceType.NATIVE_TAG, "c1", "n1", "rs-1"),
        (ResourceType.NATIVE_TAG, "c1", "n2", "rs-1"),
    ]
    assert all("retention (hourly)" in e.resource.reason for e in tags)
    assert all(e.resource.array == "" for e in tags)


def test_a_catalog_of_version_3_migrates_its_backups_to_the_array_kind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "catalog.db"
    monkeypatch.setattr(catalog_schema, "MIGRATIONS", catalog_schema.MIGRATIONS[:3])
    with Catalog(path) as catalog:
        assert catalog.schema_version == 3
    raw = sqlite3.connect(path)
    with raw:
        raw.execute(
            "INSERT INTO backups (id, cluster, state, quiesce_mode, trigger, policy, started_us)"
            " VALUES ('rs-1', 'c1', 'running', 'freeze', 't', '', 0)"
        )
    raw.close()
    monkeypatch.undo()
    with Catalog(path) as catalog:
        assert catalog.schema_version == len(catalog_schema.MIGRATIONS)
        assert catalog.get_backup("rs-1").snapshot_kind is SnapshotKind.ARRAY
