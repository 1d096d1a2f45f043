"""Table-level restores on the real 3-node sandbox, live: a table TRUNCATEd and a table DROPped by
mistake are brought back from an array backup (ONTAP simulator, clones of the reflink LUN
snapshots mounted read-only by the real agents over mutual TLS) while a QUORUM write load runs on
another table, with no node stopped; then a copy `--as` a new table; then a node restarted after
the import (commit-log replay over the truncation record) still has the rows.

The backup is drilled first (every node on its clones, isolated on the drill host): the drill
counts each table's rows over each node's primary ranges, and each restore's verification compares
its own count on the live ring with them, node by node. The TRUNCATEd table is restored in this
process; the DROPped one by `ringsnap restore` while the coordinator daemon holds the catalog (the
restore then runs in the daemon, through its API).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cassandra import ConsistencyLevel
from cassandra.cluster import Cluster
from cassandra.concurrent import execute_concurrent_with_args
from cassandra.policies import WhiteListRoundRobinPolicy
from cassandra.query import SimpleStatement

from ringsnap import mountinfo
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.drill.model import DrillRecord, DrillState
from ringsnap.coordinator.table_restore.model import (
    Step,
    TableRestoreRecord,
    TableRestoreRequest,
    TableRestoreState,
)
from ringsnap.sandbox.cluster import SandboxCluster
from ringsnap.sandbox.stack import Stack, running_stack
from tests.support.acked_writes import AckedWriter
from tests.support.ring_runs import (
    complete_backup,
    create_keyspace,
    run_drill,
    run_table_restore,
)

pytestmark = pytest.mark.integration

KEYSPACE = "table_restore_test"
ROWS = 3000


def _ids(session: Any, table: str, *, consistency: int = ConsistencyLevel.ALL) -> set[int]:
    statement = SimpleStatement(
        f"SELECT id FROM {KEYSPACE}.{table}", consistency_level=consistency, fetch_size=5000
    )
    return {row.id for row in session.execute(statement, timeout=120)}


def _ids_on_each_node(cluster: SandboxCluster, table: str) -> dict[str, set[int]]:
    """The table's ids read through each node alone at CL=ONE (RF=3 on 3 nodes: every node is a
    replica of every row, and a coordinator prefers its own replica)."""
    found: dict[str, set[int]] = {}
    for node in cluster.nodes:
        alone = Cluster(
            [node.address],
            port=node.native_port,
            load_balancing_policy=WhiteListRoundRobinPolicy([node.address]),
            protocol_version=5,
        )
        try:
            found[node.name] = _ids(alone.connect(), table, consistency=ConsistencyLevel.ONE)
        finally:
            alone.shutdown()
    return found


def _counts_equal_to_the_drill(
    record: TableRestoreRecord, drill: DrillRecord, table: str, restored_as: str = ""
) -> None:
    """Every node's count of the restored table compared with the drill's of `table`, and equal."""
    for node in drill.nodes:
        rows = dict(node.row_counts)[f"{KEYSPACE}.{table}"]
        line = (
            f"ok: node {node.name}: {KEYSPACE}.{restored_as or table}: {rows} rows over the"
            f" node's primary ranges at CL=ALL, equal to the backup's (drill {drill.id})"
        )
        assert line in record.verification, record.verification


def _restore_through_the_daemon(config_file: Path, backup_id: str, table: str) -> dict[str, Any]:
    """`ringsnap restore BACKUP --keyspace K --table T --yes -o json` while the daemon holds the
    catalog: the CLI plans, confirms and follows the restore the daemon runs."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ringsnap.coordinator.cli.entry",
            "restore",
            backup_id,
            "--keyspace",
            KEYSPACE,
            "--table",
            table,
            "--yes",
            "--output",
            "json",
            "--config",
            str(config_file),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith("RINGSNAP_")},
    )
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr[-3000:])
    document: dict[str, Any] = json.loads(done.stdout)["table_restore"]
    return document


def _nothing_left(cluster: SandboxCluster, record: TableRestoreRecord) -> None:
    assert record.clones and all(c.clone and c.deleted for c in record.clones), record.clones
    mounted = [m.mount_point for m in mountinfo.read()]
    assert not [m for m in mounted if f"/clones/{record.id}" in m], mounted
    for node in cluster.nodes:
        assert not (node.data_lun.mount_point / ".ringsnap-staging" / record.id).exists()


@pytest.fixture
def ontap(sandbox_cluster: SandboxCluster, tmp_path: Path) -> Iterator[Stack]:
    with running_stack(
        sandbox_cluster, tmp_path / "stack", vendor="ontap", drill_host=True
    ) as running:
        yield running
    sandbox_cluster.wait_until_up_normal()


