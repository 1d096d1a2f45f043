"""The demo's backup and its report: what an operator sees after `make demo`."""

from __future__ import annotations

import asyncio
from typing import Any

from rich.console import Console
from rich.table import Table

from ringsnap.coordinator.assembly import open_coordinator
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.model import Backup, RestoreRecord
from ringsnap.coordinator.scheduler import BackupRequest
from ringsnap.sandbox.load import LoadReport
from ringsnap.sandbox.stack import CLUSTER_NAME


def take_backup(config: CoordinatorConfig) -> Backup:
    async def run() -> Backup:
        async with open_coordinator(config, source="<sandbox demo>") as coordinator:
            return await coordinator.backup(BackupRequest(CLUSTER_NAME, trigger="sandbox:demo"))

    return asyncio.run(run())


def print_backup(out: Console, backup: Backup, load: LoadReport) -> None:
    window = backup.freeze_window
    out.print(f"\n[bold green]backup {backup.id}: {backup.state.value}[/bold green]")
    if window is not None:
        out.print(
            f"freeze window {window.total * 1000:.1f} ms = slowest freeze"
            f" {window.slowest_freeze * 1000:.1f} ms + array call {window.array_call * 1000:.1f} ms"
            f" + slowest thaw {window.slowest_thaw * 1000:.1f} ms + coordination"
            f" {window.overhead * 1000:.1f} ms"
        )
    out.print(f"client writes during the backup: {load.summary()}")
    phases = Table(title="phases")
    phases.add_column("phase")
    phases.add_column("seconds", justify="right")
    for timing in backup.timings:
        phases.add_row(timing.phase, f"{timing.seconds:.3f}")
    out.print(phases)
    nodes = Table(title="catalog entry: nodes")
    for column in ("node", "host id", "canary", "SSTables", "bytes", "volumes"):
        nodes.add_column(column, overflow="fold")
    for node in backup.nodes:
        nodes.add_row(
            node.name,
            node.host_id,
            node.canary_id,
            str(node.sstable_count),
            str(node.bytes),
            ", ".join(f"{v.volume} ({v.role.value})" for v in node.volumes),
        )
    out.print(nodes)
    for ref in backup.snapshots:
        out.print(
            f"snapshot on {ref.array} ({ref.driver}): {ref.snapshot_name}, one atomic group"
            f" snapshot covering {len(ref.members)} volumes"
        )
    out.print("verification: not proven yet: the restore below proves it")


def _count(session: Any, keyspace: str, table: str) -> tuple[int, int]:
    """(rows written by the demo, junk rows) read at consistency ALL."""
    from cassandra import ConsistencyLevel
    from cassandra.query import SimpleStatement

    statement = SimpleStatement(
        f"SELECT value FROM {keyspace}.{table}",  # noqa: S608 - constant names
        consistency_level=ConsistencyLevel.ALL,
        fetch_size=5000,
    )
    values = [row.value for row in session.execute(statement, timeout=60)]
    junk = sum(1 for v in values if v.startswith("junk"))
    return len(values) - junk, junk


def damage(out: Console, session: Any, keyspace: str, table: str) -> None:
    """The incident: someone truncates the table and writes junk into it."""
    session.execute(f"TRUNCATE {keyspace}.{table}", timeout=120)
    insert = session.prepare(
        f"INSERT INTO {keyspace}.{table} (id, value) VALUES (?, ?)"  # noqa: S608 - constant names
    )
    for i in range(100):
        session.execute(insert, (100_000 + i, f"junk-{i}"))
    good, junk = _count(session, keyspace, table)
    out.print(
        f"\n[bold red]incident:[/bold red] {keyspace}.{table} truncated and junk written:"
        f" {good} good rows, {junk} junk rows left"
    )


def restore_and_prove(
    out: Console,
    config: CoordinatorConfig,
    backup: Backup,
    cluster: Any,
    *,
    keyspace: str,
    table: str,
) -> RestoreRecord:
    """`ringsnap restore BACKUP --yes`, in this process: plan, progress, per-node verdicts."""
    from ringsnap.coordinator.cli.console import ProgressPrinter
    from ringsnap.coordinator.cli.restore_report import print_plan, print_report
    from ringsnap.coordinator.restore.plan import RestoreRequest
    from ringsnap.coordinator.restore.session import open_restore_session

    async def run() -> RestoreRecord:
        async with open_restore_session(config, CLUSTER_NAME) as session:
            plan = await session.plan(RestoreRequest(backup.id, requested_by="sandbox demo"))
            print_plan(plan)
            if plan.refused:
                raise RuntimeError("the restore plan refused: " + "; ".join(plan.refusals))
            return await session.run(plan, "sandbox demo", ProgressPrinter(quiet=False))

    from ringsnap.coordinator.cli.local_catalog import quiet_cql_driver

    quiet_cql_driver()
    out.print(f"\n[bold]ringsnap restore {backup.id} --yes[/bold]")
    record = asyncio.run(run())
    print_report(record)
    cluster.refresh()
    cluster.wait_for_session()  # the restore restarted the ring: the session reconnects first
    good, junk = _count(cluster.session(), keyspace, table)
    out.print(
        f"after the restore, read at consistency ALL: {good} good rows, {junk} junk rows"
        f" ({'as at the backup' if junk == 0 else 'NOT as at the backup'})"
    )
    return record
