"""`ringsnap status` for restores from S3 left half-way: the line says the restore is from S3 and each
node's exact next step (resume, or what to remove to give it up), read from a real catalog; a table
restore from S3 says so too."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.cli.restore_report import open_restores_lines
from ringsnap.coordinator.restore.workflow import RestoreFailed
from ringsnap.coordinator.table_restore.model import Step, TableRestoreState
from tests.support.s3_restore_fakes import S3, S3Rig
from tests.unit.test_table_restore_cli import RECORD


def test_status_shows_an_s3_restore_left_half_way_with_each_nodes_next_step(
    tmp_path: Path,
) -> None:
    rig = S3Rig()
    rig.s3["node3"].fail["install"] = OSError("No space left on device")
    with pytest.raises(RestoreFailed):
        asyncio.run(rig.workflow().run(rig.plan(S3), "me"))
    failed = rig.journal.saved[-1]
    catalog_file = tmp_path / "catalog.db"
    with Catalog(catalog_file) as catalog:
        catalog.save_restore(replace(failed, id="rs-20261124-050000-abcd"))
        catalog.save_table_restore(
            replace(RECORD, state=TableRestoreState.FAILED, step=Step.STAGE, from_s3=True)
        )
    config = tmp_path / "coordinator.toml"
    config.write_text(f'[coordinator]\ncatalog = "{catalog_file}"\n')

    lines = list(open_restores_lines(config))

    assert lines[0].startswith(
        f"restore rs-20261124-050000-abcd of backup rs-1 ({failed.cluster}) from S3: failed:"
    )
    assert "No space left on device" in lines[0]
    by_node = {line.split()[0]: line for line in lines[1:4]}
    assert "(last step: stopped)" in by_node["node3"]
    assert "Cassandra is STOPPED" in by_node["node3"] and "--resume" in by_node["node3"]
    assert "(last step: restored)" in by_node["node1"]
    assert "install the backup's commit log" in by_node["node1"]
    assert lines[4].startswith(f"table restore {RECORD.id} of backup rs-1 (prod) from S3: failed")
