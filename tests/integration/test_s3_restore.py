"""Restores of the real 3-node sandbox from a backup's copy on a real S3 server (S3Proxy), with the
array's snapshots gone: a TRUNCATEd table restored from the bucket into the live ring, a corrupted
object refused before anything is stopped, then the whole ring restored from the bucket and proven
by its canaries.

The bucket is filled by the coordinator's export (`ringsnap export`: clones mounted read-only on
each node, SSTables and commit-log segments uploaded, the catalog mirrored); the ring is restored by
a fresh coordinator whose catalog was rebuilt from the bucket alone.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cassandra import ConsistencyLevel
from cassandra.query import SimpleStatement

from ringsnap.agent.restore.record import REPLACED_DIRECTORY
from ringsnap.agent.s3.client import make_client
from ringsnap.agent.s3.layout import Layout
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.agent.staging.s3_paths import STAGING_DIRECTORY
from ringsnap.config import validate
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.export.model import ExportState
from ringsnap.coordinator.export.rebuild_cli import rebuild_command
from ringsnap.coordinator.export.session import open_export_session
from ringsnap.coordinator.model import (
    Backup,
    RestoreMode,
    RestoreRecord,
    RestoreState,
    RestoreStep,
)
from ringsnap.coordinator.restore.abort import abort_in_session
from ringsnap.coordinator.restore.plan import RestoreRequest
from ringsnap.coordinator.restore.session import open_restore_session
from ringsnap.coordinator.restore.workflow import RestoreFailed
from ringsnap.coordinator.table_restore.model import (
    TableRestoreRecord,
    TableRestoreRequest,
    TableRestoreState,
)
from ringsnap.sandbox import services
from ringsnap.sandbox.cluster import SandboxCluster
from ringsnap.sandbox.s3proxy import S3Server, running_s3proxy
from ringsnap.sandbox.stack import CLUSTER_NAME, Stack, running_stack
from tests.support.acked_writes import backup_under_writes, ids_at_all
from tests.support.late_table import assert_moved_aside, create_late_table
from tests.support.ring_runs import (
    assert_proven,
    create_keyspace,
    run_table_restore,
    started_at,
)
from tests.support.s3_bucket import fresh_bucket, with_s3

pytestmark = pytest.mark.integration

TABLES = "s3_table_test"
ROWS = 500


@pytest.fixture(scope="module")
def s3_server() -> Iterator[S3Server]:
    with running_s3proxy() as server:
        yield server


@pytest.fixture
def s3_table(s3_server: S3Server, tmp_path: Path) -> dict[str, Any]:
    keys = tmp_path / "s3-keys"
    keys.mkdir()
    return fresh_bucket(s3_server, keys)


@pytest.fixture
def s3_stack(
    sandbox_cluster: SandboxCluster, tmp_path: Path, s3_table: dict[str, Any]
) -> Iterator[Stack]:
    with running_stack(sandbox_cluster, tmp_path / "stack", vendor="ontap", s3=s3_table) as stack:
        yield stack
    sandbox_cluster.wait_until_up_normal()


def _export(config: CoordinatorConfig, backup: Backup) -> None:
    async def run() -> None:
        catalog = Catalog(config.coordinator.catalog)
        try:
            async with open_export_session(config, CLUSTER_NAME, catalog=catalog) as session:
                record = await session.export(backup.id, parallel_nodes=3)
                assert record.state is ExportState.SUCCEEDED, record
                assert all(n.commitlog_segments > 0 for n in record.nodes), record.nodes
        finally:
            catalog.close()

    asyncio.run(run())


def _fresh_coordinator(stack: Stack, s3_table: dict[str, Any], workdir: Path) -> CoordinatorConfig:
    """A new coordinator whose catalog is rebuilt from the bucket alone."""
    data = with_s3(stack, s3_table, catalog=workdir / "fresh" / "catalog.db")
    config_file = workdir / "fresh.toml"
    config_file.write_text(services.toml_document(data, "a new coordinator"))
    assert rebuild_command(config_file, "s3", merge=False) == 0
    return validate(data, CoordinatorConfig, source="<fresh>")


def _delete_array_snapshots(config: CoordinatorConfig, backup: Backup) -> None:
    """The array is 'lost': the backup's snapshots are deleted on it."""

    async def run() -> None:
        async with open_restore_session(config, CLUSTER_NAME) as session:
            for ref in backup.snapshots:
                await session.arrays[ref.array].delete_snapshot(ref)

    asyncio.run(run())


