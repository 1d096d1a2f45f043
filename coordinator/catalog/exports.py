"""Exports to S3: each backup's newest export record (per node: step, clones, what was uploaded
and skipped, errors), one JSON document saved after every step so that a failed run resumes.
Exports found running when the catalog is opened are marked interrupted (their process died)."""

# S608: every query is assembled from constant fragments and "?" placeholders; values are bound.
# ruff: noqa: S608

from __future__ import annotations

import sqlite3

from pydantic import TypeAdapter

from ringsnap.coordinator.catalog.database import Database
from ringsnap.coordinator.catalog.documents import document_columns, newest_keys, read_document
from ringsnap.coordinator.catalog.errors import CatalogError
from ringsnap.coordinator.export.model import ExportRecord
from ringsnap.logs import get_logger
from ringsnap.names import backup_id as valid_backup_id

log = get_logger(__name__)
_RECORD = TypeAdapter(ExportRecord)
#: The catalog migration that let an export be 'interrupted'.
_INTERRUPTED_VERSION = 10


class ExportNotFoundError(CatalogError):
    def __init__(self, backup_id: str) -> None:
        super().__init__(f"backup {backup_id} was never exported (no export record)")
        self.backup_id = backup_id


class ExportStore(Database):
    _exports_interrupted_at_open: frozenset[str] = frozenset()

    def _opened(self, conn: sqlite3.Connection) -> None:
        super()._opened(conn)
        # Before migration 10 an export could not be 'interrupted' (tests of older versions).
        if not self._exclusive or self.schema_version < _INTERRUPTED_VERSION:
            return
        found = conn.execute(
            "UPDATE exports SET state = 'interrupted',"
            " document = json_set(document, '$.state', 'interrupted')"
            " WHERE state = 'running' RETURNING backup_id"
        ).fetchall()
        self._exports_interrupted_at_open = frozenset(row["backup_id"] for row in found)
        if found:
            log.warning(
                "exports interrupted by a previous coordinator; run each export again to resume",
                backup_ids=sorted(self._exports_interrupted_at_open),
            )

    def interrupted_exports(self) -> list[str]:
        """Backups whose export was found running when this catalog was opened."""
        self._require_owner("interrupted exports")
        return sorted(self._exports_interrupted_at_open)

    def save_export(self, record: ExportRecord) -> None:
        """Insert the backup's export record, or replace it (one per backup: the newest run)."""
        valid_backup_id(record.backup_id)
        values = (record.backup_id, record.cluster, *document_columns(record, _RECORD))
        with self._tx(write=True) as conn:
            saved = conn.execute(
                "INSERT INTO exports (backup_id, cluster, state, started_us, finished_us, document)"
                " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (backup_id) DO UPDATE SET"
                " state = excluded.state, started_us = excluded.started_us,"
                " finished_us = excluded.finished_us, document = excluded.document"
                " WHERE exports.cluster = excluded.cluster RETURNING backup_id",
                values,
            ).fetchone()
        if saved is None:
            raise CatalogError(
                f"backup {record.backup_id} has an export record of another cluster; refused"
            )

    def find_export(self, backup_id: str) -> ExportRecord | None:
        with self._tx(write=False) as conn:
            row = conn.execute(
                "SELECT document FROM exports WHERE backup_id = ?", (backup_id,)
            ).fetchone()
        if row is None:
            return None
        return read_document(_RECORD, row["document"], f"export of backup {backup_id}")

    def get_export(self, backup_id: str) -> ExportRecord:
        record = self.find_export(backup_id)
        if record is None:
            raise ExportNotFoundError(backup_id)
        return record

    def list_exports(self, cluster: str | None = None, *, limit: int = 50) -> list[ExportRecord]:
        """The newest `limit` (at most MAX_PAGE_SIZE) export records, of `cluster` or all."""
        with self._tx(write=False) as conn:
            ids = newest_keys(conn, "exports", "backup_id", cluster, limit)
        return [self.get_export(i) for i in ids]

    def exported_backups(self, backup_ids: list[str]) -> set[str]:
        """Which of `backup_ids` have a copy on S3 (their last export succeeded)."""
        if not backup_ids:
            return set()
        found: set[str] = set()
        with self._tx(write=False) as conn:
            for start in range(0, len(backup_ids), 500):
                chunk = backup_ids[start : start + 500]
                marks = ", ".join("?" * len(chunk))
                found.update(
                    row["backup_id"]
                    for row in conn.execute(
                        f"SELECT backup_id FROM exports WHERE state = 'succeeded'"
                        f" AND backup_id IN ({marks})",
                        chunk,
                    )
                )
        return found

    def delete_export(self, backup_id: str) -> None:
        with self._tx(write=True) as conn:
            conn.execute("DELETE FROM exports WHERE backup_id = ?", (backup_id,))
