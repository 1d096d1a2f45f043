"""The resource ledger's table (`resources`) as each catalog migration that shapes it wants it,
written once: migration 10 creates it; 12, 13 and 14 make it again (SQLite alters no CHECK in
place) with the columns and CHECKs of their version, copying every row and id.

A migration is history once landed: what `resources_table(v)` returns for a version must keep
giving the same table (columns, defaults, CHECKs, index), so that a catalog made fresh and one
upgraded step by step end identical (`tests/unit/catalog/test_schema_history.py`).
"""

# S608: the SQL is assembled from this module's own constants (migrations); no value is bound.
# ruff: noqa: S608

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class _Column:
    name: str
    declaration: str
    #: The migration that added it.
    since: int = 10


_COLUMNS = (
    _Column("id", "INTEGER PRIMARY KEY"),
    _Column("type", "TEXT NOT NULL"),
    _Column("cluster", "TEXT NOT NULL"),
    _Column("run_id", "TEXT NOT NULL"),
    _Column("run_kind", "TEXT NOT NULL"),
    _Column("reason", "TEXT NOT NULL"),
    _Column("array", "TEXT NOT NULL DEFAULT ''"),
    _Column("name", "TEXT NOT NULL DEFAULT ''"),
    _Column("volume_id", "TEXT NOT NULL DEFAULT ''"),
    _Column("name_hint", "TEXT NOT NULL DEFAULT ''"),
    _Column("node", "TEXT NOT NULL DEFAULT ''"),
    _Column("mount_purpose", "TEXT NOT NULL DEFAULT ''"),
    _Column("host", "TEXT NOT NULL DEFAULT ''", since=12),
    _Column("drill_host", "INTEGER NOT NULL DEFAULT 0 CHECK (drill_host IN (0, 1))", since=13),
    _Column("ref", "TEXT NOT NULL DEFAULT ''", since=14),
    _Column("created_us", "INTEGER NOT NULL"),
    _Column("attempts", "INTEGER NOT NULL DEFAULT 0"),
    _Column("last_error", "TEXT NOT NULL DEFAULT ''"),
    _Column("last_attempt_us", "INTEGER"),
)

#: The types an entry may have, by the migration that allowed them.
_TYPES = {10: ("clone", "native-tag", "staging")}
_TYPES_SINCE_12 = ("clone", "snapshot", "native-tag", "staging", "mapping")

# The table's CHECKs, each as the versions that hold it. Each says what an entry must name.
_CLONE_NAMED = "type <> 'clone' OR name <> '' OR name_hint <> ''"
_CHECKS: Mapping[int, Sequence[str]] = {
    10: (_CLONE_NAMED, "mount_purpose = '' OR node <> ''"),
    12: (
        _CLONE_NAMED,
        "type <> 'mapping' OR (name <> '' AND node <> '')",
        "mount_purpose = '' OR node <> ''",
    ),
    13: (
        _CLONE_NAMED,
        "type <> 'mapping' OR (name <> '' AND node <> '')",
        # a mounted resource says who mounts it: a node, or the cluster's drill host
        "mount_purpose = '' OR node <> '' OR drill_host = 1",
        "type <> 'native-tag' OR (node <> '' AND name <> '')",
    ),
    14: (
        _CLONE_NAMED,
        # a mapping names its volume and whose host it is mapped to: a node's, or the drill host's
        "type <> 'mapping' OR (name <> '' AND (node <> '' OR drill_host = 1))",
        "mount_purpose = '' OR node <> '' OR drill_host = 1",
        "type <> 'native-tag' OR (node <> '' AND name <> '')",
        # a snapshot is named after its backup before the array answers
        "type <> 'snapshot' OR (array <> '' AND name <> '')",
        "ref = '' OR type = 'snapshot'",
    ),
}

_INDEX = "CREATE INDEX resources_by_run ON resources (run_id);\n"


def _columns(version: int) -> list[_Column]:
    return [column for column in _COLUMNS if column.since <= version]


def _create(table: str, version: int) -> str:
    types = ", ".join(f"'{t}'" for t in _TYPES.get(version, _TYPES_SINCE_12))
    lines = []
    for column in _columns(version):
        check = f" CHECK (type IN ({types}))" if column.name == "type" else ""
        lines.append(f"    {column.name} {column.declaration}{check}")
    lines += [f"    CHECK ({check})" for check in _CHECKS[version]]
    return f"CREATE TABLE {table} (\n" + ",\n".join(lines) + "\n);\n"


def resources_table(version: int, *, copied: Mapping[str, str] | None = None) -> str:
    """The SQL of migration `version` for the ledger's table: created (10), or made again with
    every row of the previous version's table (12 to 14). `copied` gives, by column, the SQL
    expression a row's new value is computed with (default: the old column of that name; a
    column new in `version` takes its default unless given)."""
    if version == 10:
        return _create("resources", version) + _INDEX
    previous = {column.name for column in _columns(version - 1)}
    copied = dict(copied or {})
    targets = [c.name for c in _columns(version) if c.name in previous or c.name in copied]
    values = [copied.get(name, name) for name in targets]
    table = f"resources_v{version}"
    return (
        _create(table, version)
        + f"INSERT INTO {table} ({', '.join(targets)})\n"
        + f"    SELECT {', '.join(values)} FROM resources;\n"
        + "DROP TABLE resources;\n"
        + f"ALTER TABLE {table} RENAME TO resources;\n"
        + _INDEX
    )