def _restore_from_s3(config: CoordinatorConfig, backup_id: str) -> RestoreRecord:
    async def run() -> RestoreRecord:
        async with open_restore_session(config, CLUSTER_NAME) as session:
            plan = await session.plan(
                RestoreRequest(backup_id, (), RestoreMode.S3, requested_by="t")
            )
            assert not plan.refused, plan.refusals
            assert not plan.arrays
            return await session.run(plan, "test", lambda *_: None)

    return asyncio.run(run())


def _abort(config: CoordinatorConfig, restore_id: str) -> RestoreRecord:
    async def run() -> RestoreRecord:
        async with open_restore_session(config, CLUSTER_NAME) as session:
            return await abort_in_session(session, restore_id, "test", lambda *_: None)

    return asyncio.run(run())


def _table_restore_from_s3(config: CoordinatorConfig, backup_id: str) -> TableRestoreRecord:
    request = TableRestoreRequest(
        backup_id=backup_id,
        keyspace=TABLES,
        tables=("restored",),
        requested_by="test",
        from_s3=True,
    )
    return run_table_restore(config, request)


def _ids_of(session: Any, table: str) -> set[int]:
    statement = SimpleStatement(
        f"SELECT id FROM {TABLES}.{table}", consistency_level=ConsistencyLevel.ALL, fetch_size=5000
    )
    return {row.id for row in session.execute(statement, timeout=120)}


def _tables_before_the_backup(cluster: SandboxCluster) -> Any:
    session = cluster.session()
    session.execute(f"DROP KEYSPACE IF EXISTS {TABLES}", timeout=120)
    create_keyspace(session, TABLES)
    for table in ("restored", "other"):
        session.execute(f"CREATE TABLE {TABLES}.{table} (id int PRIMARY KEY, v text)", timeout=120)
    insert = session.prepare(f"INSERT INTO {TABLES}.restored (id, v) VALUES (?, ?)")
    insert.consistency_level = ConsistencyLevel.ALL
    for i in range(ROWS):
        session.execute(insert, (i, f"row-{i}"))
    return session


