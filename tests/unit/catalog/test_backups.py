"""The life of a backup in the catalog: begun, recorded, complete only when nothing is missing,
failed (its snapshots to the cleanups), interrupted, deleted, verified and lost."""

from __future__ import annotations

import sqlite3
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from ringsnap.coordinator.catalog import (
    BackupNotFoundError,
    BackupStateError,
    Catalog,
    IncompleteBackupError,
)
from ringsnap.coordinator.model import (
    BackupNode,
    BackupState,
    CleanupRequest,
    FreezeWindow,
    Verification,
)
from ringsnap.errors import ValidationError
from ringsnap.plugins.types import SnapshotRef

from .conftest import T0, begin, finish, node, ref_for, sstables


def test_warnings_edited_by_hand_into_anything_else_never_break_a_read(tmp_path: Path) -> None:
    path = tmp_path / "catalog.db"
    stored = {
        "rs-text": ("oops, not json", ("unreadable warnings in the catalog: 'oops, not json'",)),
        "rs-string": (
            '"one sentence"',
            ("unreadable warnings in the catalog: '\"one sentence\"'",),
        ),
        "rs-numbers": ("[1, null]", ("unreadable warnings in the catalog: '[1, null]'",)),
        "rs-object": ('{"a": 1}', ("unreadable warnings in the catalog: '{\"a\": 1}'",)),
        "rs-blob": (b"\xff\xfe", ("unreadable warnings in the catalog: b'\\xff\\xfe'",)),
        "rs-empty": ("", ()),
        "rs-good": ('["cg left"]', ("cg left",)),
    }
    with Catalog(path) as catalog:
        for backup_id in stored:
            begin(catalog, backup_id, [node("n1")])
            catalog.fail_backup(backup_id, "boom")
    raw = sqlite3.connect(path)
    for backup_id, (value, _) in stored.items():
        raw.execute("UPDATE backups SET warnings = ? WHERE id = ?", (value, backup_id))
    raw.commit()
    raw.close()
    with Catalog(path) as catalog:
        for backup_id, (_, shown) in stored.items():
            assert catalog.get_backup(backup_id).warnings == shown, backup_id
        listed = {b.id: b.warnings for b in catalog.list_backups(page_size=100).backups}
        assert listed == {backup_id: shown for backup_id, (_, shown) in stored.items()}
        assert len(catalog.backup_summaries("c1")) == len(stored)
        assert catalog.latest_backup("c1") is not None


def test_a_complete_backup_round_trips(catalog: Catalog) -> None:
    nodes = [node("n1", "a1", "a2"), node("n2", "a1")]
    begin(catalog, "rs-1", nodes)
    running = catalog.get_backup("rs-1")
    assert running.state is BackupState.RUNNING and running.finished_at is None
    assert running.arrays == ("a1", "a2")
    refs = [ref_for("rs-1", "a1", nodes), ref_for("rs-1", "a2", nodes)]
    for ref in refs:
        catalog.record_snapshot("rs-1", ref)
    catalog.record_snapshot("rs-1", refs[0])  # the same again: idempotent
    summary = catalog.record_manifest("rs-1", "n1", sstables(10))
    assert (summary.sstables, summary.components, summary.incomplete_sstables) == (10, 30, 2)
    assert summary.bytes == sum(3 * (100 + i) for i in range(10))
    catalog.record_manifest("rs-1", "n2", [])
    window = FreezeWindow(total=0.12, slowest_freeze=0.05, array_call=0.04, slowest_thaw=0.01)
    done = catalog.complete_backup(
        "rs-1",
        finished_at=T0 + timedelta(seconds=40),
        timings={"plan": 0.5, "flush": 2.0, "freeze+snapshot+thaw": 0.12},
        freeze_window=window,
    )
    assert done.state is BackupState.COMPLETE
    assert done == catalog.get_backup("rs-1")
    assert done.finished_at == T0 + timedelta(seconds=40)
    assert done.snapshots == tuple(refs)
    assert [(t.phase, t.seconds) for t in done.timings] == [
        ("plan", 0.5),
        ("flush", 2.0),
        ("freeze+snapshot+thaw", 0.12),
    ]
    assert done.freeze_window == window
    assert done.node("n1").sstable_count == 10 and done.node("n2").sstable_count == 0
    assert done.node("n1").volumes == nodes[0].volumes
    assert done.verification is Verification.UNVERIFIED
    assert catalog.load_manifest("rs-1", "n1") == sstables(10)
    with pytest.raises(BackupStateError, match="is complete, not running"):
        catalog.record_manifest("rs-1", "n1", [])


