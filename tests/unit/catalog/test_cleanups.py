"""Backups' array snapshots in the resource ledger: recorded before the array is asked, joined by
what a failed run says is left (one entry per array and name, gaining the reference), counted and
retried, taken by a completed backup, gone once deleted."""

from __future__ import annotations

from datetime import timedelta

import pytest

from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.catalog.errors import CatalogError
from ringsnap.coordinator.model import CleanupRequest
from ringsnap.coordinator.runs.resources import ResourceType, array_snapshot, native_tag

from .conftest import T0, begin, finish, node, ref_for


def test_a_failed_runs_snapshots_join_the_entries_it_made_before_asking(catalog: Catalog) -> None:
    nodes = [node("n1", "a1", "a2")]
    begin(catalog, "rs-1", nodes)
    asked = catalog.add_resource(array_snapshot("c1", "a1", "rs-1", "asked a1"))
    assert [(p.array, p.name, p.ref) for p in catalog.pending_cleanups()] == [("a1", "rs-1", None)]
    ref = ref_for("rs-1", "a1", nodes)
    catalog.fail_backup(
        "rs-1",
        "array a2: snapshot failed",
        cleanups=[
            CleanupRequest(array="a1", reason="delete failed: HTTP 503", ref=ref),
            CleanupRequest(array="a2", reason="call failed", snapshot_name="rs-1"),
        ],
    )
    first, second = catalog.pending_cleanups()
    # One entry per array and name: the one recorded before asking gained the reference.
    assert (first.id, first.ref, first.reason, first.backup_id) == (
        asked.id,
        ref,
        "asked a1",
        "rs-1",
    )
    assert (second.array, second.name, second.ref) == ("a2", "rs-1", None)
    [entry] = [e for e in catalog.resources("rs-1") if e.id == second.id]
    assert (entry.resource.type, entry.resource.cluster) == (ResourceType.SNAPSHOT, "c1")
    catalog.resource_failed(first.id, "HTTP 503 from the array", at=T0)
    catalog.resource_failed(first.id, "HTTP 503 again", at=T0 + timedelta(minutes=5))
    [pending] = catalog.pending_cleanups("a1")
    assert (pending.attempts, pending.last_error) == (2, "HTTP 503 again")
    assert pending.last_attempt_at == T0 + timedelta(minutes=5)
    catalog.resource_gone(first.id)
    assert [p.array for p in catalog.pending_cleanups()] == ["a2"]
    with pytest.raises(ValueError, match="reference or at least its name"):
        CleanupRequest(array="a1", reason="x")
    with pytest.raises(ValueError, match="holds a snapshot of array"):
        CleanupRequest(array="a2", reason="x", ref=ref)


def test_a_completed_backup_takes_its_snapshots_out_of_the_ledger(catalog: Catalog) -> None:
    nodes = [node("n1", "a1", "a2")]
    begin(catalog, "rs-1", nodes)
    for array in ("a1", "a2"):
        catalog.add_resource(array_snapshot("c1", array, "rs-1", f"asked {array}"))
    # Another run's entry, and another kind of this run's, stay.
    begin(catalog, "rs-2", nodes)
    other = catalog.add_resource(array_snapshot("c1", "a1", "rs-2", "asked a1"))
    tag = catalog.add_resource(native_tag("c1", "n1", "rs-1", "a tag"))
    finish(catalog, "rs-1", nodes)
    assert [e.id for e in catalog.resources()] == [other.id, tag.id]


def test_the_reference_of_a_made_snapshot_is_kept_and_only_on_its_entry(catalog: Catalog) -> None:
    nodes = [node("n1", "a1")]
    entry = catalog.add_resource(array_snapshot("c1", "a1", "rs-1", "asked", node="n1"))
    ref = ref_for("rs-1", "a1", nodes)
    catalog.snapshot_made(entry.id, ref)
    [made] = catalog.resources("rs-1")
    assert (made.resource.ref, made.resource.node) == (ref, "n1")
    assert "node n1's own disks" in made.resource.describe()
    tag = catalog.add_resource(native_tag("c1", "n1", "rs-1", "a tag"))
    with pytest.raises(CatalogError, match=f"no ledger entry {tag.id}"):
        catalog.snapshot_made(tag.id, ref)
    with pytest.raises(CatalogError, match="no ledger entry"):
        catalog.snapshot_made(entry.id, ref_for("rs-1", "a2", [node("n1", "a2")]))