def test_ring_restored_from_s3_with_the_array_lost_and_a_corrupt_object_refused(
    sandbox_cluster: SandboxCluster,
    s3_stack: Stack,
    s3_table: dict[str, Any],
    s3_server: S3Server,
    tmp_path: Path,
) -> None:
    config = validate(with_s3(s3_stack, s3_table), CoordinatorConfig, source="<test>")
    settings = S3Settings.model_validate(s3_table)
    session = _tables_before_the_backup(sandbox_cluster)
    backup, acked_before, begun_after = backup_under_writes(sandbox_cluster, config)
    _export(config, backup)
    _delete_array_snapshots(config, backup)

    # A table TRUNCATEd, restored from the bucket into the live ring; the other keeps its writes.
    insert = session.prepare(f"INSERT INTO {TABLES}.other (id, v) VALUES (?, ?)")
    insert.consistency_level = ConsistencyLevel.ALL
    for i in range(50):
        session.execute(insert, (i, "after the backup"))
    session.execute(f"TRUNCATE {TABLES}.restored", timeout=120)
    assert not _ids_of(session, "restored")
    running = {n.name: started_at(sandbox_cluster, n.name) for n in sandbox_cluster.nodes}

    table = _table_restore_from_s3(config, backup.id)

    assert table.state is TableRestoreState.SUCCEEDED, (table.error, table.verification)
    assert table.from_s3 and not table.clones
    assert _ids_of(session, "restored") == set(range(ROWS))
    assert _ids_of(session, "other") == set(range(50))
    assert running == {n.name: started_at(sandbox_cluster, n.name) for n in sandbox_cluster.nodes}

    # The coordinator is lost too: a new one rebuilds its catalog from the bucket.
    config = _fresh_coordinator(s3_stack, s3_table, tmp_path)

    # A Data.db object of node2 corrupted in the bucket by hand (same size, other bytes).
    layout = Layout(settings.prefix)
    keys = [
        item["Key"]
        for page in make_client(settings)
        .get_paginator("list_objects_v2")
        .paginate(Bucket=settings.bucket, Prefix=layout.sstables_prefix("node2"))
        for item in page.get("Contents", ())
        if item["Key"].split("/")[-1].startswith("Data.db-") and item["Size"] > 0
    ]
    corrupt = keys[0]
    path = s3_server.object_path(settings.bucket, corrupt)
    original = path.read_bytes()
    path.write_bytes(bytes(b ^ 0xFF for b in original[:64]) + original[64:])
    started = {n.name: started_at(sandbox_cluster, n.name) for n in sandbox_cluster.nodes}

    with pytest.raises(RestoreFailed) as refused:
        _restore_from_s3(config, backup.id)

    assert corrupt in str(refused.value), str(refused.value)
    record = refused.value.record
    assert record is not None
    assert all(n.step.order < RestoreStep.STOPPED.order for n in record.nodes), record.nodes
    # Cassandra was never stopped on any node.
    assert started == {n.name: started_at(sandbox_cluster, n.name) for n in sandbox_cluster.nodes}
    # What verified stays staged for a resume; the operator gives this restore up instead
    # (`ringsnap restore --abort`): each node's agent removes its staging, nothing else.
    for node in sandbox_cluster.nodes:
        staging = node.data_dir / STAGING_DIRECTORY / record.id
        assert staging.is_dir() and (node.name == "node2" or any(staging.rglob("*-Data.db")))
    aborted = _abort(config, record.id)
    assert aborted.state is RestoreState.ABORTED, (aborted.error, aborted.nodes)
    for node in sandbox_cluster.nodes:
        assert not (node.data_dir / STAGING_DIRECTORY / record.id).exists(), node.name
        assert any(
            line.startswith(f"node {node.name}: removed {node.data_dir}")
            for line in aborted.warnings
        ), aborted.warnings
    assert started == {n.name: started_at(sandbox_cluster, n.name) for n in sandbox_cluster.nodes}

    # The object repaired, the ring comes back from the bucket alone.
    path.write_bytes(original)
    late = create_late_table(sandbox_cluster)
    began = time.monotonic()
    restored = _restore_from_s3(config, backup.id)
    print(f"restore from S3 of the ring: {time.monotonic() - began:.1f} s")
    print("  phases: " + ", ".join(f"{t.phase} {t.seconds:.1f} s" for t in restored.timings))

    assert_proven(restored)
    sandbox_cluster.refresh()
    ids = ids_at_all(sandbox_cluster)
    assert acked_before <= ids, f"{len(acked_before - ids)} acknowledged rows did not come back"
    assert not (begun_after & ids), f"{len(begun_after & ids)} rows written after the backup"
    # A table created after the backup ends as from native snapshots (test_restore_native).
    assert_moved_aside(sandbox_cluster, late, restored.id)
    # What the install replaced is kept beside each table, never deleted; the staging is gone.
    for node in sandbox_cluster.nodes:
        kept = list(node.data_dir.glob(f"*/*/{REPLACED_DIRECTORY}/{restored.id}"))
        assert any(any(p.iterdir()) for p in kept), node.name
        assert not (node.data_dir / STAGING_DIRECTORY / restored.id).exists()
        # As an operator once the restore is proven: the kept files go.
        for directory in kept:
            shutil.rmtree(directory)
