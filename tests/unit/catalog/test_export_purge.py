"""Retention of the copies and the purge, against moto's in-process S3: the copy of a backup the
catalog no longer holds is removed (manifest, commit log, mirror, record), then exactly the
components no kept copy references, in bulk; refused while an export of the cluster runs.
(The proof on a real store and ring: tests/integration/test_s3_copy.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from moto import mock_aws

from ringsnap.agent.manifest import manifest
from ringsnap.agent.s3.client import make_client
from ringsnap.agent.s3.commitlog import export_commitlog
from ringsnap.agent.s3.export import export_node
from ringsnap.agent.s3.layout import Layout
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.export.model import ExportRecord, ExportRefused, ExportState, NodeExport
from ringsnap.coordinator.export.retention import purge_cluster
from ringsnap.sandbox.sstables import table_directory, write_sstable
from tests.unit.catalog.conftest import begin, finish, node

T0 = datetime(2026, 11, 24, 3, 0, tzinfo=UTC)
SETTINGS = S3Settings(bucket="ringsnap-purge", prefix="copies/")
LAYOUT = Layout(SETTINGS.prefix)


@pytest.fixture
def s3() -> Iterator[Any]:
    with mock_aws():
        client = make_client(SETTINGS)
        client.create_bucket(Bucket=SETTINGS.bucket)
        yield client


def _keys(s3: Any, under: str) -> set[str]:
    return {
        item["Key"]
        for page in s3.get_paginator("list_objects_v2").paginate(
            Bucket=SETTINGS.bucket, Prefix=SETTINGS.prefix + under
        )
        for item in page.get("Contents", ())
    }


def _export(s3: Any, catalog: Catalog, backup_id: str, root: Path, commitlog: Path) -> None:
    export_commitlog(s3, SETTINGS, backup_id=backup_id, node="n1", directory=commitlog)
    export_node(
        s3,
        SETTINGS,
        backup_id=backup_id,
        node="n1",
        data_directories=[root],
        manifest=lambda: manifest([root], cache=None),
    )
    nodes = [node("n1", "a1")]
    begin(catalog, backup_id, nodes)
    finish(catalog, backup_id, nodes)
    catalog.save_export(
        ExportRecord(
            backup_id=backup_id,
            cluster="c1",
            started_at=T0,
            nodes=(NodeExport("n1", exported=True),),
            state=ExportState.SUCCEEDED,
        )
    )


def test_purge_after_retention(s3: Any, tmp_path: Path) -> None:
    root, commitlog = tmp_path / "data", tmp_path / "commitlog"
    commitlog.mkdir()
    (commitlog / "CommitLog-8-1.log").write_bytes(b"x" * 1000)
    table = table_directory(root)
    for generation in (1, 2):
        write_sstable(table, generation, 10_000)
    with Catalog(tmp_path / "c.db") as catalog:
        _export(s3, catalog, "rs-1", root, commitlog)
        first = _keys(s3, "sstables/")
        for path in table.glob("nb-1-big-*"):
            path.unlink()  # compacted away
        write_sstable(table, 3, 10_000)
        _export(s3, catalog, "rs-2", root, commitlog)
        only_first = {k for k in first if "/nb-1-big-" in k}
        assert len(only_first) == 8
        catalog.delete_backup("rs-1", reason="retention (test)")

        dry = purge_cluster(
            s3,
            SETTINGS.bucket,
            LAYOUT,
            catalog,
            "c1",
            nodes=["n1"],
            dry_run=True,
            min_age_seconds=0,
        )
        assert dry.components.deleted == 8 and _keys(s3, "sstables/") >= first
        assert catalog.find_export("rs-1") is not None, "a dry run changes nothing"

        result = purge_cluster(
            s3, SETTINGS.bucket, LAYOUT, catalog, "c1", nodes=["n1"], min_age_seconds=0
        )
        assert result.copies_removed == ["rs-1"] and result.copies_kept == 1
        assert result.components.deleted == 8 and result.components.delete_requests == 1
        assert not _keys(s3, "sstables/") & only_first
        assert _keys(s3, "sstables/") == (first - only_first) | {
            k for k in _keys(s3, "sstables/") if "/nb-3-big-" in k
        }
        assert not _keys(s3, "backups/rs-1/") and not _keys(s3, "commitlog/n1/rs-1/")
        assert _keys(s3, "backups/rs-2/") and _keys(s3, "commitlog/n1/rs-2/")
        assert catalog.find_export("rs-1") is None

        # Never while an export of the cluster runs (or was interrupted).
        catalog.save_export(
            ExportRecord(
                backup_id="rs-2",
                cluster="c1",
                started_at=T0,
                nodes=(NodeExport("n1", exported=True),),
                state=ExportState.RUNNING,
            )
        )
        with pytest.raises(ExportRefused, match="rs-2"):
            purge_cluster(s3, SETTINGS.bucket, LAYOUT, catalog, "c1", nodes=["n1"])
