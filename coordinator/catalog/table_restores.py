"""Table restores: each one's whole record (targets, per-node step, clones, verification), saved
after every step as one JSON document, so that a failed run can be resumed or aborted from it.
Those found running when the catalog is opened are marked interrupted (their process died)."""

from __future__ import annotations

import sqlite3

from pydantic import TypeAdapter

from ringsnap.coordinator.catalog.database import Database
from ringsnap.coordinator.catalog.documents import document_columns, newest_keys, read_document
from ringsnap.coordinator.catalog.errors import RestoreNotFoundError
from ringsnap.coordinator.catalog.records import save_owned
from ringsnap.coordinator.table_restore.model import TableRestoreRecord
from ringsnap.logs import get_logger
from ringsnap.names import snapshot_tag

log = get_logger(__name__)
_RECORD = TypeAdapter(TableRestoreRecord)
#: The catalog migration that made the table_restores table.
_TABLE_RESTORES_VERSION = 6


#: The columns a record fills, `id` first.
_FIELDS = ("id", "cluster", "backup_id", "state", "started_us", "finished_us", "document")


class TableRestoreStore(Database):
    _table_restores_interrupted_at_open: frozenset[str] = frozenset()

    def _opened(self, conn: sqlite3.Connection) -> None:
        super()._opened(conn)
        if not self._exclusive or self.schema_version < _TABLE_RESTORES_VERSION:
            return
        found = conn.execute(
            "UPDATE table_restores SET state = 'interrupted',"
            " document = json_set(document, '$.state', 'interrupted')"
            " WHERE state = 'running' RETURNING id"
        ).fetchall()
        self._table_restores_interrupted_at_open = frozenset(row["id"] for row in found)
        if found:
            log.warning(
                "table restores interrupted by a previous coordinator; resume or abort each",
                restore_ids=sorted(self._table_restores_interrupted_at_open),
            )

    def interrupted_table_restores(self) -> list[str]:
        """Table restores found running when this catalog was opened."""
        self._require_owner("interrupted table restores")
        return sorted(self._table_restores_interrupted_at_open)

    def save_table_restore(self, record: TableRestoreRecord) -> None:
        """Insert the record, or replace the one of the same id (same cluster and backup)."""
        snapshot_tag(record.id)
        values = (record.id, record.cluster, record.backup_id, *document_columns(record, _RECORD))
        with self._tx(write=True) as conn:
            save_owned(
                conn, table="table_restores", kind="table restore", fields=_FIELDS, values=values
            )

    def get_table_restore(self, restore_id: str) -> TableRestoreRecord:
        with self._tx(write=False) as conn:
            row = conn.execute(
                "SELECT document FROM table_restores WHERE id = ?", (restore_id,)
            ).fetchone()
        if row is None:
            raise RestoreNotFoundError(restore_id)
        return read_document(_RECORD, row["document"], f"table restore {restore_id}")

    def list_table_restores(
        self, cluster: str | None = None, *, limit: int = 50
    ) -> list[TableRestoreRecord]:
        """The newest `limit` (at most MAX_PAGE_SIZE) table restores, of `cluster` or all."""
        with self._tx(write=False) as conn:
            ids = newest_keys(conn, "table_restores", "id", cluster, limit)
        return [self.get_table_restore(i) for i in ids]
