"""An operation's record (a restore, a drill, a table restore) in its row. Saving inserts it, or
replaces the one of the same id, which must belong to the same cluster and backup; reading decodes
its JSON columns, an unreadable one becoming a warning of that record.

An id names one operation for good: a resume saves its record again under its id, while an id
reused for another backup's operation is refused instead of overwriting that record.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from ringsnap.coordinator.catalog.codec import CodecError
from ringsnap.coordinator.catalog.columns import placeholders
from ringsnap.coordinator.catalog.errors import CatalogError
from ringsnap.logs import get_logger

log = get_logger(__name__)

#: How much of an unreadable column a warning quotes.
_QUOTED = 200

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class RecordRows(Generic[R]):
    """The rows of one kind of operation record: `table` has the columns `fields` (`id` first, then
    `cluster` and `backup_id` among them, and `started_us`); `decode` makes a record of a row;
    `missing` is the error for an id without a record."""

    table: str
    kind: str
    fields: tuple[str, ...]
    decode: Callable[[sqlite3.Row], R]
    missing: Callable[[str], Exception]

    def require(self, record_id: str, fields: Iterable[tuple[str, str]]) -> None:
        """Refuse a record to save whose field (value, what it is) is empty."""
        for value, what in fields:
            if not value:
                raise ValueError(f"{self.kind} {record_id}: the record needs {what}")

    def save(self, conn: sqlite3.Connection, values: Sequence[object]) -> None:
        save_owned(conn, table=self.table, kind=self.kind, fields=self.fields, values=values)

    def mark_interrupted(
        self, conn: sqlite3.Connection, also_set: str = "", params: Sequence[object] = ()
    ) -> frozenset[str]:
        """Mark the records still running interrupted (their coordinator died with them; this
        one owns the catalog, so nothing it started can be running yet); their ids."""
        found = conn.execute(
            f"UPDATE {self.table} SET state = 'interrupted'{also_set}"  # noqa: S608
            " WHERE state = 'running' RETURNING id",
            tuple(params),
        ).fetchall()
        ids = frozenset(row["id"] for row in found)
        if ids:
            log.warning(
                f"{self.table} interrupted by a previous coordinator",
                **{f"{self.kind}_ids": sorted(ids)},
            )
        return ids

    def get(self, conn: sqlite3.Connection, record_id: str) -> R:
        row = conn.execute(self._select("WHERE id = ?"), (record_id,)).fetchone()
        if row is None:
            raise self.missing(record_id)
        return self.decode(row)

    def newest(
        self,
        conn: sqlite3.Connection,
        where: Sequence[str],
        params: Sequence[object],
        *,
        limit: int | None = None,
    ) -> list[R]:
        """The records matching all of `where` (with `params`), newest first, at most `limit`."""
        query = self._select(
            (f"WHERE {' AND '.join(where)}" if where else "")
            + " ORDER BY started_us DESC, id DESC"
            + (" LIMIT ?" if limit is not None else "")
        )
        bound = [*params] if limit is None else [*params, limit]
        return [self.decode(row) for row in conn.execute(query, bound).fetchall()]

    def of_ids(self, conn: sqlite3.Connection, ids: Sequence[str], *, also: str = "") -> list[R]:
        """The records of `ids` (and the condition `also`), oldest first."""
        query = self._select(
            f"WHERE id IN ({placeholders(len(ids))}){f' AND {also}' if also else ''}"
            " ORDER BY started_us, id"
        )
        return [self.decode(row) for row in conn.execute(query, list(ids)).fetchall()]

    def _select(self, rest: str) -> str:
        return f"SELECT {', '.join(self.fields)} FROM {self.table} {rest}"  # noqa: S608


def save_owned(
    conn: sqlite3.Connection,
    *,
    table: str,
    kind: str,
    fields: Sequence[str],
    values: Sequence[object],
) -> None:
    """Upsert `values` (for `fields`, the first being `id`) into `table`, a table of this
    module's tables with `id`, `cluster` and `backup_id` columns. `kind` names the record in
    the refusal ("restore", "drill")."""
    columns = ", ".join(fields)
    replace = ", ".join(f"{field} = excluded.{field}" for field in fields[1:])
    saved = conn.execute(
        f"INSERT INTO {table} ({columns}) VALUES ({placeholders(len(values))})"  # noqa: S608
        f" ON CONFLICT (id) DO UPDATE SET {replace}"
        f" WHERE {table}.cluster = excluded.cluster AND {table}.backup_id = excluded.backup_id"
        " RETURNING id",
        tuple(values),
    ).fetchone()
    if saved is None:
        other = conn.execute(
            f"SELECT cluster, backup_id FROM {table} WHERE id = ?",  # noqa: S608
            (values[0],),
        ).fetchone()
        raise CatalogError(
            f"{kind} id {values[0]} is already used by a {kind} of backup {other['backup_id']}"
            f" of cluster {other['cluster']}; choose another id"
        )


class JsonColumns:
    """Reads a row's JSON columns. A column edited by hand into something unreadable reads as empty
    and adds a sentence to `problems` (the record's warnings): it never fails the read."""

    def __init__(self, row: sqlite3.Row) -> None:
        self._row = row
        self.problems: list[str] = []

    def read(self, name: str, decode: Callable[[object], tuple[T, ...]]) -> tuple[T, ...]:
        try:
            return decode(self._row[name])
        except CodecError as exc:
            quoted = repr(self._row[name])
            if len(quoted) > _QUOTED:
                quoted = quoted[:_QUOTED] + "..."
            self.problems.append(
                f"unreadable {name.replace('_', ' ')} in the catalog ({exc}): {quoted}"
            )
            return ()
