"""One backup of a whole ring: plan, canary, flush, prepare, freeze barrier, snapshot, thaw, finish,
record.

The order of `run` is the protocol of MISSION.md. Each array's snapshot is prepared before the
freeze (checks, set-up such as ONTAP's temporary consistency group), committed while frozen (the
only array work inside the freeze window) and finished after the thaw; a failed run aborts what it
prepared. Its safety rules, in one place:
- every freeze is under a short lease that the agent ends by itself; the lease is renewed only while
  the array call is legitimately running;
- the array call gets what is left of the freeze budget; past it the run thaws and fails instead of
  letting client writes time out;
- thaw runs in a `finally`, shielded from cancellation, whatever happened before;
- a node whose lease ran out before its thaw was not frozen for the whole snapshot: the run fails;
- every snapshot a failed run made is deleted, or recorded for cleanup when it cannot be; a
  snapshot call that failed may still have made its snapshot, so its name is left for cleanup;
- no snapshot call starts once the freeze has used the whole budget;
- a prepare or commit still running is never aborted or finished under it: it is waited for
  (bounded), or what it set up is logged and kept with the run's warnings.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TypeVar

from ringsnap.coordinator.model import CleanupRequest, FreezeWindow, QuiesceMode
from ringsnap.coordinator.ports import (
    ArrayPort,
    CanaryWriter,
    FreezeReceipt,
    NodeAgent,
    NodeFacts,
    PhaseClock,
    SSTable,
    ThawReceipt,
)
from ringsnap.errors import RingsnapError
from ringsnap.logs import get_logger
from ringsnap.plugins.api import PreparedSnapshot
from ringsnap.plugins.errors import DriverError
from ringsnap.plugins.middleware import deadline
from ringsnap.plugins.types import SnapshotRef, Volume

_T = TypeVar("_T")
log = get_logger(__name__)


class BackupRefused(RingsnapError):
    """The backup did not start: the plan found nodes or arrays it cannot reach."""

    exit_code = 3


class BackupFailed(RingsnapError):
    """The backup started and failed; nothing was recorded as complete."""

    exit_code = 4


@dataclass(frozen=True)
class VolumeTarget:
    """One of a node's volumes, as configured: which array, which volume, what it holds."""

    array: str
    volume: str
    role: str


@dataclass(frozen=True)
class NodeTarget:
    name: str
    agent: NodeAgent
    volumes: tuple[VolumeTarget, ...]


@dataclass(frozen=True)
class BackupSettings:
    quiesce: QuiesceMode = QuiesceMode.FREEZE
    #: Longest the filesystems may stay frozen (first freeze to last thaw). Below the write timeout.
    freeze_budget: float = 1.5
    #: The agent thaws by itself when this runs out without a renewal.
    lease: float = 1.0
    allow_partial: bool = False
    #: How long to wait for an agent's answer in the plan, canary, flush and record phases.
    agent_timeout: float = 60.0
    #: How long a snapshot call that overran the budget may still take before it is left for cleanup.
    straggler_grace: float = 120.0


@dataclass(frozen=True)
class NodeOutcome:
    name: str
    host_id: str = ""
    volumes: tuple[Volume, ...] = ()
    canary_id: str = ""
    manifest: tuple[SSTable, ...] = ()
    excluded_reason: str = ""


@dataclass
class BackupRun:
    """Everything a run learned; what the catalog records."""

    backup_id: str
    cluster: str
    settings: BackupSettings
    trigger: str
    policy: str
    started_at: datetime
    nodes: dict[str, NodeOutcome] = field(default_factory=dict)
    snapshots: list[SnapshotRef] = field(default_factory=list)
    clock: PhaseClock = field(default_factory=PhaseClock)
    window: FreezeWindow | None = None
    #: Snapshots a failed run could not delete, with the reason; the catalog keeps them for cleanup.
    leftovers: list[CleanupRequest] = field(default_factory=list)
    #: Set-up objects (e.g. temporary consistency groups) a finish or abort could not remove; the
    #: driver sweeps them before its next snapshot of the same volumes. Never fails a run.
    array_leftovers: list[str] = field(default_factory=list)

    @property
    def included(self) -> list[str]:
        return [name for name, node in self.nodes.items() if not node.excluded_reason]


Progress = Callable[[str, str], None]


