"""A table created after a backup on the sandbox ring, and what a restore must leave of it on every
restored node, whatever the source of the restore (docs/restore.md, "A table created after the
backup"): no live SSTable in its directory, its files kept in `.ringsnap-replaced/<restore id>/`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cassandra import ConsistencyLevel

from ringsnap.sandbox.cluster import SandboxCluster
from tests.support.acked_writes import KEYSPACE

TABLE = "late"
REPLACED = ".ringsnap-replaced"


@dataclass(frozen=True)
class LateTable:
    #: `late-<table id>`, the same on every node.
    directory: str
    #: node name -> the names of its live Data.db files before the restore.
    data_files: dict[str, set[str]]

    def path(self, data_dir: Path) -> Path:
        return data_dir / KEYSPACE / self.directory


def create_late_table(cluster: SandboxCluster, rows: int = 100) -> LateTable:
    """`restore_test.late`, created (after the backup), written at ALL and flushed on every node."""
    session = cluster.session()
    session.execute(f"DROP TABLE IF EXISTS {KEYSPACE}.{TABLE}", timeout=120)
    session.execute(f"CREATE TABLE {KEYSPACE}.{TABLE} (id int PRIMARY KEY, v text)", timeout=120)
    insert = session.prepare(f"INSERT INTO {KEYSPACE}.{TABLE} (id, v) VALUES (?, ?)")
    insert.consistency_level = ConsistencyLevel.ALL
    for i in range(rows):
        session.execute(insert, (i, "written after the backup"))
    (row,) = session.execute(
        "SELECT id FROM system_schema.tables WHERE keyspace_name = %s AND table_name = %s",
        (KEYSPACE, TABLE),
    )
    late = LateTable(f"{TABLE}-{row.id.hex}", {})
    for node in cluster.nodes:
        cluster.nodetool(node, "flush", KEYSPACE, TABLE)
        found = {p.name for p in late.path(node.data_dir).glob("*-Data.db")}
        assert found, f"{node.name}: no SSTable of {KEYSPACE}.{TABLE} after the flush"
        late.data_files[node.name] = found
    return late


def assert_moved_aside(cluster: SandboxCluster, late: LateTable, restore_id: str) -> None:
    """On every node: no live SSTable left in the late table's directory, every one it had kept in
    `.ringsnap-replaced/<restore id>/`."""
    for node in cluster.nodes:
        table = late.path(node.data_dir)
        assert not list(table.glob("*-Data.db")), f"{node.name}: {table} still has live SSTables"
        kept = {p.name for p in (table / REPLACED / restore_id).glob("*-Data.db")}
        assert kept == late.data_files[node.name], (node.name, kept, late.data_files[node.name])
