"""A whole-ring restore of the real 3-node sandbox from Cassandra's native snapshots: the cluster
as direct-attached storage (`snapshots = "native"`, no array volumes), a backup taken under a write
load, rows written after it (and a table created after it), then every node restored in place
from its own snapshot and proven.

Real Cassandra, real agents over mutual TLS moving and hard-linking real table directories, the
real backup and restore workflows; the acknowledged rows are the ground truth.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from ringsnap.config import validate
from ringsnap.coordinator.assembly import open_coordinator
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.model import RestoreState, SnapshotKind, Verification
from ringsnap.sandbox.cluster import SandboxCluster
from ringsnap.sandbox.stack import Stack, running_stack
from tests.support.acked_writes import backup_under_writes, ids_at_all
from tests.support.late_table import assert_moved_aside, create_late_table
from tests.support.ring_runs import assert_proven, run_restore

pytestmark = pytest.mark.integration

REPLACED = ".ringsnap-replaced"


@pytest.fixture
def stack(sandbox_cluster: SandboxCluster, tmp_path: Path) -> Iterator[Stack]:
    with running_stack(sandbox_cluster, tmp_path / "stack") as running:
        yield running
    sandbox_cluster.wait_until_up_normal()


def native_config(stack: Stack) -> CoordinatorConfig:
    """The stack's coordinator config, its cluster on direct-attached storage: no volumes."""
    data = stack.coordinator_data()
    cluster = data["clusters"][0]
    cluster["snapshots"] = "native"
    for node in cluster["nodes"]:
        del node["volumes"]
    return validate(data, CoordinatorConfig, source="<native sandbox>")


def _snapshot_directories(cluster: SandboxCluster, tag: str) -> list[Path]:
    return [p for node in cluster.nodes for p in node.data_dir.glob(f"*/*/snapshots/{tag}")]


def _replaced_directories(cluster: SandboxCluster, restore_id: str) -> list[Path]:
    return [p for node in cluster.nodes for p in node.data_dir.glob(f"*/*/{REPLACED}/{restore_id}")]


def test_whole_ring_restore_from_native_snapshots_brings_back_exactly_the_backup(
    sandbox_cluster: SandboxCluster, stack: Stack
) -> None:
    config = native_config(stack)
    backup, acked_before, begun_after = backup_under_writes(sandbox_cluster, config)
    assert backup.snapshot_kind is SnapshotKind.NATIVE and backup.snapshots == ()
    for node in sandbox_cluster.nodes:
        assert any(node.data_dir.glob(f"*/*/snapshots/{backup.id}")), node.name
    late = create_late_table(sandbox_cluster)

    record = run_restore(config, backup.id)

    assert_proven(record)
    # A table created after the backup ends as from S3 (test_s3_restore): its files kept aside.
    assert_moved_aside(sandbox_cluster, late, record.id)
    sandbox_cluster.refresh()
    ids = ids_at_all(sandbox_cluster)
    assert acked_before <= ids, f"{len(acked_before - ids)} acknowledged rows did not come back"
    assert not (begun_after & ids), f"{len(begun_after & ids)} rows written after the backup"
    with Catalog(config.coordinator.catalog, exclusive=False) as catalog:
        stored = catalog.get_backup(backup.id)
        assert stored.verification is Verification.PROVEN and stored.verified_by == record.id
        assert catalog.get_restore(record.id).state is RestoreState.PROVEN
    steps = {step for node in record.nodes for step, _ in node.step_seconds}
    assert "restored" in steps and not steps & {"released", "attached"}
    # What the nodes held before the restore is kept beside each table, on every node.
    replaced = _replaced_directories(sandbox_cluster, record.id)
    assert {p.parents[3] for p in replaced} == {n.data_dir for n in sandbox_cluster.nodes}
    assert any(any(p.iterdir()) for p in replaced)

    # As an operator once the restore is proven: the kept files go, the backup is deleted (which
    # clears its snapshot on every node); the cluster is left as it was found.
    for path in replaced:
        shutil.rmtree(path)
    _delete(config, backup.id)
    assert _snapshot_directories(sandbox_cluster, backup.id) == []


def _delete(config: CoordinatorConfig, backup_id: str) -> None:
    async def run() -> None:
        async with open_coordinator(config, source="<test>") as coordinator:
            await coordinator.delete_backup(backup_id, "test done")
            assert await coordinator.run_pending_cleanups() == 0

    asyncio.run(run())
