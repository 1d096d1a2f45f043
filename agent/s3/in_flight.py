"""SSTables that were being written when the snapshot was taken: left out of an export.

A crash-consistent snapshot can hold an SSTable a flush or a compaction had not finished: no
TOC.txt yet, and in its directory a Cassandra transaction log (`<version>_txn_<op>_<id>.log`) that
names it in an `ADD:[<path>,…]` record and holds no COMMIT record. Cassandra deletes such SSTables
when it starts (its unfinished transactions are rolled back), so they are not data of the backup;
an incomplete SSTable that no unfinished transaction explains is damage, and the export still
refuses it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Iterator

from ringsnap.agent.sstables import SSTable
from ringsnap.logs import get_logger

log = get_logger(__name__)

_TXN_LOG = re.compile(r"[a-z]{2}_txn_[a-z_]+_[0-9a-f-]+\.log")
_ADD = re.compile(r"^ADD:\[([^,\]]*),", re.IGNORECASE)

Batches = Callable[[], Iterable[list[SSTable]]]


def unfinished_additions(directory: str) -> frozenset[str]:
    """`<version>-<generation>-<format>` of every SSTable an unfinished transaction in `directory`
    was adding (empty when the directory has no such log or cannot be read)."""
    try:
        names = [name for name in os.listdir(directory) if _TXN_LOG.fullmatch(name)]
    except OSError:
        return frozenset()
    added: set[str] = set()
    for name in names:
        try:
            with open(os.path.join(directory, name), encoding="utf-8", errors="replace") as file:
                records = file.read().splitlines()
        except OSError:
            continue
        if any(record[:7].upper() == "COMMIT:" for record in records):
            continue
        for record in records:
            match = _ADD.match(record)
            if match:
                added.add(os.path.basename(match.group(1).rstrip("/")).rstrip("-"))
    return frozenset(added)


def without_writes_in_flight(batches: Batches, node: str) -> Batches:
    """`batches` without the incomplete SSTables an unfinished transaction was writing."""

    def filtered() -> Iterator[list[SSTable]]:
        by_directory: dict[str, frozenset[str]] = {}
        for batch in batches():
            kept: list[SSTable] = []
            for table in batch:
                if not table.complete and _in_flight(table, by_directory):
                    log.info(
                        "SSTable being written at the snapshot left out (Cassandra discards it"
                        " at start)",
                        node=node,
                        keyspace=table.keyspace,
                        table_directory=table.table_directory,
                        sstable=f"{table.version}-{table.generation}-{table.format}",
                        problem=table.problem,
                    )
                    continue
                kept.append(table)
            yield kept

    return filtered


def _in_flight(table: SSTable, by_directory: dict[str, frozenset[str]]) -> bool:
    directory = os.path.join(table.data_directory, table.keyspace, table.table_directory)
    # An index's SSTables live in `<table dir>/.<index>`; the transaction logs of the table's.
    candidates = [directory]
    if os.path.basename(table.table_directory).startswith("."):
        candidates.append(os.path.dirname(directory))
    name = f"{table.version}-{table.generation}-{table.format}"
    for candidate in candidates:
        if candidate not in by_directory:
            by_directory[candidate] = unfinished_additions(candidate)
        if name in by_directory[candidate]:
            return True
    return False
