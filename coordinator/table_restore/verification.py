"""A table restore's proof, once every node imported: per node and table, every SSTable of the
backup staged (sizes and CRC32) and imported; the rows each node serves over its primary ranges
against the newest proven drill's count of the same ranges in the snapshot; and, for
information, the rows of each table at CL=ALL."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from ringsnap.coordinator.table_restore.counts import DrilledCounts, compare_counts
from ringsnap.coordinator.table_restore.model import (
    NodeProgress,
    NodeTables,
    TableRestoreRecord,
    TableTarget,
)
from ringsnap.coordinator.table_restore.ports import TableCqlPort


class DrilledCountsSource(Protocol):
    async def drilled_counts(self, backup_id: str) -> Mapping[str, DrilledCounts]: ...


async def verify_restore(
    record: TableRestoreRecord, cql: TableCqlPort, journal: DrilledCountsSource
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The verification lines ("ok: ..." or "FAILED: ...") and the record's warnings after it."""
    targets = {target.table: target for target in record.targets}
    lines = [
        verify_node_table(node, tables, targets[tables.table])
        for node in record.nodes
        for tables in node.tables
    ]
    warnings = list(record.warnings)
    for target in record.targets:
        # Information, not the check: a full count of a large table may time out.
        host = record.nodes[0].host_id if record.nodes else ""
        try:
            rows = await cql.count_rows(target.keyspace, target.table, host)
        except Exception as exc:
            warnings.append(f"{target.name}: its rows were not counted after the import ({exc})")
            continue
        lines.append(f"ok: {target.name} answers {rows} rows at CL=ALL after the import")
    lines += await _compare_counts(record, cql, journal, warnings)
    return tuple(lines), tuple(warnings)


async def _compare_counts(
    record: TableRestoreRecord,
    cql: TableCqlPort,
    journal: DrilledCountsSource,
    warnings: list[str],
) -> list[str]:
    """Per node and table: the rows over the node's primary ranges on the live ring (CL=ALL)
    against the newest proven drill's count of the same ranges in the snapshot."""
    drilled = await journal.drilled_counts(record.backup_id)
    lines: list[str] = []
    for node in record.nodes:
        for target in record.targets:
            source = f"{target.source_keyspace}.{target.source_table}"
            try:
                rows = await cql.count_primary_rows(target.keyspace, target.table, node.host_id)
            except Exception as exc:
                lines.append(
                    f"FAILED: node {node.name}: {target.name}: its rows over the node's"
                    f" primary ranges could not be counted ({exc})"
                )
                continue
            lines.append(
                compare_counts(
                    node.name,
                    source,
                    target.name,
                    rows,
                    drilled.get(node.name),
                    record.backup_id,
                    record.cluster,
                )
            )
    if not drilled:
        warnings.append(
            f"backup {record.backup_id} was never proven by a drill that counted rows: the"
            f" restored rows could not be compared with the backup's (`ringsnap drill"
            f" {record.backup_id} --cluster {record.cluster} --ring` records the counts)"
        )
    return lines


def verify_node_table(node: NodeProgress, tables: NodeTables, target: TableTarget) -> str:
    """One node's check of one table: every SSTable of the backup staged (sizes and CRC32) and
    imported, no directory failed."""
    where = f"node {node.name}: {target.name}"
    if tables.staged_sstables != tables.sstables:
        return f"FAILED: {where}: {tables.staged_sstables} of {tables.sstables} SSTables staged"
    if tables.failed_directories:
        return f"FAILED: {where}: import failed for {', '.join(tables.failed_directories)}"
    if tables.imported_sstables != tables.staged_sstables:
        return (
            f"FAILED: {where}: {tables.imported_sstables} of {tables.staged_sstables} SSTables"
            " imported"
        )
    return (
        f"ok: {where}: all {tables.sstables} SSTables of the backup ({tables.bytes} bytes)"
        f" staged with sizes and Data.db CRC32 checked ({tables.bytes_verified} bytes) and"
        " imported"
    )
