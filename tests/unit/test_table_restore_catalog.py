"""The catalog's keyspace schemas (per backup, only while it runs, gone with it) and table-restore
records (saved whole, read back equal, listed newest first), and the API message of a record."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from ringsnap.coordinator.api.table_restore_messages import table_restore_message
from ringsnap.coordinator.backup.schema import SchemaRow
from ringsnap.coordinator.catalog import BackupStateError, Catalog, CatalogError
from ringsnap.coordinator.catalog.errors import RestoreNotFoundError
from ringsnap.coordinator.model import QuiesceMode
from ringsnap.coordinator.table_restore.model import (
    CloneRecord,
    NodeProgress,
    NodeTables,
    Step,
    TableRestoreRecord,
    TableRestoreState,
)
from tests.support.table_restore_world import DROPPED_ORDERS

NOW = datetime(2026, 11, 24, 3, 0, tzinfo=UTC)
ROWS = [
    SchemaRow("keyspace", "shop", "CREATE KEYSPACE shop WITH replication = {};"),
    SchemaRow("table", "orders", "CREATE TABLE shop.orders (id int PRIMARY KEY) WITH ID = x;"),
]


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    return Catalog(tmp_path / "catalog.db")


def _record(restore_id: str = "tr-20261124-030000-abcd", **changes: object) -> TableRestoreRecord:
    record = TableRestoreRecord(
        id=restore_id,
        cluster="prod",
        backup_id="rs-1",
        requested_by="alice",
        started_at=NOW,
        targets=(DROPPED_ORDERS,),
        nodes=(
            NodeProgress(
                name="node1",
                host_id="h1",
                step=Step.STAGE,
                tables=(NodeTables(table="orders", sstables=2, bytes=10, staged_sstables=2),),
            ),
        ),
        clones=(CloneRecord(node="node1", array="a1", volume="v1", clone="v1_tr", clone_id="c1"),),
        state=TableRestoreState.FAILED,
        step=Step.STAGE,
        error="node node2: disk full",
        timings={"clone": 1.5},
    )
    return replace(record, **changes)  # type: ignore[arg-type]


def test_schemas_are_recorded_while_the_backup_runs_and_read_back(catalog: Catalog) -> None:
    catalog.begin_backup(
        backup_id="rs-1", cluster="prod", quiesce_mode=QuiesceMode.FREEZE, trigger="test"
    )
    catalog.record_keyspace_schemas("rs-1", {"shop": ROWS})
    schema = catalog.keyspace_schema("rs-1", "shop")
    assert schema is not None and schema.rows == tuple(ROWS)
    assert catalog.keyspace_schema("rs-1", "other") is None
    assert catalog.captured_keyspaces("rs-1") == ["shop"]
    catalog.fail_backup("rs-1", error="test")
    with pytest.raises(BackupStateError, match="not running"):
        catalog.record_keyspace_schemas("rs-1", {"shop": ROWS})


def test_a_record_is_saved_whole_and_read_back_equal(catalog: Catalog) -> None:
    record = _record()
    catalog.save_table_restore(record)
    assert catalog.get_table_restore(record.id) == record
    done = replace(record, state=TableRestoreState.SUCCEEDED, step=Step.DONE, finished_at=NOW)
    catalog.save_table_restore(done)
    assert catalog.get_table_restore(record.id) == done
    with pytest.raises(RestoreNotFoundError):
        catalog.get_table_restore("tr-nope")


def test_an_id_of_another_cluster_is_refused_and_lists_are_newest_first(catalog: Catalog) -> None:
    catalog.save_table_restore(_record())
    with pytest.raises(CatalogError, match="already used by a table restore of backup"):
        catalog.save_table_restore(_record(cluster="other"))
    catalog.save_table_restore(
        _record("tr-20261124-040000-abcd", started_at=NOW + timedelta(hours=1))
    )
    assert [r.id for r in catalog.list_table_restores("prod")] == [
        "tr-20261124-040000-abcd",
        "tr-20261124-030000-abcd",
    ]
    assert catalog.list_table_restores("nowhere") == []


def test_the_api_message_says_the_next_step_and_the_clones_left() -> None:
    message = table_restore_message(_record())
    assert message.state == "failed"
    assert message.step == "stage" and message.next_step == "unmount"
    assert message.clones_left == ["a1:v1_tr"]
    assert message.nodes[0].staged_sstables == 2
    assert message.targets[0].action == "dropped"
    assert not message.HasField("finished_at")


def test_a_table_restore_found_running_at_open_is_marked_interrupted(tmp_path: Path) -> None:
    path = tmp_path / "catalog.db"
    running = _record(state=TableRestoreState.RUNNING, error="")
    with Catalog(path) as catalog:
        catalog.save_table_restore(running)
        catalog.save_table_restore(
            _record("tr-20261124-030000-0002", state=TableRestoreState.FAILED)
        )
    with Catalog(path, exclusive=False) as reader:  # a reader changes nothing
        assert reader.get_table_restore(running.id).state is TableRestoreState.RUNNING
    with Catalog(path) as catalog:
        assert catalog.interrupted_table_restores() == [running.id]
        found = catalog.get_table_restore(running.id)
        assert found == replace(running, state=TableRestoreState.INTERRUPTED)
        assert not found.state.finished, "an interrupted table restore is resumed or aborted"
        other = catalog.get_table_restore("tr-20261124-030000-0002")
        assert other.state is TableRestoreState.FAILED
