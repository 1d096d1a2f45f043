"""Keyspace schemas captured by the backup for table restores: before the flush and the freeze,
recorded with the run; a failure to capture is a warning on the backup, never a failed backup."""

from __future__ import annotations

import asyncio

from ringsnap.coordinator.backup import BackupSettings, BackupWorkflow
from ringsnap.coordinator.backup.schema import SchemaRow
from ringsnap.coordinator.backup.schema_capture import KeyspaceSchemaReader, describe_keyspaces
from tests.support.fakes import FakeAgent, FakeArray, node_targets, volumes_of

ROWS = [SchemaRow("table", "t", "CREATE TABLE ks.t (id int PRIMARY KEY) WITH ID = x;")]


class Schemas:
    def __init__(self, events: list[str], error: Exception | None = None) -> None:
        self.events = events
        self.error = error

    async def describe_keyspaces(self) -> dict[str, list[SchemaRow]]:
        self.events.append("schema")
        if self.error is not None:
            raise self.error
        return {"ks": ROWS}


def _workflow(schemas: Schemas) -> tuple[BackupWorkflow, list[str]]:
    events = schemas.events
    agents = [FakeAgent(f"n{i}", events) for i in range(1, 4)]
    array = FakeArray("a1", volumes_of(a.node for a in agents), events=events, agents=agents)
    workflow = BackupWorkflow("c", node_targets(agents), {"a1": array}, None, schemas=schemas)
    return workflow, events


def test_schemas_are_captured_before_the_flush_and_the_freeze() -> None:
    schemas = Schemas([])
    assert isinstance(schemas, KeyspaceSchemaReader)
    workflow, events = _workflow(schemas)
    run = asyncio.run(workflow.run(BackupSettings(), trigger="test"))
    assert run.keyspace_schemas == {"ks": ROWS}
    assert [e.split()[0] for e in events][:2] == ["schema", "flush"]
    assert not run.warnings
    assert "schema" in run.clock.phases


def test_a_failed_capture_is_a_warning_and_the_backup_goes_on() -> None:
    workflow, events = _workflow(Schemas([], RuntimeError("no CQL answer")))
    run = asyncio.run(workflow.run(BackupSettings(), trigger="test"))
    assert run.snapshots and run.keyspace_schemas == {}
    assert any("keyspace schemas not captured (no CQL answer)" in w for w in run.warnings)
    assert "snapshot a1" in events


class Row:
    def __init__(self, **values: str) -> None:
        self.__dict__.update(values)


class Session:
    def __init__(self) -> None:
        self.queries: list[str] = []

    def execute(self, query: str, timeout: float = 0) -> list[Row]:
        self.queries.append(query)
        if query.startswith("SELECT keyspace_name"):
            return [Row(keyspace_name=k) for k in ("system", "shop", "system_schema", "ringsnap")]
        keyspace = query.split('"')[1]
        return [
            Row(type="keyspace", name=keyspace, create_statement=f"CREATE KEYSPACE {keyspace};")
        ]


def test_every_user_keyspace_is_described_with_internals() -> None:
    session = Session()
    schemas = describe_keyspaces(session)
    assert sorted(schemas) == ["ringsnap", "shop"]
    assert 'DESCRIBE KEYSPACE "shop" WITH INTERNALS' in session.queries
    assert schemas["shop"] == [SchemaRow("keyspace", "shop", "CREATE KEYSPACE shop;")]