def test_complete_refuses_and_lists_everything_missing(catalog: Catalog) -> None:
    nodes = [node("n1", "a1", "a2"), node("n2", "a1")]
    begin(catalog, "rs-1", nodes)
    partial_ref = ref_for("rs-1", "a1", nodes[:1])  # lacks n2's volumes
    catalog.record_snapshot("rs-1", partial_ref)
    catalog.record_manifest("rs-1", "n1", sstables(2))
    with pytest.raises(IncompleteBackupError) as refused:
        catalog.complete_backup("rs-1")
    assert set(refused.value.missing) == {
        "node n2: no manifest",
        "node n2: volume n2-a1-data (data) is not in the snapshot of array a1",
        "node n2: volume n2-a1-commitlog (commitlog) is not in the snapshot of array a1",
        "array a2: no snapshot",
    }
    assert catalog.get_backup("rs-1").state is BackupState.RUNNING


def test_a_backup_without_nodes_or_with_every_node_excluded_is_never_complete(
    catalog: Catalog,
) -> None:
    begin(catalog, "rs-empty", [])
    with pytest.raises(IncompleteBackupError, match="no nodes recorded"):
        catalog.complete_backup("rs-empty")
    begin(catalog, "rs-none", [node("n1", excluded="agent unreachable")])
    with pytest.raises(IncompleteBackupError, match="every node is excluded"):
        catalog.complete_backup("rs-none")
    begin(catalog, "rs-novol", [BackupNode(name="n1")])
    with pytest.raises(IncompleteBackupError, match="n1: no volumes"):
        catalog.complete_backup("rs-novol")


def test_a_backup_with_excluded_nodes_is_partial_and_needs_nothing_from_them(
    catalog: Catalog,
) -> None:
    nodes = [node("n1", "a1"), node("n2", "a2", excluded="agent unreachable: refused")]
    begin(catalog, "rs-1", [])
    catalog.record_nodes("rs-1", nodes)
    with pytest.raises(BackupStateError, match="holds no volume of an included node"):
        catalog.record_snapshot("rs-1", ref_for("rs-1", "a2", nodes))
    with pytest.raises(BackupStateError, match="n2 is excluded"):
        catalog.record_manifest("rs-1", "n2", [])
    finish(catalog, "rs-1", nodes)
    backup = catalog.get_backup("rs-1")
    assert backup.state is BackupState.PARTIAL
    assert backup.arrays == ("a1",)
    assert backup.node("n2").excluded_reason == "agent unreachable: refused"


def test_record_nodes_updates_without_losing_the_manifest(catalog: Catalog) -> None:
    planned = [BackupNode(name="n1", volumes=node("n1").volumes)]
    begin(catalog, "rs-1", planned)
    catalog.record_manifest("rs-1", "n1", sstables(4))
    catalog.record_nodes("rs-1", [node("n1")])
    assert catalog.get_backup("rs-1").node("n1").host_id == "host-n1"
    assert catalog.get_backup("rs-1").node("n1").sstable_count == 4
    with pytest.raises(ValueError, match="listed twice"):
        catalog.record_nodes("rs-1", [node("n2"), node("n2")])
    with pytest.raises(BackupStateError, match="no node 'n9'"):
        catalog.record_manifest("rs-1", "n9", [])


def test_a_second_snapshot_of_one_array_is_refused(catalog: Catalog) -> None:
    nodes = [node("n1")]
    begin(catalog, "rs-1", nodes)
    catalog.record_snapshot("rs-1", ref_for("rs-1", "a1", nodes))
    other = ref_for("rs-1", "a1", nodes)
    other = SnapshotRef(**{**other.__dict__, "snapshot_id": "another"})
    with pytest.raises(BackupStateError, match=r"already recorded.*orphaned"):
        catalog.record_snapshot("rs-1", other)


