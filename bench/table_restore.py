"""Table restore time against the table's size, on the real 3-node sandbox (ONTAP simulator).

For each size: a table of that many rows (RF=3, 1 KiB of random hex each), a backup, TRUNCATE, then a table
restore to verified; prints the total and the time per step (clone, mount, stage, unmount,
delete-clones, schema, import, verify, cleanup) and the bytes staged per node.

    .venv/bin/python -m bench.table_restore [--rows 20000 --rows 100000] [--array ontap]
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import tempfile
from pathlib import Path

from cassandra import ConsistencyLevel
from cassandra.concurrent import execute_concurrent_with_args

from ringsnap.coordinator.assembly import open_coordinator
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.scheduler import BackupRequest
from ringsnap.coordinator.table_restore.model import (
    TableRestoreRecord,
    TableRestoreRequest,
    TableRestoreState,
)
from ringsnap.coordinator.table_restore.session import open_table_restore_session
from ringsnap.logs import configure
from ringsnap.sandbox.cluster import SandboxCluster
from ringsnap.sandbox.stack import CLUSTER_NAME, running_stack

KEYSPACE = "bench_table_restore"
STEPS = ("clone", "mount", "stage", "unmount", "delete-clones", "schema", "import", "verify")


def _fill(cluster: SandboxCluster, table: str, rows: int) -> None:
    session = cluster.session()
    session.execute(
        f"CREATE KEYSPACE IF NOT EXISTS {KEYSPACE} WITH replication ="
        " {'class': 'SimpleStrategy', 'replication_factor': 3}",
        timeout=120,
    )
    session.execute(f"DROP TABLE IF EXISTS {KEYSPACE}.{table}", timeout=120)
    session.execute(f"CREATE TABLE {KEYSPACE}.{table} (id int PRIMARY KEY, v text)", timeout=120)
    insert = session.prepare(f"INSERT INTO {KEYSPACE}.{table} (id, v) VALUES (?, ?)")
    insert.consistency_level = ConsistencyLevel.QUORUM
    # Random hex: LZ4 leaves about half of it, as with real data (a constant would vanish).
    execute_concurrent_with_args(
        session, insert, [(i, secrets.token_hex(512)) for i in range(rows)], concurrency=64
    )


async def _round(
    config: CoordinatorConfig, cluster: SandboxCluster, table: str
) -> TableRestoreRecord:
    async with open_coordinator(config, source="<bench>") as coordinator:
        backup = await coordinator.backup(BackupRequest(CLUSTER_NAME, trigger="bench"))
    cluster.session().execute(f"TRUNCATE {KEYSPACE}.{table}", timeout=120)
    catalog = Catalog(config.coordinator.catalog)
    try:
        async with open_table_restore_session(config, CLUSTER_NAME, catalog=catalog) as session:
            plan = await session.plan(
                TableRestoreRequest(
                    backup_id=backup.id, keyspace=KEYSPACE, tables=(table,), requested_by="bench"
                )
            )
            if plan.refused:
                raise SystemExit("refused: " + "; ".join(plan.refusals))
            return await session.run(plan, None)
    finally:
        catalog.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, action="append")
    parser.add_argument("--array", default="ontap")
    parser.add_argument("--instance", default="bench-trestore")
    args = parser.parse_args()
    sizes = args.rows or [20_000, 100_000]
    configure(json=True, level="error")

    with (
        SandboxCluster(args.instance, nodes=3, jit="full") as cluster,
        tempfile.TemporaryDirectory(prefix="ringsnap-bench-") as scratch,
        running_stack(cluster, Path(scratch), vendor=args.array) as stack,
    ):
        config = stack.coordinator_config()
        print(f"{'rows':>8} {'MiB/node':>9} {'total s':>8}  " + " ".join(f"{s:>8}" for s in STEPS))
        for rows in sizes:
            table = f"t{rows}"
            _fill(cluster, table, rows)
            record = asyncio.run(_round(config, cluster, table))
            if record.state is not TableRestoreState.SUCCEEDED:
                raise SystemExit(f"{rows} rows: {record.state.value}: {record.error}")
            total = (record.finished_at - record.started_at).total_seconds()  # type: ignore[operator]
            staged = max(sum(t.staged_bytes for t in n.tables) for n in record.nodes)
            steps = " ".join(f"{record.timings.get(s, 0.0):8.2f}" for s in STEPS)
            print(f"{rows:>8} {staged / 2**20:>9.1f} {total:>8.2f}  {steps}", flush=True)
        cluster.session().execute(f"DROP KEYSPACE {KEYSPACE}", timeout=120)


if __name__ == "__main__":
    main()
