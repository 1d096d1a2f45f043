"""What a table restore needs from the nodes' agents, the ring's CQL and the catalog (its journal),
as domain types (the workflow imports nothing from gRPC or the driver; tests fake these)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from ringsnap.coordinator.clone_mounts import CloneMounter
from ringsnap.coordinator.clone_session import CloneCleanups
from ringsnap.coordinator.ports import SSTable, VolumeState
from ringsnap.coordinator.table_restore.counts import DrilledCounts
from ringsnap.coordinator.table_restore.model import CloneRecord, TableRestoreRecord


@dataclass(frozen=True)
class StagingSpace:
    directory: str
    free_bytes: int
    staged_bytes: int


@dataclass(frozen=True)
class StagedTable:
    directory: str
    sstables: int
    files: int
    bytes: int
    bytes_verified: int


@dataclass(frozen=True)
class ImportedTable:
    sstables_imported: int
    failed_directories: tuple[str, ...]
    seconds: float
    method: str


class TableNodePort(CloneMounter, Protocol):
    """One node's agent, for a table restore. Every call raises `AgentError` naming the node."""

    @property
    def node(self) -> str: ...

    async def volume_state(self) -> VolumeState: ...

    async def staging_space(self, restore_id: str) -> StagingSpace: ...

    async def stage_table(
        self,
        restore_id: str,
        keyspace: str,
        table: str,
        clone_mounts: Sequence[tuple[str, str]],
        sstables: Sequence[SSTable],
    ) -> StagedTable: ...

    async def import_staged_table(
        self, restore_id: str, keyspace: str, table: str
    ) -> ImportedTable: ...

    async def remove_staging(self, restore_id: str) -> tuple[int, int]: ...


@dataclass(frozen=True)
class TableState:
    """A table as the live ring knows it now."""

    keyspace_exists: bool
    exists: bool
    table_id: str = ""
    #: The materialized views built on the table now.
    views: tuple[str, ...] = ()


class TableCqlPort(Protocol):
    """The live ring through CQL."""

    async def health(self, host_ids: Sequence[str]) -> list[str]:
        """Problems that forbid a live restore: a node not Up/Normal, no schema agreement."""
        ...

    async def table_state(self, keyspace: str, table: str) -> TableState: ...

    async def execute_schema(self, statement: str) -> None:
        """Run one schema statement and wait for schema agreement."""
        ...

    async def count_rows(self, keyspace: str, table: str, host_id: str) -> int:
        """Rows of the table, read at CL=ALL through the node `host_id` (every replica answers)."""
        ...

    async def count_primary_rows(self, keyspace: str, table: str, host_id: str) -> int:
        """Rows of the table over the primary token ranges of the node `host_id` (the ranges
        ending at its tokens), read at CL=ALL and paged: what a drill counts on that node."""
        ...


class TableRestoreJournal(CloneCleanups, Protocol):
    """The catalog, as the run uses it: its record saved after every step, the backup's manifests
    and drills read, and its clones kept in the resource ledger (its `cleanup_*` calls)."""

    async def save(self, record: TableRestoreRecord) -> None: ...

    async def manifest(self, backup_id: str, node: str) -> Iterable[SSTable]: ...

    async def drilled_counts(self, backup_id: str) -> Mapping[str, DrilledCounts]:
        """Node → the newest proven drill's row counts of the backup (nodes never drilled absent)."""
        ...

    async def clones_planned(
        self, record: TableRestoreRecord, clones: Sequence[CloneRecord], suffix: str
    ) -> list[int]:
        """Record each clone in the ledger before the array is asked for it (its name will hold
        `suffix`; unmounted on its node under the restore's id, then deleted); their entry ids."""
        ...

    async def clone_made(self, entry_id: int, clone: CloneRecord) -> None:
        """The array made the clone: its name and id in its ledger entry."""
        ...
