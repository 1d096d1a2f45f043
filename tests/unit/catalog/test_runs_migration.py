"""Migration 10 (the run engine's records and resource ledger; exports may be interrupted): a
version-9 catalog keeps its exports readable, and gains the runs and the ledger."""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from pydantic import TypeAdapter

from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.catalog import schema as catalog_schema
from ringsnap.coordinator.export.model import ExportRecord, ExportState, NodeExport, NodeStep
from ringsnap.coordinator.runs.resources import Resource, ResourceType

_EXPORT = ExportRecord(
    backup_id="rs-20260101T000000Z-0001",
    cluster="c1",
    started_at=datetime(2026, 1, 1, tzinfo=UTC),
    nodes=(NodeExport("n1", step=NodeStep.EXPORT, exported=True), NodeExport("n2")),
    state=ExportState.FAILED,
    error="node n2: clone: array a1: HTTP 500",
)


def version_9_catalog(path: Path, export: ExportRecord) -> None:
    raw = sqlite3.connect(path)
    for migration in catalog_schema.MIGRATIONS[:9]:
        raw.executescript(migration.sql)
        raw.execute(f"INSERT INTO schema_version VALUES ({migration.version}, 'v', 0)")
    raw.execute(f"PRAGMA application_id = {catalog_schema.APPLICATION_ID}")
    raw.execute(
        "INSERT INTO exports (backup_id, cluster, state, started_us, finished_us, document)"
        " VALUES (?, ?, ?, 1, 2, ?)",
        (
            export.backup_id,
            export.cluster,
            export.state.value,
            TypeAdapter(ExportRecord).dump_json(export).decode(),
        ),
    )
    raw.commit()
    raw.close()


def test_a_version_9_catalog_keeps_its_exports_and_gains_runs_and_the_ledger(
    tmp_path: Path,
) -> None:
    path = tmp_path / "catalog.db"
    version_9_catalog(path, _EXPORT)
    with Catalog(path) as catalog:
        assert catalog.schema_version == len(catalog_schema.MIGRATIONS) >= 10
        assert catalog.get_export(_EXPORT.backup_id) == _EXPORT
        assert catalog.list_exports("c1") == [_EXPORT]
        entry = catalog.add_resource(
            Resource(
                type=ResourceType.CLONE,
                cluster="c1",
                run_id="x",
                run_kind="export",
                reason="r",
                array="a1",
                name_hint="rsx_1",
            )
        )
        assert catalog.resources("x") == [entry]
        catalog.save_run_document("x", "export", "c1", "running", "{}")
        assert catalog.find_run_document("x") == "{}"


def test_an_export_found_running_at_open_is_marked_interrupted(tmp_path: Path) -> None:
    path = tmp_path / "catalog.db"
    running = replace(_EXPORT, state=ExportState.RUNNING, error="")
    version_9_catalog(path, running)
    with Catalog(path) as catalog:
        assert catalog.interrupted_exports() == [running.backup_id]
        found = catalog.get_export(running.backup_id)
        assert found == replace(running, state=ExportState.INTERRUPTED)
        # Saved again by its resume, running: its coordinator dies again.
        catalog.save_export(running)
    with Catalog(path, exclusive=False) as reader:  # a reader changes nothing
        assert reader.get_export(running.backup_id).state is ExportState.RUNNING
    with Catalog(path) as catalog:
        assert catalog.interrupted_exports() == [running.backup_id]
        done = replace(running, state=ExportState.SUCCEEDED, finished_at=running.started_at)
        catalog.save_export(done)
    with Catalog(path) as catalog:
        assert catalog.interrupted_exports() == []
        assert catalog.get_export(running.backup_id) == done
