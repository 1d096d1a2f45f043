"""Table restores: each one's whole record (targets, per-node step, clones, verification), saved
after every step as one JSON document, so that a failed run can be resumed or aborted from it."""

# S608: every query is assembled from constant fragments and "?" placeholders; values are bound.
# ruff: noqa: S608

from __future__ import annotations

from pydantic import TypeAdapter, ValidationError

from ringsnap.coordinator.catalog.columns import to_us
from ringsnap.coordinator.catalog.database import Database
from ringsnap.coordinator.catalog.errors import CatalogError, RestoreNotFoundError
from ringsnap.coordinator.catalog.listing import MAX_PAGE_SIZE
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
        values = (
            record.id,
            record.cluster,
            record.backup_id,
            record.state.value,
            to_us(record.started_at),
            to_us(record.finished_at) if record.finished_at is not None else None,
            _RECORD.dump_json(record).decode(),
        )
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
        try:
            return _RECORD.validate_json(row["document"])
        except ValidationError as exc:
            raise CatalogError(
                f"table restore {restore_id}: its record is unreadable ({exc.error_count()}"
                f" problems, first: {exc.errors()[0]['msg']})"
            ) from None

    def list_table_restores(
        self, cluster: str | None = None, *, limit: int = 50
    ) -> list[TableRestoreRecord]:
        """The newest `limit` (at most MAX_PAGE_SIZE) table restores, of `cluster` or all."""
        if limit < 1:
            raise ValueError("limit must be 1 or more")
        where = "WHERE cluster = ?" if cluster else ""
        params: tuple[object, ...] = (cluster,) if cluster else ()
        with self._tx(write=False) as conn:
            ids = [
                row["id"]
                for row in conn.execute(
                    f"SELECT id FROM table_restores {where} ORDER BY started_us DESC LIMIT ?",
                    (*params, min(limit, MAX_PAGE_SIZE)),
                )
            ]
        return [self.get_table_restore(i) for i in ids]
