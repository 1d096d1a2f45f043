"""Migration 11: a proof that failed has one stored name, 'not-proven'. A catalog at version 10 keeps
its restores and table restores, and reads back with the old spellings rewritten: a restore's
'failed-verification', a restore node's verdict 'failed', a table restore's 'unverified' (column
and document); other values are left as they were, and the old restore state is refused after."""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.catalog import schema as catalog_schema
from ringsnap.coordinator.model import (
    NodeVerdict,
    RestoreMode,
    RestoreNode,
    RestoreRecord,
    RestoreState,
    RestoreStep,
)
from ringsnap.coordinator.table_restore.model import Step, TableRestoreState
from tests.unit.test_table_restore_catalog import _record as table_record

STARTED = datetime(2026, 11, 24, 3, 0, tzinfo=UTC)
FAILED_PROOF = "rr-20261124-030000-0001"
PROVEN = "rr-20261124-030000-0002"


def _restore(restore_id: str) -> RestoreRecord:
    return RestoreRecord(
        id=restore_id,
        cluster="prod",
        backup_id="rs-20261124-030000-abcd",
        mode=RestoreMode.REVERT,
        nodes=(
            RestoreNode(name="node1", host_id="h1", step=RestoreStep.VERIFIED),
            RestoreNode(name="node2", host_id="h2", step=RestoreStep.VERIFIED),
        ),
        whole_ring=True,
        requested_by="test",
        started_at=STARTED,
        state=RestoreState.PROVEN,
        finished_at=STARTED,
    )


def _as_version_10_wrote_it(connection: sqlite3.Connection) -> None:
    """The spellings ringsnap wrote before version 11 (its enums no longer have them)."""
    connection.execute(
        "UPDATE restores SET state = 'failed-verification',"
        " nodes = json_set(json_set(nodes, '$[0].verdict', 'failed'), '$[1].verdict', 'proven')"
        " WHERE id = ?",
        (FAILED_PROOF,),
    )
    connection.execute(
        "UPDATE restores SET nodes = json_set(nodes, '$[0].verdict', 'proven',"
        " '$[1].verdict', 'proven') WHERE id = ?",
        (PROVEN,),
    )
    connection.execute(
        "UPDATE table_restores SET state = 'unverified',"
        " document = json_set(document, '$.state', 'unverified') WHERE id = 'tr-1'"
    )
    connection.commit()


def test_a_version_10_catalog_reads_back_with_one_name_for_a_failed_proof(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "catalog.db"
    latest = catalog_schema.MIGRATIONS
    with monkeypatch.context() as patch:
        patch.setattr(catalog_schema, "MIGRATIONS", latest[:10])
        with Catalog(path) as old:
            old.save_restore(_restore(FAILED_PROOF))
            old.save_restore(_restore(PROVEN))
            old.save_table_restore(
                table_record("tr-1", state=TableRestoreState.SUCCEEDED, step=Step.DONE)
            )
            old.save_table_restore(table_record("tr-2"))  # failed: left as it is
    with sqlite3.connect(path) as connection:
        _as_version_10_wrote_it(connection)
    connection.close()

    with Catalog(path) as catalog:
        assert catalog.schema_version == len(latest) >= 11
        failed = catalog.get_restore(FAILED_PROOF)
        assert failed.state is RestoreState.NOT_PROVEN
        assert [n.verdict for n in failed.nodes] == [NodeVerdict.NOT_PROVEN, NodeVerdict.PROVEN]
        assert failed.warnings == (), "the rewritten record reads cleanly"
        assert failed.node("node1").step is RestoreStep.VERIFIED, "the rest of a node is kept"
        proven = catalog.get_restore(PROVEN)
        assert proven.state is RestoreState.PROVEN
        assert {n.verdict for n in proven.nodes} == {NodeVerdict.PROVEN}
        assert catalog.get_table_restore("tr-1").state is TableRestoreState.NOT_PROVEN
        assert catalog.get_table_restore("tr-2").state is TableRestoreState.FAILED
        column = catalog._connection().execute("SELECT state FROM table_restores WHERE id = 'tr-1'")
        assert column.fetchone()[0] == "not-proven"
        with pytest.raises(sqlite3.IntegrityError, match="CHECK constraint failed"):
            catalog._connection().execute(
                "UPDATE restores SET state = 'failed-verification' WHERE id = ?", (PROVEN,)
            )
        catalog.save_restore(replace(_restore(PROVEN), state=RestoreState.NOT_PROVEN))
        assert catalog.get_restore(PROVEN).state is RestoreState.NOT_PROVEN