def test_truncated_and_dropped_tables_come_back_live_under_load(
    sandbox_cluster: SandboxCluster, ontap: Stack
) -> None:
    config = ontap.coordinator_config()
    session = sandbox_cluster.session()
    session.execute(f"DROP KEYSPACE IF EXISTS {KEYSPACE}", timeout=120)
    create_keyspace(session, KEYSPACE)
    for table in ("truncated", "dropped"):
        # A dropped column: its cells stay in the SSTables; the recreated table must know it.
        session.execute(
            f"CREATE TABLE {KEYSPACE}.{table} (id int PRIMARY KEY, v text, old text)", timeout=120
        )
        session.execute(f"ALTER TABLE {KEYSPACE}.{table} DROP old", timeout=120)
    session.execute(f"CREATE TABLE {KEYSPACE}.other (id int PRIMARY KEY, v text)", timeout=120)
    for table in ("truncated", "dropped"):
        insert = session.prepare(f"INSERT INTO {KEYSPACE}.{table} (id, v) VALUES (?, ?)")
        insert.consistency_level = ConsistencyLevel.ALL
        # Raises on the first write that fails: every row is acknowledged by all three replicas.
        execute_concurrent_with_args(
            session, insert, [(i, f"{table}-{i}") for i in range(ROWS)], concurrency=32
        )
    dropped_id = str(
        session.execute(
            "SELECT id FROM system_schema.tables WHERE keyspace_name = %s AND table_name = %s",
            (KEYSPACE, "dropped"),
        ).one()[0]
    )

    load = f"INSERT INTO {KEYSPACE}.other (id, v) VALUES (?, ?)"
    with AckedWriter(session, load, "w" * 100, pause=0.005) as writer:
        time.sleep(1)
        backup = complete_backup(config)
        with Catalog(config.coordinator.catalog, exclusive=False) as catalog:
            schema = catalog.keyspace_schema(backup.id, KEYSPACE)
        assert schema is not None and set(schema.tables()) >= {"truncated", "dropped", "other"}
        assert schema.table_id("dropped") == dropped_id

        # The drill counts each table per node over its primary ranges: they cut the ring, so
        # the nodes' counts add up to the table's rows.
        drill = run_drill(config, backup_id=backup.id)
        assert drill.state is DrillState.PROVEN, (drill.error, [n.problems for n in drill.nodes])
        for table in ("truncated", "dropped"):
            counts = [dict(n.row_counts)[f"{KEYSPACE}.{table}"] for n in drill.nodes]
            assert sum(counts) == ROWS and all(counts), (table, counts)

        # The incident: rows written after the backup, then one table truncated, one dropped.
        for table in ("truncated", "dropped"):
            insert_after = SimpleStatement(
                f"INSERT INTO {KEYSPACE}.{table} (id, v) VALUES (-1, 'after')",
                consistency_level=ConsistencyLevel.ALL,
            )
            session.execute(insert_after)
        session.execute(f"TRUNCATE {KEYSPACE}.truncated", timeout=120)
        session.execute(f"DROP TABLE {KEYSPACE}.dropped", timeout=120)
        assert not _ids(session, "truncated")

        record = run_table_restore(
            config,
            TableRestoreRequest(
                backup_id=backup.id,
                keyspace=KEYSPACE,
                tables=("truncated",),
                requested_by="test",
            ),
        )
        # The DROPped table by the CLI while the daemon holds the catalog: run by the daemon.
        with ontap.coordinator_daemon() as config_file:
            through_daemon = _restore_through_the_daemon(config_file, backup.id, "dropped")
        time.sleep(1)
    # Every write acknowledged before, during and after the restore is in the other table.
    assert writer.acked and writer.acked <= _ids(session, "other")

    with Catalog(config.coordinator.catalog, exclusive=False) as catalog:
        dropped = catalog.get_table_restore(through_daemon["id"])
    assert through_daemon["state"] == "succeeded", through_daemon
    for restored in (record, dropped):
        assert restored.state is TableRestoreState.SUCCEEDED, (
            restored.error,
            restored.verification,
        )
        assert restored.step is Step.DONE
        for node in restored.nodes:
            for tables in node.tables:
                assert tables.sstables > 0
                assert tables.imported_sstables == tables.staged_sstables == tables.sstables
    assert {t.table: t.action for t in record.targets} == {"truncated": "exists"}
    assert {t.table: t.action for t in dropped.targets} == {"dropped": "dropped"}
    assert dropped.requested_by and through_daemon["verification"] == list(dropped.verification)
    _counts_equal_to_the_drill(record, drill, "truncated")
    _counts_equal_to_the_drill(dropped, drill, "dropped")
    expected = set(range(ROWS))
    for table in ("truncated", "dropped"):
        assert _ids(session, table) == expected, table
        assert all(ids == expected for ids in _ids_on_each_node(sandbox_cluster, table).values())
    recreated = session.execute(
        "SELECT id FROM system_schema.tables WHERE keyspace_name = %s AND table_name = %s",
        (KEYSPACE, "dropped"),
    ).one()
    assert str(recreated[0]) == dropped_id
    _nothing_left(sandbox_cluster, record)
    _nothing_left(sandbox_cluster, dropped)

    # Side by side: the backup's rows of `truncated` in a new table.
    copy = run_table_restore(
        config,
        TableRestoreRequest(
            backup_id=backup.id,
            keyspace=KEYSPACE,
            tables=("truncated",),
            target=(KEYSPACE, "truncated_copy"),
            requested_by="test",
        ),
    )
    assert copy.state is TableRestoreState.SUCCEEDED, (copy.error, copy.verification)
    _counts_equal_to_the_drill(copy, drill, "truncated", "truncated_copy")
    assert _ids(session, "truncated_copy") == expected
    _nothing_left(sandbox_cluster, copy)

    # A restart replays the commit log: the imported rows stay, and no row written after the
    # backup comes back (the truncation record of `truncated`; the commit-log segments of
    # `dropped` were recycled by the DROP, so nothing replays into the table recreated with its id).
    sandbox_cluster.stop_node("node2")
    sandbox_cluster.start_node("node2")
    sandbox_cluster.wait_until_up_normal()
    session = sandbox_cluster.session()
    for table in ("truncated", "dropped", "truncated_copy"):
        assert _ids(session, table) == expected, table
    assert _ids_on_each_node(sandbox_cluster, "truncated")["node2"] == expected
    session.execute(f"DROP KEYSPACE {KEYSPACE}", timeout=120)
