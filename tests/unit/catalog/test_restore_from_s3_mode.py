"""Migration 8: a catalog at version 7 keeps its restores and then records restores from S3 (mode
's3', a node's step 'downloaded'), which version 7's CHECK refused."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.catalog import schema as catalog_schema
from ringsnap.coordinator.model import RestoreMode, RestoreNode, RestoreRecord, RestoreStep

STARTED = datetime(2026, 11, 24, 3, 0, tzinfo=UTC)


def _record(restore_id: str, mode: RestoreMode, step: RestoreStep) -> RestoreRecord:
    return RestoreRecord(
        id=restore_id,
        cluster="prod",
        backup_id="rs-20261124-030000-abcd",
        mode=mode,
        nodes=(RestoreNode(name="node1", host_id="h1", step=step),),
        whole_ring=True,
        requested_by="test",
        started_at=STARTED,
    )


def test_a_version_7_catalog_keeps_its_restores_and_then_records_one_from_s3(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "catalog.db"
    latest = catalog_schema.MIGRATIONS
    with monkeypatch.context() as patch:
        patch.setattr(catalog_schema, "MIGRATIONS", latest[:7])
        with Catalog(path) as old:
            old.save_restore(
                _record("rr-20261124-030000-0001", RestoreMode.REVERT, RestoreStep.STARTED)
            )
            with pytest.raises(sqlite3.IntegrityError, match="CHECK constraint failed"):
                old.save_restore(
                    _record("rr-20261124-030000-0002", RestoreMode.S3, RestoreStep.PLANNED)
                )

    with Catalog(path) as catalog:
        assert catalog.schema_version == len(latest)
        kept = catalog.get_restore("rr-20261124-030000-0001")
        assert kept.mode is RestoreMode.REVERT and kept.node("node1").step is RestoreStep.STARTED
        catalog.save_restore(
            _record("rr-20261124-030000-0003", RestoreMode.S3, RestoreStep.DOWNLOADED)
        )
        from_s3 = catalog.get_restore("rr-20261124-030000-0003")
        assert from_s3.mode is RestoreMode.S3
        assert from_s3.node("node1").step is RestoreStep.DOWNLOADED
        assert {r.id for r in catalog.open_restores()} == {
            "rr-20261124-030000-0001",
            "rr-20261124-030000-0003",
        }
        indexes = {
            row[0]
            for row in catalog._connection().execute(
                "SELECT name FROM sqlite_schema WHERE type = 'index' AND tbl_name = 'restores'"
            )
        }
        assert {"restores_by_cluster", "restores_by_time", "restores_open"} <= indexes