def test_begin_validates_its_input(catalog: Catalog) -> None:
    with pytest.raises(ValidationError):
        begin(catalog, "../etc", [])
    with pytest.raises(ValueError, match="time zone"):
        begin(catalog, "rs-naive", [], started_at=datetime(2026, 1, 1))
    begin(catalog, "rs-1", [])
    with pytest.raises(BackupStateError, match="already exists"):
        begin(catalog, "rs-1", [])
    with pytest.raises(BackupNotFoundError, match="rs-nope"):
        catalog.get_backup("rs-nope")


def test_failing_moves_recorded_snapshots_to_the_cleanups(catalog: Catalog) -> None:
    nodes = [node("n1", "a1", "a2")]
    begin(catalog, "rs-1", nodes)
    catalog.record_snapshot("rs-1", ref_for("rs-1", "a1", nodes))
    with pytest.raises(ValueError, match="needs its error"):
        catalog.fail_backup("rs-1", "")
    failed = catalog.fail_backup(
        "rs-1",
        "array a2: snapshot call still running after the freeze budget (1.5 s)",
        cleanups=[CleanupRequest(array="a2", reason="call never returned", snapshot_name="rs-1")],
        timings={"plan": 0.2},
    )
    assert failed.state is BackupState.FAILED
    assert failed.error.startswith("array a2: snapshot call still running")
    assert failed.snapshots == ()  # moved, not claimed
    assert [t.phase for t in failed.timings] == ["plan"]
    pending = catalog.pending_cleanups()
    assert [(p.array, p.name, p.ref is not None) for p in pending] == [
        ("a1", "rs-1", True),
        ("a2", "rs-1", False),
    ]
    assert pending[0].reason.startswith("backup rs-1 failed: array a2")
    assert pending[0].ref == ref_for("rs-1", "a1", nodes)
    with pytest.raises(BackupStateError, match="is failed, not running"):
        catalog.fail_backup("rs-1", "again")
    with pytest.raises(BackupStateError, match="only finished backups are verified"):
        catalog.mark_verified("rs-1", Verification.PROVEN, by="rr-1")


def test_interrupted_backups_are_those_running_when_the_catalog_was_opened(
    tmp_path: Path,
) -> None:
    path = tmp_path / "catalog.db"
    with Catalog(path) as catalog:
        begin(catalog, "rs-died", [node("n1")])
        begin(catalog, "rs-done", [node("n1")])
        finish(catalog, "rs-done", [node("n1")])
    with Catalog(path) as catalog:
        begin(catalog, "rs-new", [node("n1")])  # running in this process: not interrupted
        interrupted = catalog.interrupted_backups()
        assert [b.id for b in interrupted] == ["rs-died"]
        assert interrupted[0].arrays == ("a1",)
        catalog.fail_backup("rs-died", "the coordinator stopped during the run")
        assert catalog.interrupted_backups() == []


def test_delete_moves_snapshots_to_cleanups_and_removes_everything_else(
    catalog: Catalog,
) -> None:
    nodes = [node("n1", "a1", "a2")]
    begin(catalog, "rs-1", nodes)
    with pytest.raises(BackupStateError, match="still running"):
        catalog.delete_backup("rs-1", reason="operator")
    finish(catalog, "rs-1", nodes)
    cleanups = catalog.delete_backup("rs-1", reason="retention (hourly): beyond all buckets")
    assert sorted(c.array for c in cleanups) == ["a1", "a2"]
    assert all(c.reason.startswith("backup rs-1 deleted: retention") for c in cleanups)
    assert catalog.pending_cleanups() == cleanups
    with pytest.raises(BackupNotFoundError):
        catalog.get_backup("rs-1")
    conn = catalog._connection()
    for table in ("backup_nodes", "snapshots", "manifests", "manifest_chunks", "phase_timings"):
        assert conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 0, table
    for cleanup in cleanups:
        catalog.resource_gone(cleanup.id)
    assert catalog.pending_cleanups() == []


