"""Each user keyspace's schema, captured at backup time through the backup's CQL session.

Cheap (one DESCRIBE per keyspace, answered from the coordinator node's schema) and off the freeze
path: the backup asks for it after its canaries, before the flush. A failure is a warning on the
backup, never a failed backup: the backup is still a whole-ring restore point, only a table restore
of a dropped table would lack what recreates it.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from ringsnap.coordinator.backup.schema import SchemaRow, rows_from_describe
from ringsnap.coordinator.ring import SYSTEM_KEYSPACES
from ringsnap.names import keyspace_name

_DESCRIBE_TIMEOUT = 30.0


@runtime_checkable
class KeyspaceSchemaReader(Protocol):
    """Reads every user keyspace's `DESCRIBE KEYSPACE k WITH INTERNALS` rows."""

    async def describe_keyspaces(self) -> dict[str, list[SchemaRow]]: ...


def describe_keyspaces(session: Any) -> dict[str, list[SchemaRow]]:
    """Every user keyspace's DESCRIBE rows, through a connected cassandra-driver session."""
    names = sorted(
        str(row.keyspace_name)
        for row in session.execute(
            "SELECT keyspace_name FROM system_schema.keyspaces", timeout=_DESCRIBE_TIMEOUT
        )
        if str(row.keyspace_name) not in SYSTEM_KEYSPACES
    )
    schemas: dict[str, list[SchemaRow]] = {}
    for name in names:
        quoted = keyspace_name(name)  # names Cassandra lists are identifiers; checked anyway
        result = session.execute(
            f'DESCRIBE KEYSPACE "{quoted}" WITH INTERNALS', timeout=_DESCRIBE_TIMEOUT
        )
        schemas[name] = rows_from_describe(list(result))
    return schemas
