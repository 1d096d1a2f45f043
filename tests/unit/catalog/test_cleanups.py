"""Snapshots still to delete: recorded, merged, retried, done."""

from __future__ import annotations

from datetime import timedelta

import pytest

from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.model import CleanupRequest

from .conftest import T0, node, ref_for


def test_cleanups_count_attempts_and_merge_duplicates(catalog: Catalog) -> None:
    nodes = [node("n1")]
    by_name = CleanupRequest(array="a1", reason="call never returned", snapshot_name="rs-1")
    [first] = catalog.add_cleanups("rs-1", [by_name])
    assert first.ref is None and first.name == "rs-1"
    # The same snapshot, now known by reference: one cleanup, with the reference.
    ref = ref_for("rs-1", "a1", nodes)
    [merged] = catalog.add_cleanups("rs-1", [CleanupRequest(array="a1", reason="late", ref=ref)])
    assert merged.id == first.id and merged.ref == ref and merged.reason == "call never returned"
    catalog.cleanup_failed(first.id, "HTTP 503 from the array", at=T0)
    catalog.cleanup_failed(first.id, "HTTP 503 again", at=T0 + timedelta(minutes=5))
    [pending] = catalog.pending_cleanups("a1")
    assert (pending.attempts, pending.last_error) == (2, "HTTP 503 again")
    assert pending.last_attempt_at == T0 + timedelta(minutes=5)
    assert catalog.pending_cleanups("a2") == []
    catalog.cleanup_done(first.id)
    with pytest.raises(Exception, match="no pending cleanup"):
        catalog.cleanup_done(first.id)
    with pytest.raises(ValueError, match="reference or at least its name"):
        CleanupRequest(array="a1", reason="x")
    with pytest.raises(ValueError, match="holds a snapshot of array"):
        CleanupRequest(array="a2", reason="x", ref=ref)