def _check_one_ring(facts: Mapping[str, NodeFacts]) -> None:
    """Refuse a plan whose agents answer for more than one Cassandra cluster, or for one node
    twice: a mistyped agent address would otherwise freeze, and snapshot into this backup, a
    node of another cluster, or leave a node of this one out."""
    names: dict[str, list[str]] = {}
    hosts: dict[str, list[str]] = {}
    for node, info in sorted(facts.items()):
        names.setdefault(info.cluster_name, []).append(node)
        hosts.setdefault(info.host_id, []).append(node)
    if len(names) > 1:
        said = "; ".join(f"{', '.join(nodes)} in {name!r}" for name, nodes in sorted(names.items()))
        raise BackupRefused(
            f"the agents answer for more than one Cassandra cluster ({said}); check each node's"
            " agent address in the coordinator config"
        )
    twice = [nodes for nodes in hosts.values() if len(nodes) > 1]
    if twice:
        raise BackupRefused(
            "; ".join(f"nodes {', '.join(nodes)} reach the same Cassandra node" for nodes in twice)
            + " (same host id); check each node's agent address in the coordinator config"
        )


def _raise_failures(subjects: Sequence[str], what: str, results: Sequence[object]) -> None:
    """One BackupFailed naming every subject whose parallel call raised, in order."""
    failures = [
        f"{subject}: {what} failed: {result}"
        for subject, result in zip(subjects, results, strict=True)
        if isinstance(result, BaseException)
    ]
    if failures:
        raise BackupFailed("; ".join(failures))


def new_backup_id(now: datetime | None = None) -> str:
    """Sortable, unique, and valid as a snapshot name on every array: `rs-20261121-230000-3fa9`."""
    now = now or datetime.now(UTC)
    return f"rs-{now:%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


async def _bounded(what: str, awaitable: Awaitable[_T], timeout: float) -> _T:
    try:
        return await asyncio.wait_for(awaitable, timeout)
    except TimeoutError:
        raise BackupFailed(f"{what}: no answer within {timeout:g} s") from None


async def _to_completion(awaitable: Awaitable[_T]) -> _T:
    """Await to the end even if this task is cancelled meanwhile, however often, then let the
    cancellation go on. For what a failing run must finish before it is recorded (the thaw, and
    the clean-up whose leftovers the record lists); a bare `shield` gives up at the second
    cancellation and the record would miss what the clean-up finds afterwards."""
    task = asyncio.ensure_future(awaitable)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
            break
        except asyncio.CancelledError:
            if task.done():
                raise  # the work itself was cancelled
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return result


