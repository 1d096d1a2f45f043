"""The world of the table-restore tests: a three-node ring's backup of keyspace `shop`, fakes of
every node's agent (clones, staging, imports), the array, the ring's CQL and the catalog, and a
`World` that plans and runs a table restore on them."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from ringsnap.coordinator.backup.schema import KeyspaceSchema, SchemaRow
from ringsnap.coordinator.ports import SSTable, SSTableComponent
from ringsnap.coordinator.table_restore.counts import DrilledCounts
from ringsnap.coordinator.table_restore.model import (
    CloneRecord,
    TableRestoreRecord,
    TableRestoreRequest,
    TableTarget,
)
from ringsnap.coordinator.table_restore.plan import TableRestorePlan, plan_table_restore
from ringsnap.coordinator.table_restore.ports import (
    ImportedTable,
    StagedTable,
    StagingSpace,
    TableState,
)
from ringsnap.coordinator.table_restore.workflow import TableRestoreWorkflow
from tests.support.clone_fakes import CloneArray, CloneNode, Events, cloneable_backup

NODES = ("node1", "node2", "node3")
TABLE_ID = "5a1c395e-b41f-11e5-9f22-ba0be0483c18"
SCHEMA = KeyspaceSchema(
    "shop",
    (
        SchemaRow("keyspace", "shop", "CREATE KEYSPACE shop WITH replication = {};"),
        SchemaRow(
            "table",
            "orders",
            f"CREATE TABLE shop.orders (id int PRIMARY KEY) WITH ID = {TABLE_ID};",
        ),
    ),
)


#: shop.orders, dropped since the backup: restored under its own name and id.
DROPPED_ORDERS = TableTarget(
    source_keyspace="shop",
    source_table="orders",
    keyspace="shop",
    table="orders",
    source_id=TABLE_ID,
    action="dropped",
)


def shop_sstable(table: str = "orders", generation: str = "1", *, complete: bool = True) -> SSTable:
    return SSTable(
        data_directory="/data/cassandra",
        keyspace="shop",
        table=table,
        table_directory=f"{table}-5a1c395eb41f11e59f22ba0be0483c18",
        generation=generation,
        format="big",
        version="nb",
        components=(
            SSTableComponent("Data.db", f"shop/{table}-x/nb-{generation}-big-Data.db", 1000),
            SSTableComponent("TOC.txt", f"shop/{table}-x/nb-{generation}-big-TOC.txt", 10),
        ),
        data_digest_crc32="42",
        complete=complete,
        problem="" if complete else "TOC.txt lists Index.db, not on disk",
    )


class FakeAgent(CloneNode):
    """`AgentPort.volume_state` and the whole `TableNodePort`."""

    def __init__(self, name: str, events: Events) -> None:
        super().__init__(name, events)
        self.free = 10**9
        self.staged: dict[str, int] = {}

    async def staging_space(self, restore_id: str) -> StagingSpace:
        return StagingSpace(f"/data/.ringsnap-staging/{restore_id}", self.free, 0)

    async def stage_table(
        self,
        restore_id: str,
        keyspace: str,
        table: str,
        clone_mounts: Sequence[tuple[str, str]],
        sstables: Sequence[SSTable],
    ) -> StagedTable:
        assert clone_mounts == [("/data", f"/state/clones/{restore_id}/data")]
        self._call(f"stage:{keyspace}.{table}")
        self.staged[table] = len(sstables)
        return StagedTable("/staging", len(sstables), 2 * len(sstables), 1010, 1000)

    async def import_staged_table(
        self, restore_id: str, keyspace: str, table: str
    ) -> ImportedTable:
        self._call(f"import:{keyspace}.{table}")
        return ImportedTable(self.staged.get(table, 0), (), 0.5, "jolokia")

    async def remove_staging(self, restore_id: str) -> tuple[int, int]:
        self._call("remove-staging")
        return 2, 1010


class FakeCql:
    def __init__(self, events: Events) -> None:
        self.events = events
        self.problems: list[str] = []
        self.tables: dict[str, str] = {"shop.orders": TABLE_ID}
        self.keyspaces = {"shop"}
        self.count_error: Exception | None = None
        #: (keyspace.table, host id) → rows over the node's primary ranges; 1000 by default.
        self.primary_rows: dict[tuple[str, str], int] = {}
        self.views: dict[str, tuple[str, ...]] = {}

    async def health(self, host_ids: Sequence[str]) -> list[str]:
        return list(self.problems)

    async def table_state(self, keyspace: str, table: str) -> TableState:
        table_id = self.tables.get(f"{keyspace}.{table}", "")
        return TableState(
            keyspace in self.keyspaces,
            bool(table_id),
            table_id,
            self.views.get(f"{keyspace}.{table}", ()),
        )

    async def execute_schema(self, statement: str) -> None:
        self.events.append("cql:" + statement.split("(", maxsplit=1)[0].strip())
        if statement.startswith("CREATE TABLE"):
            name = statement.split()[2]
            self.tables[name] = TABLE_ID if "WITH ID" in statement else "new-id"

    async def count_rows(self, keyspace: str, table: str, host_id: str) -> int:
        if self.count_error is not None:
            raise self.count_error
        return 3000

    async def count_primary_rows(self, keyspace: str, table: str, host_id: str) -> int:
        self.events.append(f"count:{keyspace}.{table}:{host_id}")
        return self.primary_rows.get((f"{keyspace}.{table}", host_id), 1000)


class Journal:
    def __init__(self, manifest: dict[str, list[SSTable]]) -> None:
        self.saved: list[TableRestoreRecord] = []
        self.manifests = manifest
        #: The ledger's entries of clones: id -> "node:array:clone" (the clone's name once made).
        self.pending_cleanups: dict[int, str] = {}
        self.cleanup_errors: dict[int, str] = {}
        self.next_cleanup_id = 0
        #: Every node drilled, with the rows the fake ring answers by default.
        self.drilled: dict[str, DrilledCounts] = {
            n: DrilledCounts("dr-20261124-020000-0001", {"shop.orders": 1000}) for n in NODES
        }

    async def save(self, record: TableRestoreRecord) -> None:
        self.saved.append(record)

    async def manifest(self, backup_id: str, node: str) -> Iterable[SSTable]:
        return self.manifests[node]

    async def drilled_counts(self, backup_id: str) -> Mapping[str, DrilledCounts]:
        return self.drilled

    async def clones_planned(
        self, record: TableRestoreRecord, clones: Sequence[CloneRecord], suffix: str
    ) -> list[int]:
        ids = []
        for clone in clones:
            self.next_cleanup_id += 1
            self.pending_cleanups[self.next_cleanup_id] = f"{clone.node}:{clone.array}:"
            ids.append(self.next_cleanup_id)
        return ids

    async def clone_made(self, entry_id: int, clone: CloneRecord) -> None:
        self.pending_cleanups[entry_id] = f"{clone.node}:{clone.array}:{clone.clone}"

    async def cleanup_pending(self, cleanup_id: int) -> bool:
        return cleanup_id in self.pending_cleanups

    async def cleanup_done(self, cleanup_id: int) -> None:
        self.pending_cleanups.pop(cleanup_id)

    async def cleanup_failed(self, cleanup_id: int, error: str) -> None:
        self.cleanup_errors[cleanup_id] = error


class World:
    def __init__(self) -> None:
        self.events: Events = []
        self.agents = {n: FakeAgent(n, self.events) for n in NODES}
        self.array = CloneArray(self.events)
        self.cql = FakeCql(self.events)
        self.manifests = {n: [shop_sstable(), shop_sstable("other")] for n in NODES}
        self.journal = Journal(self.manifests)
        self.backup = cloneable_backup(NODES)
        self.schema = SCHEMA

    def plan(
        self, request: TableRestoreRequest | None = None, **backup: object
    ) -> TableRestorePlan:
        request = request or TableRestoreRequest(
            backup_id=self.backup.id, keyspace="shop", tables=("orders",), requested_by="test"
        )
        return asyncio.run(
            plan_table_restore(
                "tr-1",
                request,
                replace(self.backup, **backup) if backup else self.backup,  # type: ignore[arg-type]
                self.schema,
                self.manifests,
                self.agents,  # type: ignore[arg-type]
                self.agents,
                {"array1": self.array},  # type: ignore[dict-item]
                self.cql,
            )
        )

    def workflow(self) -> TableRestoreWorkflow:
        return TableRestoreWorkflow(
            self.backup,
            SCHEMA,
            self.agents,
            {"array1": self.array},  # type: ignore[dict-item]
            self.cql,
            self.journal,
        )

    def run(self, record: TableRestoreRecord) -> TableRestoreRecord:
        return asyncio.run(self.workflow().run(record))
