"""The demo's backup and its report: what an operator sees after `make demo`."""

from __future__ import annotations

import asyncio

from rich.console import Console
from rich.table import Table

from ringsnap.coordinator.assembly import open_coordinator
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.model import Backup
from ringsnap.coordinator.sandbox.load import LoadReport
from ringsnap.coordinator.sandbox.stack import CLUSTER_NAME
from ringsnap.coordinator.scheduler import BackupRequest


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
            f"snapshot on {ref.array} ({ref.driver}): {ref.snapshot_name}, one consistency-group"
            f" call covering {len(ref.members)} volumes"
        )
    out.print(
        "verification: never proven (restores and drills are not built yet; the backup holds the"
        " canary rows they will check)"
    )
