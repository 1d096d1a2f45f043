"""Catalog migration 14: every pending cleanup (a backup's array snapshot, by reference or by name)
becomes a typed 'snapshot' entry of the resource ledger, keeping its backup, cluster, reason,
attempts and last error, and the table goes; a mapping to the drill host carries the `drill_host`
flag instead of the node '@drill-host'. The moved snapshots are then deleted by the ledger's one
retry path, through each array's port; a name ringsnap never gives a snapshot is kept, saying what
to do."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.catalog import schema as catalog_schema
from ringsnap.coordinator.catalog.codec import encode_ref
from ringsnap.coordinator.runs.ledger import Ledger, LedgerRetry
from ringsnap.coordinator.runs.resources import LedgerEntry, ResourceType
from ringsnap.coordinator.runs.snapshot_undo import SnapshotUndo
from tests.support.fakes import FakeArray, snapshot_ref, volume

from .conftest import begin, node

UNREADABLE = "clone:{not json"
VOLUMES = [volume("n1", "data")]
REF_A = snapshot_ref("array1", "rs-a", VOLUMES)


def _older_catalog(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A catalog at version 13: pending cleanups, and a mapping to '@drill-host'."""
    monkeypatch.setattr(catalog_schema, "MIGRATIONS", catalog_schema.MIGRATIONS[:13])
    with Catalog(path) as catalog:
        assert catalog.schema_version == 13
        begin(catalog, "rs-a", [node("n1", "array1")], cluster="c1")
        catalog.fail_backup("rs-a", "x")  # (13 knows no snapshot entries: nothing moved here)
        ref = encode_ref(REF_A)
        with catalog._tx(write=True) as conn:
            conn.executemany(
                "INSERT INTO pending_cleanups (backup_id, array, snapshot_name, ref, reason,"
                " created_us, attempts, last_error) VALUES (?, ?, ?, ?, ?, 1, ?, ?)",
                [
                    ("rs-a", "array1", "rs-a", ref, "backup rs-a failed: x", 2, "HTTP 503"),
                    ("rs-gone", "array2", "rs-gone", None, "interrupted", 0, ""),
                    ("rs-b", "array1", UNREADABLE, None, "by hand", 0, ""),
                ],
            )
            conn.execute(
                "INSERT INTO resources (type, cluster, run_id, run_kind, reason, array, name,"
                " node, mount_purpose, created_us) VALUES ('mapping', 'c1', 'dr-1', 'drill',"
                " 'presented', 'array1', 'data1_dr_1', '@drill-host', 'dr-1', 1)"
            )
    monkeypatch.undo()


def _retry(
    catalog: Catalog, arrays: dict[str, FakeArray], now: datetime, entries: list[LedgerEntry]
) -> None:
    """The ledger's retry of `entries` at `now`, deleting snapshots through `arrays`."""
    retry = LedgerRetry(
        Ledger(catalog),
        arrays,
        node_agent=lambda cluster, name: None,
        tag_agent=lambda cluster, name: None,
        held=lambda cluster: None,
        now=lambda: now,
        snapshots=SnapshotUndo(arrays, lambda array: {v.name for v in VOLUMES}, lambda: now),
    )
    asyncio.run(retry.run(entries))


def test_pending_cleanups_become_typed_snapshot_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "catalog.db"
    _older_catalog(path, monkeypatch)
    with Catalog(path) as catalog:
        assert catalog.schema_version == len(catalog_schema.MIGRATIONS) >= 14
        tables = {r[0] for r in catalog._connection().execute("SELECT name FROM sqlite_master")}
        assert "pending_cleanups" not in tables
        entries = catalog.resources()
        assert [p.name for p in catalog.pending_cleanups()] == ["rs-a", "rs-gone", UNREADABLE]
    mapping, by_ref, by_name, unreadable = entries
    assert (mapping.resource.type, mapping.resource.node, mapping.resource.drill_host) == (
        ResourceType.MAPPING,
        "",
        True,
    )
    assert mapping.resource.mount_purpose == "dr-1"
    first = by_ref.resource
    assert (first.type, first.cluster, first.run_id, first.run_kind, first.array) == (
        ResourceType.SNAPSHOT,
        "c1",
        "rs-a",
        "backup",
        "array1",
    )
    assert first.ref == REF_A
    assert (first.reason, by_ref.attempts, by_ref.last_error) == (
        "backup rs-a failed: x",
        2,
        "HTTP 503",
    )
    # A deleted backup's cleanup: its cluster is no longer known.
    assert (by_name.resource.cluster, by_name.resource.ref, by_name.resource.array) == (
        "",
        None,
        "array2",
    )
    assert unreadable.resource.name == UNREADABLE


def test_the_moved_snapshots_are_deleted_through_their_arrays_ports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "catalog.db"
    _older_catalog(path, monkeypatch)
    events: list[str] = []
    arrays = {name: FakeArray(name, VOLUMES, events=events) for name in ("array1", "array2")}
    arrays["array1"].snapshots["rs-a"] = REF_A
    # The interrupted run's snapshot, which its process never heard of: found by its name.
    arrays["array2"].snapshots["rs-gone"] = snapshot_ref("array2", "rs-gone", VOLUMES)
    with Catalog(path) as catalog:
        snapshots = [e for e in catalog.resources() if e.resource.type is ResourceType.SNAPSHOT]
        _retry(catalog, arrays, datetime.now(UTC), snapshots)
        (left,) = catalog.pending_cleanups()
    assert events == ["delete rs-a", "delete rs-gone"]
    assert arrays["array1"].snapshots == {} and arrays["array2"].snapshots == {}
    assert left.name == UNREADABLE
    assert "ringsnap never names a snapshot so: delete it by hand" in left.last_error


def test_a_name_not_found_is_kept_within_its_grace_then_let_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "catalog.db"
    _older_catalog(path, monkeypatch)
    arrays = {"array2": FakeArray("array2", VOLUMES)}
    with Catalog(path) as catalog:
        (entry,) = [e for e in catalog.resources() if e.resource.array == "array2"]

        _retry(catalog, arrays, entry.created_at + timedelta(minutes=14), [entry])
        (kept,) = [e for e in catalog.resources() if e.id == entry.id]
        assert "not on the array yet" in kept.last_error
        _retry(catalog, arrays, entry.created_at + timedelta(minutes=16), [entry])
        assert [e for e in catalog.resources() if e.id == entry.id] == []
