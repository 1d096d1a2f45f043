"""Restores: each one's whole record (who asked for what, how far every node got, its verdicts),
saved as it goes. Restores found running when the catalog is opened by its coordinator died with a
previous one: they are marked interrupted then, and may have left nodes stopped.

The per-node records and other lists are JSON columns (see `restore_codec`). A column edited by hand
into something unreadable is shown as a warning of its restore, never failing a read of the others.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from ringsnap import names
from ringsnap.coordinator.catalog import restore_codec as rcodec
from ringsnap.coordinator.catalog.columns import EPOCH, from_us, placeholders, to_us
from ringsnap.coordinator.catalog.database import Database
from ringsnap.coordinator.catalog.errors import RestoreNotFoundError
from ringsnap.coordinator.catalog.listing import MAX_PAGE_SIZE
from ringsnap.coordinator.catalog.records import JsonColumns, RecordRows
from ringsnap.coordinator.model import RestoreMode, RestoreRecord, RestoreState

_FIELDS = (
    "id",
    "cluster",
    "backup_id",
    "mode",
    "state",
    "whole_ring",
    "requested_by",
    "started_us",
    "finished_us",
    "error",
    "nodes",
    "warnings",
    "arrays_done",
    "clones",
    "timings",
)
#: Not finished: such a restore may have left nodes stopped.
OPEN_STATES = (RestoreState.RUNNING, RestoreState.FAILED, RestoreState.INTERRUPTED)


class RestoreStore(Database):
    _interrupted_at_open: frozenset[str] = frozenset()

    def _opened(self, conn: sqlite3.Connection) -> None:
        super()._opened(conn)
        if not self._exclusive:
            return
        self._interrupted_at_open = _ROWS.mark_interrupted(conn)

    def save_restore(self, record: RestoreRecord) -> None:
        """Insert the restore, or replace the whole record of the same id, in one transaction.

        An id already used by a restore of another cluster or backup is refused.
        """
        names.snapshot_tag(record.id)
        _ROWS.require(
            record.id,
            (
                (record.cluster, "its cluster"),
                (record.backup_id, "its backup"),
                (record.requested_by, "who asked for it"),
            ),
        )
        seen: set[str] = set()
        for node in record.nodes:
            if not node.name or node.name in seen:
                raise ValueError(f"restore {record.id}: node {node.name!r} is unnamed or twice")
            seen.add(node.name)
        values = (
            record.id,
            record.cluster,
            record.backup_id,
            RestoreMode(record.mode).value,
            RestoreState(record.state).value,
            int(record.whole_ring),
            record.requested_by,
            to_us(record.started_at),
            to_us(record.finished_at) if record.finished_at is not None else None,
            record.error,
            rcodec.encode_nodes(record.nodes),
            rcodec.encode_sentences(record.warnings),
            rcodec.encode_rows(record.arrays_done),
            rcodec.encode_rows(record.clones),
            rcodec.encode_timings(record.timings),
        )
        with self._tx(write=True) as conn:
            _ROWS.save(conn, values)

    def get_restore(self, restore_id: str) -> RestoreRecord:
        with self._tx(write=False) as conn:
            return _ROWS.get(conn, restore_id)

    def list_restores(self, cluster: str | None = None, *, limit: int = 50) -> list[RestoreRecord]:
        """The newest `limit` restores (at most MAX_PAGE_SIZE), of `cluster` or all, newest first."""
        if limit < 1:
            raise ValueError("limit must be 1 or more")
        where, params = _of_cluster(cluster)
        with self._tx(write=False) as conn:
            return _ROWS.newest(conn, where, params, limit=min(limit, MAX_PAGE_SIZE))

    def array_restores(self, cluster: str) -> list[RestoreRecord]:
        """Every restore of `cluster` that reverted or cloned array volumes, oldest first: which
        volume each node attached where (`ringsnap.coordinator.backup.followed`)."""
        with self._tx(write=False) as conn:
            found = _ROWS.newest(conn, ["cluster = ?"], [cluster])
        return [r for r in reversed(found) if r.arrays_done]

    def open_restores(self, cluster: str | None = None) -> list[RestoreRecord]:
        """Restores not finished (running, failed or interrupted), newest first: they may have left
        nodes stopped."""
        where, params = _of_cluster(cluster)
        states = [state.value for state in OPEN_STATES]
        where.append(f"state IN ({placeholders(len(states))})")
        with self._tx(write=False) as conn:
            return _ROWS.newest(conn, where, [*params, *states])

    def interrupted_restores(self) -> list[RestoreRecord]:
        """The restores that were running when this coordinator opened the catalog, marked
        interrupted then, and still interrupted (not resumed, not finished since); oldest first."""
        self._require_owner("interrupted restores")
        if not self._interrupted_at_open:
            return []
        with self._tx(write=False) as conn:
            return _ROWS.of_ids(
                conn, sorted(self._interrupted_at_open), also="state = 'interrupted'"
            )


def _of_cluster(cluster: str | None) -> tuple[list[str], list[Any]]:
    return (["cluster = ?"], [cluster]) if cluster else ([], [])


def _record(row: sqlite3.Row) -> RestoreRecord:
    columns = JsonColumns(row)
    nodes = columns.read("nodes", rcodec.decode_nodes)
    warnings = columns.read("warnings", rcodec.decode_sentences)
    arrays_done = columns.read("arrays_done", rcodec.decode_pairs)
    clones = columns.read("clones", rcodec.decode_triples)
    timings = columns.read("timings", rcodec.decode_timings)
    return RestoreRecord(
        id=row["id"],
        cluster=row["cluster"],
        backup_id=row["backup_id"],
        mode=RestoreMode(row["mode"]),
        nodes=nodes,
        whole_ring=bool(row["whole_ring"]),
        requested_by=row["requested_by"],
        started_at=from_us(row["started_us"]) or EPOCH,
        state=RestoreState(row["state"]),
        finished_at=from_us(row["finished_us"]),
        error=row["error"],
        warnings=(*warnings, *columns.problems),
        arrays_done=arrays_done,
        clones=clones,
        timings=timings,
    )


_ROWS = RecordRows("restores", "restore", _FIELDS, _record, RestoreNotFoundError)
