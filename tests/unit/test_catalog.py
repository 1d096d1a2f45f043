"""The catalog on a real SQLite file: its invariants, paging, cleanups, migrations and locking."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ringsnap.coordinator import catalog_codec, catalog_schema
from ringsnap.coordinator.catalog import (
    MAX_PAGE_SIZE,
    BackupNotFoundError,
    BackupStateError,
    Catalog,
    CatalogLockedError,
    CatalogSchemaError,
    IncompleteBackupError,
    InvalidPageTokenError,
    OperationNotFoundError,
)
from ringsnap.coordinator.model import (
    BackupNode,
    BackupState,
    CleanupRequest,
    FreezeWindow,
    NodeVolume,
    OperationKind,
    OperationRecord,
    OperationState,
    QuiesceMode,
    Verification,
    VolumeRole,
)
from ringsnap.coordinator.ports import SSTable, SSTableComponent
from ringsnap.errors import ValidationError
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


# -- opening -------------------------------------------------------------------------------------


def test_a_new_catalog_is_wal_with_foreign_keys_and_the_latest_schema(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "dir" / "catalog.db"
    with Catalog(path) as catalog:
        assert catalog.schema_version == len(catalog_schema.MIGRATIONS)
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert raw.execute("PRAGMA application_id").fetchone()[0] == catalog_schema.APPLICATION_ID
    latest = len(catalog_schema.MIGRATIONS)
    assert raw.execute("SELECT max(version) FROM schema_version").fetchone()[0] == latest
    raw.close()
    with Catalog(path) as catalog:
        conn = catalog._connection()
        assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


def test_a_catalog_from_a_newer_ringsnap_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "catalog.db"
    Catalog(path).close()
    raw = sqlite3.connect(path)
    raw.execute("INSERT INTO schema_version VALUES (99, 'from the future', 0)")
    raw.commit()
    raw.close()
    latest = len(catalog_schema.MIGRATIONS)
    with pytest.raises(
        CatalogSchemaError, match=rf"schema version 99.*newer ringsnap.*up to {latest}\b"
    ):
        Catalog(path)
    # The refusal released the lock: a second attempt gets the same answer, not 'locked'.
    with pytest.raises(CatalogSchemaError):
        Catalog(path)


def test_another_sqlite_database_is_not_touched(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    raw = sqlite3.connect(path)
    raw.execute("CREATE TABLE invoices (id INTEGER)")
    raw.commit()
    raw.close()
    with pytest.raises(CatalogSchemaError, match="not a ringsnap catalog"):
        Catalog(path)


def test_a_file_that_is_not_sqlite_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "catalog.db"
    path.write_bytes(b"this is not a database, just some text " * 100)
    with pytest.raises(CatalogSchemaError, match="not a usable SQLite database"):
        Catalog(path)


def test_forward_migrations_upgrade_an_older_catalog_and_keep_its_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "catalog.db"
    with Catalog(path) as catalog:
        nodes = [node("n1")]
        begin(catalog, "rs-old", nodes)
        finish(catalog, "rs-old", nodes)
    latest = len(catalog_schema.MIGRATIONS)
    upgraded = [
        *catalog_schema.MIGRATIONS,
        catalog_schema.Migration(
            latest + 1,
            "labels on backups",
            "ALTER TABLE backups ADD COLUMN labels TEXT NOT NULL DEFAULT '{}';",
        ),
    ]
    monkeypatch.setattr(catalog_schema, "MIGRATIONS", upgraded)
    with pytest.raises(CatalogSchemaError, match="only the coordinator that owns it migrates it"):
        Catalog(path, exclusive=False)
    with Catalog(path) as catalog:
        assert catalog.schema_version == latest + 1
        assert catalog.get_backup("rs-old").state is BackupState.COMPLETE
        assert len(catalog.load_manifest("rs-old", "n1")) == 3
        rows = catalog._connection().execute("SELECT version FROM schema_version").fetchall()
        assert [r[0] for r in rows] == list(range(1, latest + 2))
        labels = catalog._connection().execute("SELECT labels FROM backups").fetchone()[0]
        assert labels == "{}"


def test_a_version_1_catalog_gains_backup_warnings_and_keeps_its_backups(tmp_path: Path) -> None:
    path = tmp_path / "catalog.db"
    raw = sqlite3.connect(path)
    raw.executescript(catalog_schema.MIGRATIONS[0].sql)
    raw.execute(f"PRAGMA application_id = {catalog_schema.APPLICATION_ID}")
    raw.execute("INSERT INTO schema_version VALUES (1, 'v1', 0)")
    raw.execute(
        "INSERT INTO backups (id, cluster, state, quiesce_mode, trigger, policy, started_us,"
        " finished_us, error) VALUES ('rs-v1', 'c', 'failed', 'freeze', 'test', '', 1, 2, 'boom')"
    )
    raw.commit()
    raw.close()
    with Catalog(path) as catalog:
        assert catalog.schema_version == len(catalog_schema.MIGRATIONS) >= 2
        old = catalog.get_backup("rs-v1")
        assert (old.error, old.warnings) == ("boom", ())
        nodes = [node("n1")]
        begin(catalog, "rs-v2", nodes)
        catalog.record_snapshot("rs-v2", ref_for("rs-v2", "a1", nodes))
        catalog.record_manifest("rs-v2", "n1", [])
        left = ("array a1: temporary consistency group cg-1: HTTP 500",)
        assert catalog.complete_backup("rs-v2", warnings=left).warnings == left
        begin(catalog, "rs-v3", nodes)
        assert catalog.fail_backup("rs-v3", "array a1: HTTP 500", warnings=left).warnings == left
        assert catalog.get_backup("rs-v3").warnings == left


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


def test_a_failed_migration_leaves_the_previous_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "catalog.db"
    Catalog(path).close()
    latest = len(catalog_schema.MIGRATIONS)
    broken = [
        *catalog_schema.MIGRATIONS,
        catalog_schema.Migration(
            latest + 1,
            "broken",
            "CREATE TABLE extra (x INTEGER); ALTER TABLE nowhere ADD COLUMN y;",
        ),
    ]
    monkeypatch.setattr(catalog_schema, "MIGRATIONS", broken)
    with pytest.raises(CatalogSchemaError, match=f"migration to version {latest + 1} failed"):
        Catalog(path)
    monkeypatch.undo()
    with Catalog(path) as catalog:
        assert catalog.schema_version == latest
        tables = {r[0] for r in catalog._connection().execute("SELECT name FROM sqlite_schema")}
        assert "extra" not in tables


def test_one_coordinator_owns_a_catalog(tmp_path: Path) -> None:
    path = tmp_path / "catalog.db"
    with Catalog(path):
        with pytest.raises(CatalogLockedError, match="in use by another coordinator"):
            Catalog(path)
        with Catalog(path, exclusive=False) as reader:
            assert reader.list_backups().backups == ()
            with pytest.raises(Exception, match="only to the coordinator owning"):
                reader.interrupted_backups()
    Catalog(path).close()  # released on close


# -- the life of a backup ------------------------------------------------------------------------


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
        catalog.mark_verified("rs-1", Verification.PROVEN)


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
        catalog.cleanup_done(cleanup.id)
    assert catalog.pending_cleanups() == []


def test_an_id_with_snapshots_pending_deletion_cannot_be_reused(catalog: Catalog) -> None:
    nodes = [node("n1")]
    begin(catalog, "rs-1", nodes)
    finish(catalog, "rs-1", nodes)
    [cleanup] = catalog.delete_backup("rs-1", reason="operator")
    # A new backup named rs-1 would make a snapshot named rs-1 that this cleanup would delete.
    with pytest.raises(BackupStateError, match="pending deletion on a1; choose another id"):
        begin(catalog, "rs-1", nodes)
    catalog.cleanup_done(cleanup.id)
    begin(catalog, "rs-1", nodes)


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


def test_verification_is_recorded(catalog: Catalog) -> None:
    begin(catalog, "rs-1", [node("n1")])
    finish(catalog, "rs-1", [node("n1")])
    proven = catalog.mark_verified(
        "rs-1", Verification.PROVEN, detail="drill: 3/3 nodes proven", at=T0 + timedelta(hours=1)
    )
    assert proven.verification is Verification.PROVEN
    assert proven.verified_at == T0 + timedelta(hours=1)
    assert proven.verification_detail == "drill: 3/3 nodes proven"


# -- manifests -----------------------------------------------------------------------------------


def test_manifests_stream_in_chunks(catalog: Catalog, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(catalog_codec, "CHUNK_SSTABLES", 4)
    begin(catalog, "rs-1", [node("n1")])
    catalog.record_manifest("rs-1", "n1", iter(sstables(10)))  # any iterable, even a generator
    chunks = catalog._connection().execute("SELECT count(*) FROM manifest_chunks").fetchone()[0]
    assert chunks == 3
    stream = catalog.iter_manifest("rs-1", "n1")
    assert next(stream) == sstables(10)[0]
    assert [s.generation for s in stream] == [str(i) for i in range(2, 11)]
    # Recording again replaces the manifest.
    catalog.record_manifest("rs-1", "n1", sstables(2))
    assert catalog.load_manifest("rs-1", "n1") == sstables(2)
    assert [m.sstables for m in catalog.manifest_summaries("rs-1")] == [2]
    with pytest.raises(Exception, match="no manifest for node 'n2'"):
        catalog.iter_manifest("rs-1", "n2")  # eagerly, not at the first item
    with pytest.raises(BackupNotFoundError):
        catalog.iter_manifest("rs-nope", "n1")
    # A manifest replaced while it is streamed is never mixed with the new one.
    catalog.record_manifest("rs-1", "n1", sstables(10))
    stream = catalog.iter_manifest("rs-1", "n1")
    next(stream)
    catalog.record_manifest("rs-1", "n1", sstables(9))
    with pytest.raises(Exception, match="replaced or deleted while it was read"):
        list(stream)


components = st.builds(
    SSTableComponent,
    name=st.sampled_from(["Data.db", "Index.db", "TOC.txt", "Digest.crc32"]),
    path=st.text(min_size=1, max_size=40),
    size_bytes=st.integers(0, 2**62),
)
entries = st.builds(
    SSTable,
    data_directory=st.text(max_size=20),
    keyspace=st.text(max_size=10),
    table=st.text(max_size=10),
    table_directory=st.text(max_size=20),
    generation=st.text(max_size=30),
    format=st.sampled_from(["big", "bti"]),
    version=st.sampled_from(["nb", "oa", "da"]),
    components=st.one_of(
        st.lists(components, max_size=5).map(tuple),
        # components sharing one directory, stored compactly
        st.tuples(st.text(min_size=1, max_size=20), st.lists(components, max_size=5)).map(
            lambda pair: tuple(
                SSTableComponent(c.name, f"{pair[0]}/{c.path}", c.size_bytes) for c in pair[1]
            )
        ),
    ),
    data_digest_crc32=st.text(max_size=10),
    complete=st.booleans(),
    problem=st.text(max_size=20),
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(manifest=st.lists(entries, max_size=12))
def test_any_manifest_round_trips(manifest: list[SSTable]) -> None:
    chunks, totals = catalog_codec.encode_manifest(manifest)
    decoded = [s for chunk in chunks for s in catalog_codec.decode_manifest_chunk(chunk)]
    assert decoded == manifest
    assert totals.sstables == len(manifest)
    assert totals.components == sum(len(s.components) for s in manifest)


def test_a_corrupt_or_unknown_manifest_chunk_is_a_clear_error() -> None:
    with pytest.raises(catalog_codec.CodecError, match="cannot be read"):
        catalog_codec.decode_manifest_chunk(b"garbage")
    [chunk], _ = catalog_codec.encode_manifest(sstables(1))
    with pytest.raises(catalog_codec.CodecError, match="which this version cannot read"):
        catalog_codec.decode_manifest_chunk(chunk, "sstables-msgpack/7")


# -- listing -------------------------------------------------------------------------------------


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


def test_listing_pages_newest_first_without_gaps_or_repeats(catalog: Catalog) -> None:
    ids = fill(catalog, 60)
    backups = {b.id: b for b in catalog.backup_summaries("c1") + catalog.backup_summaries("c2")}

    def newest_first(selected: list[str]) -> list[str]:
        return sorted(selected, key=lambda i: (backups[i].started_at, i), reverse=True)

    assert page_through(catalog) == newest_first(ids)
    assert page_through(catalog, cluster="c2") == newest_first(
        [i for i in ids if backups[i].cluster == "c2"]
    )
    failed = [i for i in ids if backups[i].state is BackupState.FAILED]
    assert page_through(catalog, states=[BackupState.FAILED]) == newest_first(failed)
    page = catalog.list_backups("c1", page_size=3)
    assert page.backups and all(
        len(b.nodes) == 1 and len(b.snapshots) == 1
        for b in page.backups
        if b.state is BackupState.COMPLETE
    )


def test_page_tokens_survive_changes_and_refuse_other_filters(catalog: Catalog) -> None:
    fill(catalog, 20)
    first = catalog.list_backups(page_size=5)
    # A newer backup and a deleted one do not disturb the following pages.
    begin(catalog, "rs-newest", [], started_at=T0 + timedelta(days=30))
    second = catalog.list_backups(page_size=5, page_token=first.next_page_token)
    catalog.delete_backup(second.backups[1].id, reason="operator")
    again = catalog.list_backups(page_size=5, page_token=first.next_page_token)
    assert [b.id for b in again.backups] == [
        b.id for b in second.backups if b.id != second.backups[1].id
    ] + [catalog.list_backups(page_size=1, page_token=second.next_page_token).backups[0].id]
    assert "rs-newest" not in {b.id for b in again.backups}
    with pytest.raises(InvalidPageTokenError, match="other filters"):
        catalog.list_backups("c1", page_token=first.next_page_token)
    with pytest.raises(InvalidPageTokenError, match="invalid page token"):
        catalog.list_backups(page_token="not-a-token")
    # 20, plus the newest, minus the deleted one; a huge page size is lowered to the maximum.
    assert len(catalog.list_backups(page_size=10**6).backups) == 20
    assert MAX_PAGE_SIZE >= 20


def test_latest_backup_and_summaries(catalog: Catalog) -> None:
    fill(catalog, 30)
    latest = catalog.latest_backup("c1")
    assert latest is not None and latest.id == "rs-0029"
    complete = catalog.latest_backup("c1", states=[BackupState.COMPLETE])
    assert complete is not None and complete.id == "rs-0029"
    failed = catalog.latest_backup("c1", states=[BackupState.FAILED])
    assert failed is not None and failed.id == "rs-0028"
    assert catalog.latest_backup("c1", trigger="cli:alice") is None
    assert catalog.latest_backup("nope") is None
    summaries = catalog.backup_summaries("c1", policy="hourly")
    assert len(summaries) == 20 and summaries[0].id == "rs-0029"
    assert catalog.backup_summaries("c1", policy="daily") == []


# -- operations ----------------------------------------------------------------------------------


def test_operation_records(catalog: Catalog) -> None:
    op = OperationRecord(
        id="op-1",
        kind=OperationKind.BACKUP,
        state=OperationState.RUNNING,
        started_at=T0,
        backup_id="rs-1",
        cluster="c1",
        trigger="cli:alice",
        phase="flush",
        steps_done=1,
        steps_total=7,
    )
    catalog.save_operation(op)
    assert catalog.get_operation("op-1") == op
    assert catalog.unfinished_operations() == [op]
    done = OperationRecord(
        **{
            **op.__dict__,
            "state": OperationState.FAILED,
            "finished_at": T0 + timedelta(seconds=3),
            "errors": ("node n2: flush failed", "then this"),
        }
    )
    catalog.save_operation(done)
    assert catalog.get_operation("op-1") == done
    assert catalog.unfinished_operations() == []
    catalog.save_operation(
        OperationRecord(
            id="op-2", kind=OperationKind.DELETE, state=OperationState.PENDING, started_at=T0
        )
    )
    assert [o.id for o in catalog.recent_operations()] == ["op-2", "op-1"]
    assert [o.id for o in catalog.recent_operations(kind=OperationKind.BACKUP)] == ["op-1"]
    with pytest.raises(OperationNotFoundError):
        catalog.get_operation("op-9")


# -- concurrency ---------------------------------------------------------------------------------


def test_many_threads_share_one_catalog(catalog: Catalog) -> None:
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            for i in range(15):
                backup_id = f"rs-{n}-{i}"
                nodes = [node("n1")]
                begin(catalog, backup_id, nodes, cluster=f"c{n}")
                finish(catalog, backup_id, nodes)
                catalog.list_backups(page_size=5)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(page_through(catalog)) == 90


def test_usable_from_asyncio_through_to_thread(catalog: Catalog) -> None:
    async def main() -> list[str]:
        async def one(i: int) -> str:
            await asyncio.to_thread(begin, catalog, f"rs-{i}", [node("n1")])
            await asyncio.to_thread(finish, catalog, f"rs-{i}", [node("n1")])
            backup = await asyncio.to_thread(catalog.get_backup, f"rs-{i}")
            return backup.state.value

        return await asyncio.gather(*(one(i) for i in range(20)))

    assert asyncio.run(main()) == ["complete"] * 20
