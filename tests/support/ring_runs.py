"""What the integration tests run on the sandbox ring again and again, in the test's own process
and the way the CLI runs it: a backup that must complete, a restore, a drill and a table restore,
each planned (the plan must not refuse) and run; the proof every restored node must show; a
keyspace or a scratch table replicated on the ring; when a node's container last started."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from collections.abc import Iterator
from typing import Any

from ringsnap.coordinator.assembly import open_coordinator
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.drill.model import DrillRecord
from ringsnap.coordinator.drill.plan import DrillRequest
from ringsnap.coordinator.drill.session import open_drill_session
from ringsnap.coordinator.model import (
    Backup,
    BackupState,
    NodeVerdict,
    RestoreMode,
    RestoreRecord,
    RestoreState,
    RestoreStep,
)
from ringsnap.coordinator.restore.plan import RestoreRequest
from ringsnap.coordinator.restore.session import open_restore_session
from ringsnap.coordinator.scheduler import BackupRequest
from ringsnap.coordinator.table_restore.model import TableRestoreRecord, TableRestoreRequest
from ringsnap.coordinator.table_restore.session import open_table_restore_session
from ringsnap.sandbox.cluster import SandboxCluster
from ringsnap.sandbox.stack import CLUSTER_NAME


def complete_backup(config: CoordinatorConfig, *, policy: str = "") -> Backup:
    """A backup of the sandbox cluster by a coordinator of `config`; it must complete."""

    async def run() -> Backup:
        async with open_coordinator(config, source="<test>") as coordinator:
            return await coordinator.backup(
                BackupRequest(CLUSTER_NAME, trigger="test", policy=policy)
            )

    backup = asyncio.run(run())
    assert backup.state is BackupState.COMPLETE, backup.error
    return backup


def run_restore(
    config: CoordinatorConfig,
    backup_id: str,
    *,
    nodes: tuple[str, ...] = (),
    mode: RestoreMode = RestoreMode.REVERT,
    on_step: Any = None,
) -> RestoreRecord:
    async def run() -> RestoreRecord:
        async with open_restore_session(config, CLUSTER_NAME) as session:
            plan = await session.plan(RestoreRequest(backup_id, nodes, mode, requested_by="test"))
            assert not plan.refused, plan.refusals
            progress = on_step or (lambda *_: None)
            return await session.run(plan, "test", progress)

    return asyncio.run(run())


def assert_proven(record: RestoreRecord) -> None:
    report = {n.name: (n.verdict.value, n.proof, n.unproven) for n in record.nodes}
    assert record.state is RestoreState.PROVEN, (record.error, report)
    for node in record.nodes:
        assert node.verdict is NodeVerdict.PROVEN, report
        assert node.step is RestoreStep.VERIFIED
        assert any("pre-restore canary is gone" in line for line in node.proof), report
        assert any(line.startswith("manifest: all") for line in node.proof), report


def run_drill(
    config: CoordinatorConfig,
    progress: Any = None,
    *,
    backup_id: str = "",
    nodes: tuple[str, ...] = (),
) -> DrillRecord:
    """`ringsnap drill [BACKUP] --ring | --nodes ...`, as the command runs it in its own process."""

    async def run() -> DrillRecord:
        with Catalog(config.coordinator.catalog) as catalog:
            async with open_drill_session(config, CLUSTER_NAME, catalog=catalog) as session:
                request = DrillRequest(
                    cluster=CLUSTER_NAME,
                    backup_id=backup_id,
                    nodes=nodes,
                    ring=not nodes,
                    trigger="cli:test",
                    requested_by="test",
                )
                plan = await session.plan(request)
                assert not plan.refused, plan.refusals
                return await session.run(plan, request, progress)

    return asyncio.run(run())


def run_table_restore(
    config: CoordinatorConfig, request: TableRestoreRequest
) -> TableRestoreRecord:
    async def run() -> TableRestoreRecord:
        catalog = Catalog(config.coordinator.catalog)
        try:
            async with open_table_restore_session(config, CLUSTER_NAME, catalog=catalog) as session:
                plan = await session.plan(request)
                assert not plan.refused, plan.refusals
                return await session.run(plan, None)
        finally:
            catalog.close()

    return asyncio.run(run())


def create_keyspace(session: Any, keyspace: str, *, replication_factor: int = 3) -> None:
    """`keyspace` (SimpleStrategy) unless it exists."""
    session.execute(
        f"CREATE KEYSPACE IF NOT EXISTS {keyspace} WITH replication ="
        f" {{'class': 'SimpleStrategy', 'replication_factor': {replication_factor}}}",
        timeout=120,
    )


@contextlib.contextmanager
def scratch_table(
    cluster: SandboxCluster,
    keyspace: str,
    table: str,
    columns: str = "id int PRIMARY KEY, body text",
) -> Iterator[None]:
    """`keyspace.table` on the ring (RF 3) for the duration; the keyspace is dropped afterwards,
    with patience (a node restarted by the last test may still be reconnecting)."""
    session = cluster.session()
    create_keyspace(session, keyspace)
    session.execute(f"CREATE TABLE IF NOT EXISTS {keyspace}.{table} ({columns})")
    try:
        yield
    finally:
        for attempt in range(5):
            try:
                session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=60)
                break
            except Exception:
                if attempt == 4:
                    raise
                time.sleep(5)


def started_at(cluster: SandboxCluster, node: str) -> str:
    """When the node's container last started, as docker says it."""
    info = cluster.node(node)
    return subprocess.run(
        ["docker", "inspect", "--format", "{{.State.StartedAt}}", info.container_name],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
