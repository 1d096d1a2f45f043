"""Saving an operation's record (a restore, a drill, a table restore): insert it, or replace the one
of the same id, which must belong to the same cluster and backup.

An id names one operation for good: a resume saves its record again under its id, while an id
reused for another backup's operation is refused instead of overwriting that record.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from ringsnap.coordinator.catalog.columns import placeholders
from ringsnap.coordinator.catalog.errors import CatalogError


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
