"""The catalog file: its schema and forward migrations, what it refuses to open, its lock, and one
connection shared by threads and asyncio."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

import pytest

from ringsnap.coordinator.catalog import (
    Catalog,
    CatalogLockedError,
    CatalogSchemaError,
)
from ringsnap.coordinator.catalog import codec as catalog_codec
from ringsnap.coordinator.catalog import schema as catalog_schema
from ringsnap.coordinator.model import BackupState, QuiesceMode, Verification

from .conftest import begin, finish, node, page_through, ref_for, restore_record


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


def test_a_version_2_catalog_gains_restores_and_keeps_every_backup(tmp_path: Path) -> None:
    path = tmp_path / "catalog.db"
    raw = sqlite3.connect(path)
    for migration in catalog_schema.MIGRATIONS[:2]:
        raw.executescript(migration.sql)
        raw.execute("INSERT INTO schema_version VALUES (?, ?, 0)", (migration.version, "old"))
    raw.execute(f"PRAGMA application_id = {catalog_schema.APPLICATION_ID}")
    raw.execute(
        "INSERT INTO backups (id, cluster, state, quiesce_mode, trigger, policy, started_us,"
        " finished_us, verification, verified_us, verification_detail, warnings) VALUES"
        " ('rs-v2', 'c1', 'complete', 'freeze', 'test', 'daily', 1, 2, 'proven', 3, 'drill ok',"
        " '[\"cg left\"]')"
    )
    raw.execute(
        "INSERT INTO backup_nodes (backup, name, host_id, volumes, canary_id, excluded_reason)"
        " VALUES (1, 'n1', 'h1', ?, 'c1', '')",
        (catalog_codec.encode_volumes(node("n1").volumes),),
    )
    raw.execute(
        "INSERT INTO snapshots (backup, array, ref) VALUES (1, 'a1', ?)",
        (catalog_codec.encode_ref(ref_for("rs-v2", "a1", [node("n1")])),),
    )
    raw.execute(
        "INSERT INTO backups (id, cluster, state, quiesce_mode, trigger, policy, started_us,"
        " finished_us, error) VALUES ('rs-v2-failed', 'c1', 'failed', 'none', 'test', '', 4, 5,"
        " 'boom')"
    )
    raw.execute(
        "INSERT INTO operations VALUES ('op-1', 'backup', 'running', 'rs-v2', 'c1', 't', 'flush',"
        " '', 0, 7, '[]', 1, NULL)"
    )
    raw.commit()
    raw.close()

    with Catalog(path) as catalog:
        assert catalog.schema_version == len(catalog_schema.MIGRATIONS) >= 3
        old = catalog.get_backup("rs-v2")
        assert (old.state, old.verification, old.verification_detail) == (
            BackupState.COMPLETE,
            Verification.PROVEN,
            "drill ok",
        )
        assert (old.verified_by, old.lost_reason, old.lost_at) == ("", "", None)
        assert old.warnings == ("cg left",) and old.restorable
        assert old.node("n1").volumes == node("n1").volumes
        assert old.snapshots == (ref_for("rs-v2", "a1", [node("n1")]),)
        assert catalog.get_backup("rs-v2-failed").error == "boom"
        assert [b.id for b in catalog.list_backups().backups] == ["rs-v2-failed", "rs-v2"]
        tables = {
            r[0]
            for r in catalog._connection().execute(
                "SELECT name FROM sqlite_schema WHERE type = 'table'"
            )
        }
        assert "restores" in tables and "operations" not in tables
        # What version 3 adds works on the old backups.
        assert catalog.list_restores() == []
        catalog.save_restore(restore_record("rr-1", "rs-v2"))
        assert catalog.get_restore("rr-1").backup_id == "rs-v2"
        proven = catalog.mark_verified("rs-v2", Verification.PROVEN, "restore ok", by="rr-1")
        assert proven.verified_by == "rr-1"
        catalog.mark_snapshots_lost(["rs-v2"], "restore rr-2 reverted to backup rs-v1")
        assert not catalog.get_backup("rs-v2").restorable


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


def test_reads_do_not_wait_behind_an_open_write(tmp_path: Path) -> None:
    """A list or a status reads the last commit on its own connection while a write (its fsync)
    holds the writing connection: the write below stays open until the read has answered."""
    with Catalog(tmp_path / "catalog.db") as catalog:
        catalog.begin_backup(
            backup_id="rs-1", cluster="c1", quiesce_mode=QuiesceMode.FREEZE, trigger="t"
        )
        read: list[list[str]] = []

        def list_ids() -> None:
            read.append([b.id for b in catalog.list_backups("c1", page_size=10).backups])

        with catalog._tx(write=True) as conn:
            conn.execute("UPDATE backups SET trigger = 'uncommitted' WHERE id = 'rs-1'")
            reader = threading.Thread(target=list_ids)
            reader.start()
            reader.join(30)
            assert not reader.is_alive(), "a read waited for the open write"
        assert read == [["rs-1"]]
        assert catalog.get_backup("rs-1").trigger == "uncommitted"
