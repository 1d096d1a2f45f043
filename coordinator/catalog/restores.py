"""Restores: each one's whole record (who asked for what, how far every node got, its verdicts),
saved as it goes. Restores found running when the catalog is opened by its coordinator died with a
previous one: they are marked interrupted then, and may have left nodes stopped.

The per-node records and other lists are JSON columns (see `restore_codec`). A column edited by hand
into something unreadable is shown as a warning of its restore, never failing a read of the others.
"""

# S608: every query is assembled from constant fragments and "?" placeholders; values are bound.
# ruff: noqa: S608

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any, TypeVar

from ringsnap import names
from ringsnap.coordinator.catalog import restore_codec as rcodec
from ringsnap.coordinator.catalog.codec import CodecError
from ringsnap.coordinator.catalog.columns import EPOCH, from_us, placeholders, to_us
from ringsnap.coordinator.catalog.database import Database
from ringsnap.coordinator.catalog.errors import RestoreNotFoundError
from ringsnap.coordinator.catalog.listing import MAX_PAGE_SIZE
from ringsnap.coordinator.catalog.records import save_owned
from ringsnap.coordinator.model import RestoreMode, RestoreRecord, RestoreState
from ringsnap.logs import get_logger

log = get_logger(__name__)

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
_COLUMNS = ", ".join(_FIELDS)
#: Not finished: such a restore may have left nodes stopped.
OPEN_STATES = (RestoreState.RUNNING, RestoreState.FAILED, RestoreState.INTERRUPTED)
#: How much of an unreadable column a warning quotes.
_QUOTED = 200

T = TypeVar("T")


class RestoreStore(Database):
    _interrupted_at_open: frozenset[str] = frozenset()

    def _opened(self, conn: sqlite3.Connection) -> None:
        super()._opened(conn)
        if not self._exclusive:
            return
        # This coordinator owns the catalog: nothing it has not started yet can be running.
        found = conn.execute(
            "UPDATE restores SET state = 'interrupted' WHERE state = 'running' RETURNING id"
        ).fetchall()
        self._interrupted_at_open = frozenset(row["id"] for row in found)
        if found:
            log.warning(
                "restores interrupted by a previous coordinator",
                restore_ids=sorted(self._interrupted_at_open),
            )

    def save_restore(self, record: RestoreRecord) -> None:
        """Insert the restore, or replace the whole record of the same id, in one transaction.

        An id already used by a restore of another cluster or backup is refused.
        """
        names.snapshot_tag(record.id)
        for value, what in (
            (record.cluster, "its cluster"),
            (record.backup_id, "its backup"),
            (record.requested_by, "who asked for it"),
        ):
            if not value:
                raise ValueError(f"restore {record.id}: the record needs {what}")
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
            save_owned(conn, table="restores", kind="restore", fields=_FIELDS, values=values)

    def get_restore(self, restore_id: str) -> RestoreRecord:
        with self._tx(write=False) as conn:
            row = conn.execute(
                f"SELECT {_COLUMNS} FROM restores WHERE id = ?", (restore_id,)
            ).fetchone()
        if row is None:
            raise RestoreNotFoundError(restore_id)
        return _record(row)

    def list_restores(self, cluster: str | None = None, *, limit: int = 50) -> list[RestoreRecord]:
        """The newest `limit` restores (at most MAX_PAGE_SIZE), of `cluster` or all, newest first."""
        if limit < 1:
            raise ValueError("limit must be 1 or more")
        where, params = _of_cluster(cluster)
        return self._select(where, [*params, min(limit, MAX_PAGE_SIZE)], limited=True)

    def open_restores(self, cluster: str | None = None) -> list[RestoreRecord]:
        """Restores not finished (running, failed or interrupted), newest first: they may have left
        nodes stopped."""
        where, params = _of_cluster(cluster)
        states = [state.value for state in OPEN_STATES]
        where.append(f"state IN ({placeholders(len(states))})")
        return self._select(where, [*params, *states])

    def interrupted_restores(self) -> list[RestoreRecord]:
        """The restores that were running when this coordinator opened the catalog, marked
        interrupted then, and still interrupted (not resumed, not finished since); oldest first."""
        self._require_owner("interrupted restores")
        if not self._interrupted_at_open:
            return []
        ids = sorted(self._interrupted_at_open)
        with self._tx(write=False) as conn:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM restores"
                f" WHERE id IN ({placeholders(len(ids))}) AND state = 'interrupted'"
                " ORDER BY started_us, id",
                ids,
            ).fetchall()
        return [_record(row) for row in rows]

    def _select(
        self, where: list[str], params: list[Any], *, limited: bool = False
    ) -> list[RestoreRecord]:
        query = (
            f"SELECT {_COLUMNS} FROM restores"
            + (f" WHERE {' AND '.join(where)}" if where else "")
            + " ORDER BY started_us DESC, id DESC"
            + (" LIMIT ?" if limited else "")
        )
        with self._tx(write=False) as conn:
            rows = conn.execute(query, params).fetchall()
        return [_record(row) for row in rows]


def _of_cluster(cluster: str | None) -> tuple[list[str], list[Any]]:
    return (["cluster = ?"], [cluster]) if cluster else ([], [])


def _record(row: sqlite3.Row) -> RestoreRecord:
    problems: list[str] = []

    def column(name: str, decode: Callable[[object], tuple[T, ...]]) -> tuple[T, ...]:
        try:
            return decode(row[name])
        except CodecError as exc:
            quoted = repr(row[name])
            if len(quoted) > _QUOTED:
                quoted = quoted[:_QUOTED] + "..."
            problems.append(f"unreadable {name.replace('_', ' ')} in the catalog ({exc}): {quoted}")
            return ()

    nodes = column("nodes", rcodec.decode_nodes)
    warnings = column("warnings", rcodec.decode_sentences)
    arrays_done = column("arrays_done", rcodec.decode_pairs)
    clones = column("clones", rcodec.decode_triples)
    timings = column("timings", rcodec.decode_timings)
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
        warnings=(*warnings, *problems),
        arrays_done=arrays_done,
        clones=clones,
        timings=timings,
    )