def test_an_id_with_snapshots_pending_deletion_cannot_be_reused(catalog: Catalog) -> None:
    nodes = [node("n1")]
    begin(catalog, "rs-1", nodes)
    finish(catalog, "rs-1", nodes)
    [cleanup] = catalog.delete_backup("rs-1", reason="operator")
    # A new backup named rs-1 would make a snapshot named rs-1 that this cleanup would delete.
    with pytest.raises(BackupStateError, match="pending deletion on a1; choose another id"):
        begin(catalog, "rs-1", nodes)
    catalog.resource_gone(cleanup.id)
    begin(catalog, "rs-1", nodes)


def test_verification_is_recorded(catalog: Catalog) -> None:
    begin(catalog, "rs-1", [node("n1")])
    finish(catalog, "rs-1", [node("n1")])
    proven = catalog.mark_verified(
        "rs-1",
        Verification.PROVEN,
        detail="drill: 3/3 nodes proven",
        by="dr-20261121-1100",
        at=T0 + timedelta(hours=1),
    )
    assert proven.verification is Verification.PROVEN
    assert proven.verified_at == T0 + timedelta(hours=1)
    assert proven.verification_detail == "drill: 3/3 nodes proven"


def test_verification_names_the_restore_or_drill_that_proved_it(catalog: Catalog) -> None:
    begin(catalog, "rs-1", [node("n1")])
    finish(catalog, "rs-1", [node("n1")])
    with pytest.raises(ValueError, match="which restore or drill"):
        catalog.mark_verified("rs-1", Verification.PROVEN, "ok", by="")
    catalog.mark_verified("rs-1", Verification.PROVEN, "restore rr-1: every node proven", by="rr-1")
    failed = catalog.mark_verified(
        "rs-1",
        Verification.FAILED,
        "restore rr-2: not proven on n1",
        by="rr-2",
        at=T0 + timedelta(days=1),
    )
    assert (failed.verification, failed.verified_by) == (Verification.FAILED, "rr-2")
    assert failed.verification_detail == "restore rr-2: not proven on n1"
    assert failed.verified_at == T0 + timedelta(days=1)
    assert catalog.get_backup("rs-1") == failed
    [summary] = catalog.backup_summaries("c1")
    assert summary.verified_by == "rr-2"
    with pytest.raises(BackupNotFoundError):
        catalog.mark_verified("rs-nope", Verification.PROVEN, by="rr-1")


def test_backups_whose_snapshots_a_restore_destroyed_are_no_longer_restorable(
    catalog: Catalog,
) -> None:
    for backup_id in ("rs-1", "rs-2", "rs-3"):
        begin(catalog, backup_id, [node("n1")])
        finish(catalog, backup_id, [node("n1")])
    begin(catalog, "rs-failed", [node("n1")])
    catalog.fail_backup("rs-failed", "boom")
    assert all(
        b.restorable and not b.lost for b in catalog.list_backups().backups if b.id != "rs-failed"
    )
    assert not catalog.get_backup("rs-failed").restorable

    with pytest.raises(ValueError, match="say why"):
        catalog.mark_snapshots_lost(["rs-2"], "")
    reason = "restore rr-1 reverted to backup rs-1"
    catalog.mark_snapshots_lost(
        ["rs-2", "rs-3", "rs-2", "rs-deleted-meanwhile"], reason, at=T0 + timedelta(days=2)
    )
    lost = catalog.get_backup("rs-2")
    assert (lost.lost_reason, lost.lost_at, lost.lost) == (reason, T0 + timedelta(days=2), True)
    assert lost.state is BackupState.COMPLETE and not lost.restorable
    assert lost.snapshots, "what the backup was stays recorded"
    assert catalog.get_backup("rs-1").restorable
    # The first reason stays: the snapshots were destroyed once.
    catalog.mark_snapshots_lost(["rs-3"], "restore rr-2 reverted to backup rs-1")
    assert catalog.get_backup("rs-3").lost_reason == reason
    summaries = {s.id: s for s in catalog.backup_summaries("c1")}
    assert {i for i, s in summaries.items() if s.lost} == {"rs-2", "rs-3"}
    assert summaries["rs-3"].lost_at == T0 + timedelta(days=2)
    # Deleting a lost backup still queues its (gone) snapshots: deleting a gone one is no error.
    assert [c.name for c in catalog.delete_backup("rs-2", reason="operator")] == ["rs-2"]
