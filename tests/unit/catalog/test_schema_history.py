"""The catalog's schema is history: a catalog made fresh and one upgraded a migration at a time end
identical, and the resource ledger's table, written once for migrations 10, 12, 13 and 14
(`schema_resources`), is after each of them the table those migrations landed with."""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
from pathlib import Path

import pytest

from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.catalog import schema as catalog_schema

#: sha256 (first 16 hex digits) of the `resources` table and index as each migration landed them,
#: their SQL with comments removed and white space folded (`_normal`): the text of migrations 10,
#: 12, 13 and 14 before the table was written once.
LANDED = {
    10: "a2dba99d282e1782",
    12: "3197679dec9c9b53",
    13: "a6894298a50e4839",
    14: "6d32a43bbe0d24f4",
}
#: The columns those versions have, for people reading a failure.
COLUMNS = {
    10: "id type cluster run_id run_kind reason array name volume_id name_hint node mount_purpose"
    " created_us attempts last_error last_attempt_us",
    12: "id type cluster run_id run_kind reason array name volume_id name_hint node mount_purpose"
    " host created_us attempts last_error last_attempt_us",
    13: "id type cluster run_id run_kind reason array name volume_id name_hint node mount_purpose"
    " host drill_host created_us attempts last_error last_attempt_us",
    14: "id type cluster run_id run_kind reason array name volume_id name_hint node mount_purpose"
    " host drill_host ref created_us attempts last_error last_attempt_us",
}


def _normal(sql: str | None) -> str | None:
    if sql is None:
        return None
    sql = re.sub(r"--[^\n]*", "", sql)
    sql = re.sub(r"\s+", " ", sql).strip()
    return re.sub(r"\s*([(),])\s*", r"\1", sql)


def _schema(conn: sqlite3.Connection, table: str | None = None) -> list[list[str | None]]:
    """The catalog's own tables and indexes (not SQLite's: `sqlite_stat1` comes with the
    `PRAGMA optimize` of a closed catalog, however often it was opened)."""
    rows = conn.execute(
        "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name"
    ).fetchall()
    return [
        [kind, name, owner, _normal(sql)]
        for kind, name, owner, sql in rows
        if (table is None or owner == table) and not name.startswith("sqlite_")
    ]


def test_the_ledger_table_is_after_each_migration_what_it_landed_as() -> None:
    conn = sqlite3.connect(":memory:")
    for migration in catalog_schema.MIGRATIONS:
        conn.executescript(f"BEGIN;\n{migration.sql}\nCOMMIT;")
        if migration.version not in LANDED:
            continue
        columns = " ".join(row[1] for row in conn.execute("PRAGMA table_info(resources)"))
        assert columns == COLUMNS[migration.version], migration.version
        tables = _schema(conn, "resources")
        digest = hashlib.sha256(json.dumps(tables).encode()).hexdigest()[:16]
        assert digest == LANDED[migration.version], (migration.version, tables)


@pytest.mark.parametrize("start", [9, 11, 12, 13])
def test_a_fresh_catalog_and_one_upgraded_step_by_step_end_identical(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, start: int
) -> None:
    upgraded = tmp_path / "upgraded.db"
    with monkeypatch.context() as older:
        older.setattr(catalog_schema, "MIGRATIONS", catalog_schema.MIGRATIONS[:start])
        with Catalog(upgraded) as catalog:
            assert catalog.schema_version == start
    for version in range(start + 1, len(catalog_schema.MIGRATIONS) + 1):
        with monkeypatch.context() as step:
            step.setattr(catalog_schema, "MIGRATIONS", catalog_schema.MIGRATIONS[:version])
            with Catalog(upgraded) as catalog:
                assert catalog.schema_version == version
    with Catalog(tmp_path / "fresh.db") as fresh, Catalog(upgraded) as catalog:
        assert fresh.schema_version == catalog.schema_version == len(catalog_schema.MIGRATIONS)
        assert _schema(fresh._connection()) == _schema(catalog._connection())
