"""One backup of a whole ring: plan, canary, flush, prepare, freeze barrier, snapshot, thaw, finish,
record; or, for a cluster of native snapshots: plan, canary, flush, snapshot on every node, record.

The order of `run` is the protocol of docs/backup-protocol.md. Each array's snapshot is prepared before the
freeze (checks, set-up such as ONTAP's temporary consistency group), committed while frozen (the
only array work inside the freeze window) and finished after the thaw; a failed run aborts what it
prepared. Its safety rules, in one place (kept by `freeze.FreezeBarrier` and `arrays.ArrayRun`):
- every freeze is under a short lease that the agent ends by itself; the lease is renewed only while
  the array call is legitimately running;
- the array call gets what is left of the freeze budget; past it the run thaws and fails instead of
  letting client writes time out;
- thaw runs in a `finally`, shielded from cancellation, whatever happened before;
- a node whose lease ran out before its thaw was not frozen for the whole snapshot: the run fails;
- every array's snapshot is in the resource ledger before the array is asked; every snapshot a
  failed run made is deleted, or stays in the ledger when it cannot be; a snapshot call that
  failed may still have made its snapshot, so its name stays there for the retries;
- no snapshot call starts once the freeze has used the whole budget;
- a prepare or commit still running is never aborted or finished under it: it is waited for
  (bounded), or what it set up is logged and kept with the run's warnings.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import TypeVar

from ringsnap.coordinator.backup.arrays import ArrayRun
from ringsnap.coordinator.backup.freeze import FreezeBarrier, renew_leases
from ringsnap.coordinator.backup.manifest import present_throughout
from ringsnap.coordinator.backup.model import (
    BackupFailed,
    BackupRun,
    BackupSettings,
    NodeTarget,
    Progress,
    new_backup_id,
)
from ringsnap.coordinator.backup.plan import Listing, arrays_of, plan_backup
from ringsnap.coordinator.backup.schema_capture import KeyspaceSchemaReader
from ringsnap.coordinator.backup.tasks import bounded, raise_failures, to_completion
from ringsnap.coordinator.model import QuiesceMode, SnapshotKind
from ringsnap.coordinator.ports import AgentPort, ArrayPort, CanaryWriter, SSTable
from ringsnap.coordinator.runs.ledger import Ledger
from ringsnap.logs import get_logger
from ringsnap.plugins.types import Volume

T = TypeVar("T")
log = get_logger(__name__)


class BackupWorkflow:
    """Runs backups of one cluster; each run keeps its own state (the scheduler still runs one
    backup per cluster at a time: two would freeze the same nodes)."""

    def __init__(
        self,
        cluster: str,
        nodes: Sequence[NodeTarget],
        arrays: Mapping[str, ArrayPort],
        canaries: CanaryWriter | None,
        *,
        progress: Progress | None = None,
        schemas: KeyspaceSchemaReader | None = None,
        ledger: Ledger | None = None,
    ) -> None:
        self.cluster = cluster
        #: Where each array's snapshot is recorded before the array is asked (None: the caller
        #: keeps no ledger, e.g. a benchmark or a test of the protocol alone).
        self.ledger = ledger
        self.schemas = schemas
        self.nodes = list(nodes)
        self.arrays = dict(arrays)
        self.canaries = canaries
        self._progress = progress or (lambda phase, message: None)

    async def run(
        self,
        settings: BackupSettings,
        *,
        trigger: str,
        policy: str = "",
        backup_id: str | None = None,
        on_start: Callable[[BackupRun], Awaitable[None]] | None = None,
    ) -> BackupRun:
        """Run one backup; raise BackupRefused/BackupFailed with the reason, after cleaning up."""
        run = BackupRun(
            backup_id=backup_id or new_backup_id(),
            cluster=self.cluster,
            settings=settings,
            trigger=trigger,
            policy=policy,
            started_at=datetime.now(UTC),
        )
        bound = log.bind(backup_id=run.backup_id, cluster=self.cluster)
        if on_start is not None:
            await on_start(run)
        arrays = ArrayRun(self.arrays, run, self.ledger)
        try:
            per_array = await self._phase(run, "plan", self.plan(run))
            await self._phase(run, "canary", self.write_canaries(run))
            await self._phase(run, "schema", self.capture_schemas(run))
            if settings.snapshots is SnapshotKind.NATIVE:
                await self._native_snapshots(run)
            else:
                await self._array_snapshots(run, arrays, per_array)
        except BaseException as exc:
            bound.error("backup failed", error=str(exc), error_type=type(exc).__name__)
            await to_completion(arrays.discard(f"backup failed: {exc}"))
            raise
        bound.info("backup taken", phases=run.clock.phases)
        return run

    async def _array_snapshots(
        self, run: BackupRun, arrays: ArrayRun, per_array: dict[str, list[Volume]]
    ) -> None:
        settings = run.settings
        if settings.quiesce is not QuiesceMode.NONE:
            await self._phase(run, "flush", self.flush(run))
        # What is on disk before the snapshot; what is still there after it was in it.
        before = await self._phase(run, "manifest", self.list_sstables(run))
        # Last before the freeze, so that what it checked on the arrays is still true.
        await self._phase(run, "prepare", arrays.prepare(per_array))
        if settings.quiesce is QuiesceMode.FREEZE:
            await self._phase(run, "freeze+snapshot+thaw", self.snapshot_frozen(run, arrays))
        else:
            await self._phase(run, "snapshot", arrays.commit(settings.straggler_grace))
        await self._phase(run, "finish", arrays.finish())
        await self._phase(run, "record", self.collect_manifests(run, before))

    async def _native_snapshots(self, run: BackupRun) -> None:
        """Flush, then every included node snapshots itself (tagged with the backup id), in
        parallel; each node's manifest is read from its snapshot. No freeze and no arrays: each
        table of each node is snapshotted at its own moment, after the canary was written."""
        await self._phase(run, "flush", self.flush(run))
        await self._phase(run, "snapshot", self.snapshot_native(run))
        await self._phase(run, "record", self.collect_native_manifests(run))

    # -- phases ----------------------------------------------------------------------------------

    async def plan(self, run: BackupRun) -> dict[str, list[Volume]]:
        """Reach every node and array; resolve each node's volumes. Returns volumes per array."""
        timeout = run.settings.agent_timeout
        wanted = arrays_of(self.nodes, self.arrays)
        facts, listings = await asyncio.gather(
            asyncio.gather(
                *(bounded(f"node {n.name}", n.agent.node_info(), timeout) for n in self.nodes),
                return_exceptions=True,
            ),
            asyncio.gather(
                *(_list_volumes(self.arrays[a], timeout) for a in wanted),
                return_exceptions=True,
            ),
        )
        plan = plan_backup(
            self.nodes,
            facts,
            dict(zip(wanted, listings, strict=True)),
            allow_partial=run.settings.allow_partial,
        )
        run.nodes.update(plan.nodes)
        run.warnings.extend(plan.warnings)
        return plan.volumes

    async def write_canaries(self, run: BackupRun) -> None:
        if self.canaries is None:
            return
        host_ids = [run.nodes[name].host_id for name in run.included]
        ids = await bounded(
            "canary write",
            self.canaries.write_canaries(run.backup_id, host_ids),
            run.settings.agent_timeout,
        )
        for name in run.included:
            node = run.nodes[name]
            run.nodes[name] = replace(node, canary_id=ids.get(node.host_id, ""))

    async def capture_schemas(self, run: BackupRun) -> None:
        """Each user keyspace's schema, for table restores; before the flush and the freeze. A
        failure is a warning on the backup, never a failed backup."""
        if self.schemas is None:
            return
        try:
            run.keyspace_schemas = await bounded(
                "schema capture", self.schemas.describe_keyspaces(), run.settings.agent_timeout
            )
        except Exception as exc:
            run.warnings.append(
                f"keyspace schemas not captured ({exc}): a table restore of a table dropped since"
                " cannot recreate it from this backup"
            )
            log.warning("schema capture failed", backup_id=run.backup_id, error=str(exc))

    async def flush(self, run: BackupRun) -> None:
        await self._on_included(run, lambda agent: agent.flush(), "flush")

    async def snapshot_frozen(self, run: BackupRun, arrays: ArrayRun) -> None:
        """Freeze barrier, one snapshot per array within the budget, thaw always."""
        agents = self._included_agents(run)
        settings = run.settings
        barrier = FreezeBarrier(
            agents, run.backup_id, settings.freeze_budget, settings.lease, self._renew
        )
        try:
            await barrier.hold(
                arrays.commit,
                on_frozen=lambda: self._progress(
                    "snapshot", f"{len(agents)} nodes frozen; snapshotting"
                ),
            )
        finally:
            run.window = barrier.window

    async def snapshot_native(self, run: BackupRun) -> None:
        """Every included node takes native snapshot `<backup id>`; each node is remembered before
        it is asked (a call that failed may still have made it), so a failed run clears it."""
        run.native_snapshots.extend(run.included)
        await self._on_included(run, lambda agent: agent.create_snapshot(run.backup_id), "snapshot")

    async def collect_native_manifests(self, run: BackupRun) -> None:
        """Record, per node, the SSTables of its snapshot: hard links that never change, so the
        manifest is exactly what a restore puts back."""
        listings = await self.list_sstables(run, snapshot_tag=run.backup_id)
        for name, listing in listings.items():
            if not listing:
                raise BackupFailed(
                    f"node {name}: its snapshot {run.backup_id} holds no SSTable (not even the"
                    " system tables'): the snapshot was not taken where the agent looks; check the"
                    " agent's [cassandra] data_directories"
                )
            run.nodes[name] = replace(run.nodes[name], manifest=tuple(listing))

    async def list_sstables(
        self, run: BackupRun, *, snapshot_tag: str = ""
    ) -> dict[str, list[SSTable]]:
        """Every included node's SSTables on disk now (a manifest of the live directories, or of
        native snapshot `snapshot_tag`)."""
        agents = self._included_agents(run)
        listings = await asyncio.gather(
            *(
                bounded(f"node {name}", a.manifest(snapshot_tag), run.settings.agent_timeout)
                for name, a in agents.items()
            ),
            return_exceptions=True,
        )
        raise_failures([f"node {name}" for name in agents], "manifest", listings)
        return {
            name: listing
            for name, listing in zip(agents, listings, strict=True)
            if not isinstance(listing, BaseException)
        }

    async def collect_manifests(self, run: BackupRun, before: Mapping[str, list[SSTable]]) -> None:
        """Record, per node, the SSTables that were on disk both before the snapshot and after it.

        SSTables never change and a deleted one never comes back, so those were in the snapshot;
        one that a flush or compaction wrote, or a compaction removed, in between may or may not
        be, and a restore could not prove it: it is left out of the record.
        """
        after = await self.list_sstables(run)
        for name, listing in after.items():
            kept = present_throughout(before.get(name, []), listing)
            run.nodes[name] = replace(run.nodes[name], manifest=tuple(kept))

    # -- helpers ---------------------------------------------------------------------------------

    async def _phase(self, run: BackupRun, phase: str, work: Awaitable[T]) -> T:
        self._progress(phase, "")
        started = time.monotonic()
        try:
            return await work
        finally:
            run.clock.add(phase, time.monotonic() - started)

    async def _renew(
        self,
        agents: Mapping[str, AgentPort],
        operation_id: str,
        lease: float,
        held_until: dict[str, float],
        frozen: Mapping[str, asyncio.Event],
    ) -> None:
        """The freeze barrier's lease renewer (tests replace it)."""
        await renew_leases(agents, operation_id, lease, held_until, frozen)

    def _included_agents(self, run: BackupRun) -> dict[str, AgentPort]:
        included = set(run.included)
        return {n.name: n.agent for n in self.nodes if n.name in included}

    async def _on_included(
        self, run: BackupRun, call: Callable[[AgentPort], Awaitable[object]], what: str
    ) -> None:
        agents = self._included_agents(run)
        results = await asyncio.gather(
            *(
                bounded(f"node {n}: {what}", call(a), run.settings.agent_timeout)
                for n, a in agents.items()
            ),
            return_exceptions=True,
        )
        raise_failures([f"node {n}" for n in agents], what, results)


async def _list_volumes(array: ArrayPort, timeout: float) -> Listing:
    """The array's volumes, and how a host sees each (None: the driver's volumes are no SAN
    LUNs, e.g. LVM, and nothing is compared)."""
    await asyncio.wait_for(array.check(), timeout)
    volumes = await asyncio.wait_for(array.list_volumes(), timeout)
    if not array.identifies_volumes:
        return Listing(volumes, None)
    return Listing(volumes, await asyncio.wait_for(array.host_identities(volumes), timeout))
