"""Catalog migration 13: what an older ringsnap left as pending cleanups with an encoded name moves
to the resource ledger, typed, keeping who made it, why, when, its attempts and its last error;
array snapshots stay pending cleanups (until migration 14 makes them ledger entries too:
test_snapshot_migration); a row no ringsnap wrote stays where it is, refused with what to do. The migrated entries are then undone by the ledger's one retry path (unmounted on the
node or the drill host that mounted them, then deleted)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.catalog import schema as catalog_schema
from ringsnap.coordinator.catalog.codec import encode_ref
from ringsnap.coordinator.runs.ledger import Ledger, LedgerRetry
from ringsnap.coordinator.runs.resources import Resource, ResourceType
from ringsnap.plugins.types import Volume
from tests.unit.runs.test_ledger import Events, FakeArray, FakeDrillHost, FakeNode

from .conftest import node, ref_for

BACKUP = "rs-20261124-030000-abcd"


def _clone_row(fields: dict[str, str]) -> str:
    return "clone:" + json.dumps(fields, separators=(",", ":"), sort_keys=True)


EXPORT_CLONE = _clone_row(
    {"name": "data1_ex_1", "id": "vol-1", "cluster": "c1", "purpose": "ex-1", "node": "node2"}
)
DRILL_CLONE = _clone_row({"name": "data1_dr_1", "id": "vol-2", "cluster": "c1", "purpose": "dr-1"})
UNREADABLE = "clone:{not json"


def _older_catalog(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A catalog at version 12 holding what an older ringsnap wrote."""
    monkeypatch.setattr(catalog_schema, "MIGRATIONS", catalog_schema.MIGRATIONS[:12])
    snapshot = ref_for(BACKUP, "array1", [node("node1", "array1")])
    with Catalog(path) as catalog:
        assert catalog.schema_version == 12
        rows = [
            ("array1", BACKUP, encode_ref(snapshot), "backup failed: x", "", 0),
            ("array2", BACKUP, None, "interrupted", "", 0),
            ("native:c1/node1", BACKUP, None, "deleted", "node1 unreachable", 1),
            ("array1", EXPORT_CLONE, None, "export clone", "", 0),
            ("array1", DRILL_CLONE, None, "drill clone", "", 0),
            ("array1", UNREADABLE, None, "by hand", "", 0),
        ]
        with catalog._tx(write=True) as conn:
            conn.executemany(
                "INSERT INTO pending_cleanups (backup_id, array, snapshot_name, ref, reason,"
                " created_us, last_error, attempts) VALUES (?, ?, ?, ?, ?, 1, ?, ?)",
                [(BACKUP, *row) for row in rows],
            )
    monkeypatch.undo()


def test_encoded_cleanups_move_to_the_ledger_typed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "catalog.db"
    _older_catalog(path, monkeypatch)

    with Catalog(path) as catalog:
        assert catalog.schema_version == len(catalog_schema.MIGRATIONS)
        left = catalog.pending_cleanups()
        assert [(c.array, c.name, c.ref is not None) for c in left] == [
            ("array1", BACKUP, True),
            ("array2", BACKUP, False),
            ("array1", UNREADABLE, False),
        ]
        # Migration 14 made the array snapshots ledger entries too (test_snapshot_migration).
        entries = [
            e for e in catalog.resources(BACKUP) if e.resource.type is not ResourceType.SNAPSHOT
        ]

    by_type = {(e.resource.type, e.resource.name): e for e in entries}
    assert len(entries) == 3
    tag = by_type[(ResourceType.NATIVE_TAG, BACKUP)]
    assert tag.resource == Resource(
        type=ResourceType.NATIVE_TAG,
        cluster="c1",
        run_id=BACKUP,
        run_kind="backup",
        reason="deleted",
        name=BACKUP,
        node="node1",
    )
    assert (tag.attempts, tag.last_error) == (1, "node1 unreachable")
    export = by_type[(ResourceType.CLONE, "data1_ex_1")].resource
    assert (export.array, export.volume_id, export.cluster, export.node) == (
        "array1",
        "vol-1",
        "c1",
        "node2",
    )
    assert (export.mount_purpose, export.drill_host, export.reason) == (
        "ex-1",
        False,
        "export clone",
    )
    drill = by_type[(ResourceType.CLONE, "data1_dr_1")].resource
    assert (drill.node, drill.mount_purpose, drill.drill_host, drill.run_kind) == (
        "",
        "dr-1",
        True,
        "drill",
    )


def test_the_moved_entries_are_undone_by_the_ledgers_one_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "catalog.db"
    _older_catalog(path, monkeypatch)
    events: Events = []
    array = FakeArray(events, [Volume("data1_ex_1", "vol-1"), Volume("data1_dr_1", "vol-2")])
    nodes = {n: FakeNode(n, events) for n in ("node1", "node2")}
    with Catalog(path) as catalog:
        retry = LedgerRetry(
            Ledger(catalog),
            {"array1": array},
            node_agent=lambda cluster, name: nodes.get(name),
            tag_agent=lambda cluster, name: nodes.get(name),
            drill_host=lambda cluster: FakeDrillHost(events),
            held=lambda cluster: None,
            now=lambda: datetime.now(UTC) + timedelta(hours=1),
        )
        moved = [e for e in catalog.resources() if e.resource.type is not ResourceType.SNAPSHOT]
        # What is left: the three array snapshots (this retry deletes none; see
        # test_snapshot_migration).
        assert asyncio.run(retry.run(moved)) == 3
    assert events == [
        f"node1:clearsnapshot:{BACKUP}",
        "node2:unmount:ex-1",
        "array1:delete:data1_ex_1",
        "host:stop:dr-1",
        "host:unmount:dr-1",
        "array1:delete:data1_dr_1",
    ]