class BackupWorkflow:
    """Runs backups of one cluster. Not reentrant: the scheduler serialises runs per cluster."""

    def __init__(
        self,
        cluster: str,
        nodes: Sequence[NodeTarget],
        arrays: Mapping[str, ArrayPort],
        canaries: CanaryWriter | None,
        *,
        progress: Progress | None = None,
    ) -> None:
        self.cluster = cluster
        self.nodes = list(nodes)
        self.arrays = dict(arrays)
        self.canaries = canaries
        self._progress = progress or (lambda phase, message: None)
        # Snapshot calls that overran the freeze budget; cleaned up when they end.
        self._stragglers: list[tuple[str, asyncio.Task[SnapshotRef]]] = []
        # Prepares that outlived their timeout (a driver call goes on in its thread); aborted
        # when they end.
        self._late_prepares: list[tuple[str, asyncio.Task[PreparedSnapshot]]] = []
        # Prepared snapshots not yet finished or aborted, by array.
        self._prepared: dict[str, PreparedSnapshot] = {}
        # Arrays whose commit returned a snapshot (finished, not aborted, when released).
        self._committed: set[str] = set()

    # -- phases ----------------------------------------------------------------------------------

    async def plan(self, run: BackupRun) -> dict[str, list[Volume]]:
        """Reach every node and array; resolve each node's volumes. Returns volumes per array."""
        timeout = run.settings.agent_timeout
        wanted_arrays = {v.array for n in self.nodes for v in n.volumes}
        unknown = wanted_arrays - set(self.arrays)
        if unknown:
            raise BackupRefused(f"nodes use arrays that are not configured: {sorted(unknown)}")
        facts, listings = await asyncio.gather(
            asyncio.gather(
                *(_bounded(f"node {n.name}", n.agent.node_info(), timeout) for n in self.nodes),
                return_exceptions=True,
            ),
            asyncio.gather(
                *(_list_volumes(self.arrays[a], timeout) for a in sorted(wanted_arrays)),
                return_exceptions=True,
            ),
        )
        by_array: dict[str, dict[str, Volume]] = {}
        problems: list[str] = []
        for array, listing in zip(sorted(wanted_arrays), listings, strict=True):
            if isinstance(listing, BaseException):
                problems.append(f"array {array} unreachable: {listing}")
            else:
                by_array[array] = {v.name: v for v in listing}
        if problems:  # an unreachable array takes every node on it: never partial
            raise BackupRefused(
                "; ".join(problems) + "; fix the array or its credentials and retry"
            )

        unreachable: list[str] = []
        for node, info in zip(self.nodes, facts, strict=True):
            if isinstance(info, BaseException):
                reason = f"agent unreachable: {info}"
                unreachable.append(f"node {node.name}: {reason}")
                run.nodes[node.name] = NodeOutcome(node.name, excluded_reason=reason)
                continue
            assert isinstance(info, NodeFacts)
            volumes = []
            for target in node.volumes:
                volume = by_array[target.array].get(target.volume)
                if volume is None:
                    raise BackupRefused(
                        f"node {node.name}: volume {target.volume!r} not found on array"
                        f" {target.array}; check the node's volumes in the coordinator config"
                    )
                volumes.append(volume)
            run.nodes[node.name] = NodeOutcome(node.name, info.host_id, tuple(volumes))
        _check_one_ring(
            {n.name: f for n, f in zip(self.nodes, facts, strict=True) if isinstance(f, NodeFacts)}
        )
        if unreachable and not run.settings.allow_partial:
            raise BackupRefused(
                "; ".join(unreachable)
                + "; bring the agents back, or allow a partial backup (--allow-partial)"
            )
        if not run.included:
            raise BackupRefused("no node of the cluster is reachable")
        per_array: dict[str, list[Volume]] = {}
        for node in self.nodes:
            if run.nodes[node.name].excluded_reason:
                continue
            for target, volume in zip(node.volumes, run.nodes[node.name].volumes, strict=True):
                per_array.setdefault(target.array, []).append(volume)
        return per_array

    async def write_canaries(self, run: BackupRun) -> None:
        if self.canaries is None:
            return
        host_ids = [run.nodes[name].host_id for name in run.included]
        ids = await _bounded(
            "canary write", self.canaries.write_canaries(run.backup_id, host_ids), 60.0
        )
        assert isinstance(ids, dict)
        for name in run.included:
            node = run.nodes[name]
            run.nodes[name] = replace(node, canary_id=ids.get(node.host_id, ""))

    async def flush(self, run: BackupRun) -> None:
        await self._on_included(run, lambda agent: agent.flush(), "flush")

    async def prepare_snapshots(self, run: BackupRun, per_array: dict[str, list[Volume]]) -> None:
        """Before the freeze: every array readies its snapshot; a failure aborts the others."""
        self._prepared.clear()
        self._committed.clear()
        self._late_prepares.clear()
        timeout = run.settings.agent_timeout
        # Tasks, never cancelled: cancelling one would not stop the driver call in its thread,
        # only lose what it sets up. What each made is kept, so that a failure or cancellation
        # elsewhere aborts it; one still running is waited for (and aborted) by the discard.
        tasks = {
            array: asyncio.create_task(
                self.arrays[array].prepare_group_snapshot(per_array[array], run.backup_id)
            )
            for array in sorted(per_array)
        }
        try:
            if tasks:
                await asyncio.wait(tasks.values(), timeout=timeout)
        except asyncio.CancelledError:
            # A stopping coordinator does not wait for the prepares still running.
            for array, task in tasks.items():
                if task.done():
                    if (error := self._keep_prepared(array, task)) is not None:
                        _report_left_behind(run, array, "preparing the snapshot", error)
                else:
                    self._prepare_left_running(run, array, task, "the run was cancelled")
            raise
        failures = []
        for array, task in tasks.items():
            if not task.done():
                failures.append(
                    f"array {array}: preparing the snapshot: no answer within {timeout:g} s"
                )
                self._late_prepares.append((array, task))
            elif (error := self._keep_prepared(array, task)) is not None:
                failures.append(f"array {array}: preparing the snapshot failed: {error}")
                _report_left_behind(run, array, "preparing the snapshot", error)
            elif (existing := self._prepared[array].existing) is not None:
                # Its image predates this run's freeze: never recorded as this backup, and not
                # this run's to delete.
                failures.append(
                    f"array {array}: a snapshot named {existing.snapshot_name!r} exists already"
                    " (taken before this run's freeze); delete it or use another backup id"
                )
        if failures:
            raise BackupFailed("; ".join(failures))

    def _keep_prepared(
        self, array: str, task: asyncio.Task[PreparedSnapshot]
    ) -> BaseException | None:
        """Keep what an ended prepare made, for finish or abort; or return why it failed."""
        if task.cancelled():
            return asyncio.CancelledError("the prepare was cancelled")
        if (error := task.exception()) is not None:
            return error
        self._prepared[array] = task.result()
        return None

    def _prepare_left_running(
        self, run: BackupRun, array: str, task: asyncio.Task[PreparedSnapshot], why: str
    ) -> None:
        """A prepare nobody waits for any more: what it sets up is logged, and reported with the
        run, because no abort will remove it (the driver's next prepare of these volumes does)."""
        warning = (
            f"array {array}: {why} while preparing the snapshot; what the prepare set up on the"
            " array (e.g. a temporary consistency group) is removed by the driver before its next"
            " snapshot of these volumes"
        )
        run.array_leftovers.append(warning)
        log.warning(warning, backup_id=run.backup_id, array=array)

        def ended(done: asyncio.Task[PreparedSnapshot]) -> None:
            if not done.cancelled() and done.exception() is None:
                log.warning(
                    "a prepare nobody waited for ended; the driver's next prepare removes what it"
                    " set up",
                    backup_id=run.backup_id,
                    array=array,
                    state=dict(done.result().state),
                )

        task.add_done_callback(ended)

    async def finish_snapshots(self, run: BackupRun) -> None:
        """After the thaw: each array removes what its prepare set up; never fails the run."""
        await self._release_prepared(run, list(self._prepared))

    async def snapshot_frozen(self, run: BackupRun, per_array: dict[str, list[Volume]]) -> None:
        """Freeze barrier, one snapshot per array within the budget, thaw always."""
        settings = run.settings
        agents = self._included_agents(run)
        operation_id = run.backup_id
        freezes: dict[str, FreezeReceipt] = {}
        thaws: dict[str, ThawReceipt] = {}
        started = time.monotonic()
        array_call = 0.0
        try:
            # Bounded by the budget: nodes that froze stall their writes while a slow one
            # answers. A freeze that lands after the thaw below is undone by its own lease.
            results = await asyncio.gather(
                *(
                    _bounded(
                        "freeze budget",
                        a.freeze(operation_id, settings.lease),
                        settings.freeze_budget,
                    )
                    for a in agents.values()
                ),
                return_exceptions=True,
            )
            freezes.update(
                (name, result)
                for name, result in zip(agents, results, strict=True)
                if not isinstance(result, BaseException)
            )
            _raise_failures([f"node {n}" for n in agents], "freeze", results)
            frozen_at = time.monotonic()
            self._progress("snapshot", f"{len(agents)} nodes frozen; snapshotting")
            remaining = settings.freeze_budget - (frozen_at - started)
            if remaining <= 0:
                # A snapshot call started now would run on after the thaw: not a frozen image.
                raise BackupFailed(
                    f"freezing took {frozen_at - started:.2f} s, the whole freeze budget"
                    f" ({settings.freeze_budget:g} s); no snapshot was started. Check the nodes'"
                    " disks and load, or raise freeze_budget_seconds below the write timeout"
                )
            renewer = asyncio.create_task(self._renew(agents, operation_id, settings.lease))
            try:
                await self._snapshot_arrays(run, per_array, remaining)
            finally:
                renewer.cancel()
                # `wait`, not `await renewer` under suppress(CancelledError): that would also
                # swallow a cancellation of this run arriving meanwhile.
                await asyncio.wait([renewer])
                array_call = time.monotonic() - frozen_at
        finally:
            # Shielded: a cancelled run still waits for its thaw.
            thaws = await _to_completion(self._thaw_all(agents, operation_id))
            total = time.monotonic() - started
            run.window = FreezeWindow(
                total=total,
                slowest_freeze=max((f.freeze_seconds for f in freezes.values()), default=0.0),
                array_call=array_call,
                slowest_thaw=max((t.thaw_seconds for t in thaws.values()), default=0.0),
            )
            log.info(
                "freeze window",
                backup_id=run.backup_id,
                window_ms=round(total * 1000, 1),
                overhead_ms=round(run.window.overhead * 1000, 1),
            )
        expired = [name for name, t in thaws.items() if t.lease_expired]
        if expired:
            raise BackupFailed(
                f"the freeze lease ran out on {', '.join(sorted(expired))} before the snapshot"
                " finished, so those nodes were not quiesced for it; raise the lease or check the"
                " agent's clock and load"
            )

    async def collect_manifests(self, run: BackupRun) -> None:
        async def one(name: str, agent: NodeAgent) -> None:
            manifest = await _bounded(f"node {name}: manifest", agent.manifest(), 600.0)
            assert isinstance(manifest, list)
            run.nodes[name] = replace(run.nodes[name], manifest=tuple(manifest))

        agents = self._included_agents(run)
        await asyncio.gather(*(one(name, agent) for name, agent in agents.items()))

    # -- the whole run ---------------------------------------------------------------------------

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
        try:
            per_array = await self._phase(run, "plan", self.plan(run))
            assert isinstance(per_array, dict)
            await self._phase(run, "canary", self.write_canaries(run))
            if settings.quiesce is not QuiesceMode.NONE:
                await self._phase(run, "flush", self.flush(run))
            # Last before the freeze, so that what it checked on the arrays is still true.
            await self._phase(run, "prepare", self.prepare_snapshots(run, per_array))
            if settings.quiesce is QuiesceMode.FREEZE:
                await self._phase(run, "freeze+snapshot+thaw", self.snapshot_frozen(run, per_array))
            else:
                await self._phase(
                    run, "snapshot", self._snapshot_arrays(run, per_array, settings.straggler_grace)
                )
            await self._phase(run, "finish", self.finish_snapshots(run))
            await self._phase(run, "record", self.collect_manifests(run))
        except BaseException as exc:
            bound.error("backup failed", error=str(exc), error_type=type(exc).__name__)
            await _to_completion(self._discard_snapshots(run, f"backup failed: {exc}"))
            raise
        bound.info("backup taken", phases=run.clock.phases)
        return run

    # -- helpers ---------------------------------------------------------------------------------

    async def _phase(self, run: BackupRun, phase: str, work: Awaitable[object]) -> object:
        self._progress(phase, "")
        started = time.monotonic()
        try:
            return await work
        finally:
            run.clock.add(phase, time.monotonic() - started)

    def _included_agents(self, run: BackupRun) -> dict[str, NodeAgent]:
        included = set(run.included)
        return {n.name: n.agent for n in self.nodes if n.name in included}

    async def _on_included(
        self, run: BackupRun, call: Callable[[NodeAgent], Awaitable[object]], what: str
    ) -> None:
        agents = self._included_agents(run)
        results = await asyncio.gather(
            *(
                _bounded(f"node {n}: {what}", call(a), run.settings.agent_timeout)
                for n, a in agents.items()
            ),
            return_exceptions=True,
        )
        _raise_failures([f"node {n}" for n in agents], what, results)

    async def _snapshot_arrays(
        self, run: BackupRun, per_array: dict[str, list[Volume]], budget: float
    ) -> None:
        """One atomic group snapshot per array, in parallel, all done within `budget` seconds."""
        # The retry deadline leaves room for the last attempt to come back inside the budget.
        with deadline(budget * 0.7) as call_budget:
            tasks = {
                array: asyncio.create_task(self._commit(array, self._prepared[array]))
                for array in per_array
            }
        try:
            _, pending = await asyncio.wait(tasks.values(), timeout=max(budget, 0.0))
        except asyncio.CancelledError:
            # The calls go on in their threads, and a stopping coordinator does not wait for
            # them: what they make is found by name later. Their set-up is left to the driver's
            # next sweep, not removed under a running snapshot call.
            for array, task in tasks.items():
                if not task.done():
                    self._abandon_prepared(
                        run, array, "cancelled while its snapshot call was running"
                    )
                    run.leftovers.append(
                        CleanupRequest(
                            array=array,
                            reason="cancelled while its snapshot call was running",
                            snapshot_name=run.backup_id,
                        )
                    )
                elif task.cancelled():
                    self._commit_failed(run, array, "cancelled")
                elif (error := task.exception()) is not None:
                    self._commit_failed(run, array, error)
                else:
                    run.snapshots.append(task.result())
            raise
        failures = []
        for array, task in tasks.items():
            if task in pending:
                said = call_budget.last_error
                failures.append(
                    f"array {array}: snapshot call still running after the freeze budget"
                    f" ({run.settings.freeze_budget:g} s); the nodes were thawed to protect client"
                    " writes" + (f"; the array's last answer: {said}" if said is not None else "")
                )
                # Not cancelled: the driver runs in a thread; its result is cleaned up when it ends.
                self._stragglers.append((array, task))
            elif task.cancelled():
                failures.append(f"array {array}: snapshot call cancelled")
                self._commit_failed(run, array, "cancelled")
            elif (error := task.exception()) is not None:
                failures.append(f"array {array}: snapshot failed: {error}")
                self._commit_failed(run, array, error)
            else:
                run.snapshots.append(task.result())
        if failures:
            raise BackupFailed("; ".join(failures))

    async def _commit(self, array: str, prepared: PreparedSnapshot) -> SnapshotRef:
        ref = await self.arrays[array].commit_group_snapshot(prepared)
        self._committed.add(array)
        return ref

    @staticmethod
    def _commit_failed(run: BackupRun, array: str, error: BaseException | str) -> None:
        """A failed snapshot call may still have made its snapshot, or part of it (a request
        that timed out after the array acted, retries stopped by the freeze budget, a failed
        read of what the array made): the cleanup looks for it by name."""
        run.leftovers.append(
            CleanupRequest(
                array=array,
                reason=f"its snapshot call failed ({error}); the array may have made it anyway",
                snapshot_name=run.backup_id,
            )
        )

    def _abandon_prepared(self, run: BackupRun, array: str, why: str) -> None:
        """Give up the prepared snapshot of `array` without finish or abort (its commit may
        still be running, and a finish or abort must not run under it). What its prepare set up
        stays on the array until the driver's next prepare of these volumes: logged, and
        reported with the run."""
        prepared = self._prepared.pop(array, None)
        if prepared is None or not prepared.state:
            return
        setup = ", ".join(f"{key} {value}" for key, value in prepared.state)
        warning = (
            f"array {array}: {why}; what its prepare set up stays on the array until the"
            f" driver's next snapshot of these volumes: {setup}"
        )
        run.array_leftovers.append(warning)
        log.warning(warning, backup_id=run.backup_id, array=array)

    async def _release_prepared(self, run: BackupRun, arrays: Sequence[str]) -> None:
        """Finish (after a commit) or abort (without one) the prepared snapshots of `arrays`."""

        async def release(array: str, prepared: PreparedSnapshot) -> None:
            port = self.arrays[array]
            committed = array in self._committed
            step = "finish" if committed else "abort"
            try:
                if committed:
                    await port.finish_group_snapshot(prepared)
                else:
                    await port.abort_group_snapshot(prepared)
            except Exception as exc:  # the snapshot (if any) is unaffected; the driver sweeps
                left = list(getattr(exc, "leftovers", ()))
                # One sentence with the array's answer and what it kept, for the catalog.
                said = str(exc) if isinstance(exc, DriverError) else f"array {array}: {exc}"
                run.array_leftovers.append(f"{step} of the prepared snapshot failed: {said}")
                log.warning(
                    f"{step} of a prepared snapshot failed; the driver removes what is left before"
                    " its next snapshot of these volumes",
                    backup_id=run.backup_id,
                    array=array,
                    error=str(exc),
                    leftovers=left,
                )

        pending = [
            (array, self._prepared.pop(array)) for array in arrays if array in self._prepared
        ]
        await asyncio.gather(*(release(array, prepared) for array, prepared in pending))

    async def _renew(
        self, agents: Mapping[str, NodeAgent], operation_id: str, lease: float
    ) -> None:
        """Keep the freeze alive while the array call runs. A failed renewal is reported by the
        thaw (lease_expired), which fails the run."""
        while True:
            await asyncio.sleep(lease / 3)
            results = await asyncio.gather(
                *(a.renew(operation_id, lease) for a in agents.values()), return_exceptions=True
            )
            for name, result in zip(agents, results, strict=True):
                if isinstance(result, BaseException):
                    log.warning("lease renewal failed", node=name, error=str(result))

    async def _thaw_all(
        self, agents: Mapping[str, NodeAgent], operation_id: str
    ) -> dict[str, ThawReceipt]:
        results = await asyncio.gather(
            *(a.thaw(operation_id) for a in agents.values()), return_exceptions=True
        )
        receipts: dict[str, ThawReceipt] = {}
        for name, result in zip(agents, results, strict=True):
            if isinstance(result, BaseException):
                # The lease thaws this node by itself within one lease length.
                log.error(
                    "thaw failed; the node's lease will thaw it", node=name, error=str(result)
                )
            else:
                receipts[name] = result
        return receipts

    async def _discard_snapshots(self, run: BackupRun, reason: str) -> None:
        """Abort what a failed run prepared and delete what it made; record for cleanup what
        cannot be deleted now."""
        # A straggler's handle is released only once its commit has ended (below).
        running = {array for array, _ in self._stragglers}
        await self._release_prepared(run, [a for a in list(self._prepared) if a not in running])
        late, self._late_prepares = self._late_prepares, []
        for array, prepare in late:
            try:
                await asyncio.wait_for(asyncio.shield(prepare), run.settings.straggler_grace)
            except TimeoutError:
                self._prepare_left_running(run, array, prepare, "no answer")
                continue
            except Exception as exc:
                log.info("late prepare failed", array=array, error=str(exc))
                _report_left_behind(run, array, "preparing the snapshot", exc)
                continue
            self._keep_prepared(array, prepare)
            await self._release_prepared(run, [array])
        for ref in list(run.snapshots):
            try:
                await self.arrays[ref.array].delete_snapshot(ref)
                log.info(
                    "deleted snapshot of failed run", array=ref.array, snapshot=ref.snapshot_name
                )
            except Exception as exc:  # recorded, and retried by the cleanup
                run.leftovers.append(
                    CleanupRequest(
                        array=ref.array, reason=f"{reason}; delete failed: {exc}", ref=ref
                    )
                )
        run.snapshots.clear()
        stragglers, self._stragglers = self._stragglers, []
        for array, task in stragglers:
            try:
                ref = await asyncio.wait_for(asyncio.shield(task), run.settings.straggler_grace)
            except TimeoutError:
                # Its prepared set-up stays too: the driver's next prepare sweeps it.
                self._abandon_prepared(run, array, "its snapshot call never returned")
                run.leftovers.append(
                    CleanupRequest(
                        array=array,
                        reason=f"{reason}; call never returned",
                        snapshot_name=run.backup_id,
                    )
                )
                continue
            except Exception as exc:
                log.info("late snapshot call failed", array=array, error=str(exc))
                self._commit_failed(run, array, exc)
                await self._release_prepared(run, [array])
                continue
            await self._release_prepared(run, [array])
            try:
                await self.arrays[array].delete_snapshot(ref)
                log.info("deleted late snapshot of failed run", array=array)
            except Exception as exc:
                run.leftovers.append(
                    CleanupRequest(
                        array=array,
                        reason=f"{reason}; delete of late snapshot failed: {exc}",
                        ref=ref,
                    )
                )


def _report_left_behind(run: BackupRun, array: str, step: str, error: BaseException) -> None:
    """What a failed driver call says it left on the array (`DriverError.leftovers`): logged,
    and kept with the run's warnings."""
    left = tuple(getattr(error, "leftovers", ()))
    if not left:
        return
    warning = (
        f"array {array}: {step} failed and may have left {', '.join(left)}; the driver removes"
        " it before its next snapshot of these volumes"
    )
    run.array_leftovers.append(warning)
    log.warning(warning, backup_id=run.backup_id, array=array)


async def _list_volumes(array: ArrayPort, timeout: float) -> Sequence[Volume]:
    await asyncio.wait_for(array.check(), timeout)
    return await asyncio.wait_for(array.list_volumes(), timeout)
