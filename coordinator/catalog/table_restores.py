"""Table restores: each one's whole record (targets, per-node step, clones, verification), saved
after every step as one JSON document, so that a failed run can be resumed or aborted from it."""

from __future__ import annotations

from pydantic import TypeAdapter

from ringsnap.coordinator.catalog.database import Database
from ringsnap.coordinator.catalog.documents import document_columns, newest_keys, read_document
from ringsnap.coordinator.catalog.errors import RestoreNotFoundError
from ringsnap.coordinator.catalog.records import save_owned
from ringsnap.coordinator.table_restore.model import TableRestoreRecord
from ringsnap.names import snapshot_tag

_RECORD = TypeAdapter(TableRestoreRecord)


#: The columns a record fills, `id` first.
_FIELDS = ("id", "cluster", "backup_id", "state", "started_us", "finished_us", "document")


class TableRestoreStore(Database):
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
