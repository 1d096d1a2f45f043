"""Each user keyspace's schema as a backup captured it (`DESCRIBE KEYSPACE k WITH INTERNALS`), for
table restores; deleted with its backup."""

# S608: every query is assembled from constant fragments and "?" placeholders; values are bound.

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from ringsnap.coordinator.backup.schema import KeyspaceSchema, SchemaRow
from ringsnap.coordinator.catalog import backup_rows
from ringsnap.coordinator.catalog.columns import now, to_us
from ringsnap.coordinator.catalog.database import Database
from ringsnap.coordinator.catalog.errors import CatalogError


class KeyspaceSchemaStore(Database):
    def record_keyspace_schemas(
        self, backup_id: str, schemas: Mapping[str, Sequence[SchemaRow]]
    ) -> None:
        """Record (or replace) the schemas of a running backup's keyspaces."""
        with self._tx(write=True) as conn:
            pk = backup_rows.find_running(conn, backup_id, "record its keyspace schemas")
            captured = to_us(now())
            for keyspace, rows in schemas.items():
                document = json.dumps(
                    [{"type": r.type, "name": r.name, "statement": r.statement} for r in rows]
                )
                conn.execute(
                    "INSERT INTO keyspace_schemas (backup, keyspace, statements, captured_us)"
                    " VALUES (?, ?, ?, ?) ON CONFLICT (backup, keyspace) DO UPDATE SET"
                    " statements = excluded.statements, captured_us = excluded.captured_us",
                    (pk, keyspace, document, captured),
                )

    def keyspace_schema(self, backup_id: str, keyspace: str) -> KeyspaceSchema | None:
        """The schema of `keyspace` the backup captured; None when it captured none."""
        with self._tx(write=False) as conn:
            pk, _state = backup_rows.find(conn, backup_id)
            row = conn.execute(
                "SELECT statements FROM keyspace_schemas WHERE backup = ? AND keyspace = ?",
                (pk, keyspace),
            ).fetchone()
        if row is None:
            return None
        try:
            rows = tuple(
                SchemaRow(str(item["type"]), str(item["name"]), str(item["statement"]))
                for item in json.loads(row["statements"])
            )
        except (ValueError, TypeError, KeyError) as exc:
            raise CatalogError(
                f"backup {backup_id}: the recorded schema of keyspace {keyspace} is unreadable"
                f" ({exc})"
            ) from None
        return KeyspaceSchema(keyspace, rows)

    def captured_keyspaces(self, backup_id: str) -> list[str]:
        with self._tx(write=False) as conn:
            pk, _state = backup_rows.find(conn, backup_id)
            return [
                row["keyspace"]
                for row in conn.execute(
                    "SELECT keyspace FROM keyspace_schemas WHERE backup = ? ORDER BY keyspace",
                    (pk,),
                )
            ]
