"""Whole-ring restores run by the daemon (`ringsnap restore` through the API, also from a bastion):
plans held for the operator's confirmation, the restore run as an operation that holds its cluster
by the cluster's lease, resumes, and the refusals a running restore imposes on backups, deletions
and retention. The daemon runs them, and so does the same service `ringsnap` hosts while no daemon
runs (`cli.hosted`): one path (docs/restore.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import replace
from datetime import datetime
from typing import TypeVar

from ringsnap.coordinator.catalog import BackupStateError, Catalog
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.guarded_operation import AtMostOnce
from ringsnap.coordinator.model import OperationKind, RestoreRecord
from ringsnap.coordinator.operations import Operation, Operations
from ringsnap.coordinator.restore.plan import RestorePlan, RestoreRequest
from ringsnap.coordinator.restore.record import new_restore_id
from ringsnap.coordinator.restore.s3_keys import NO_KEYS, RestoreKeys
from ringsnap.coordinator.restore.session import RestoreSession, open_restore_session
from ringsnap.coordinator.restore.workflow import Progress, RestoreRefused
from ringsnap.coordinator.runs.lease import RESTORING, ClusterLeases, Lease, RunKind
from ringsnap.logs import get_logger

log = get_logger(__name__)

#: How long a plan made by `plan_restore` is held for `start_restore` to run once it is confirmed.
RESTORE_PLAN_TTL_SECONDS = 1800.0
#: At most this many plans are held (the oldest go first).
_HELD_PLANS = 100
_Prepared = TypeVar("_Prepared")


class RestoreNotConfirmed(RestoreRefused):
    """The cluster name given to confirm a restore is not the cluster's; nothing was changed."""


def restore_progress_line(node: str, step: str, message: str) -> str:
    """One progress event of a restore in words, as `ringsnap restore` prints it (without the
    elapsed time): "n1: stopped done", "stop ...", "revert array a1: 6 volumes"."""
    who = f"{node}: " if node else ""
    return f"{who}{step} {message}" if message else f"{who}{step} ..."


def _plan_changes(shown: RestorePlan, fresh: RestorePlan) -> list[str]:
    """What differs, in what a restore changes or destroys, between two plans of one restore."""

    def nodes(plan: RestorePlan) -> list[tuple[object, ...]]:
        return [(n.name, n.host_id, n.seed, n.volumes) for n in plan.nodes]

    def snapshots(plan: RestorePlan) -> dict[str, tuple[str, tuple[str, ...]]]:
        return {
            a.array: (a.ref.snapshot_name, tuple(m.volume.name for m in a.ref.members))
            for a in plan.arrays
        }

    checks: list[tuple[str, object, object]] = [
        ("backup", shown.backup.id, fresh.backup.id),
        ("mode", shown.mode, fresh.mode),
        ("nodes and volumes", nodes(shown), nodes(fresh)),
        ("array snapshots", snapshots(shown), snapshots(fresh)),
        ("what is destroyed", shown.destroyed, fresh.destroyed),
        ("backups whose snapshots go with it", shown.lost_backups, fresh.lost_backups),
    ]
    return [what for what, before, now in checks if before != now]


def _check_confirmation(typed: str, cluster: str) -> None:
    if typed != cluster:
        got = f"{typed!r} was given" if typed else "none was given"
        raise RestoreNotConfirmed(
            f"a restore of cluster {cluster} must be confirmed with the cluster's name, and"
            f" {got}; nothing was done"
        )


class DaemonRestores:
    """The daemon's whole-ring restores. `cluster` refuses an unknown cluster; `finished` runs (in a
    thread) when a restore ends; `track` keeps a clean-up task the daemon's stop awaits."""

    def __init__(
        self,
        config: CoordinatorConfig,
        catalog: Catalog,
        operations: Operations,
        leases: ClusterLeases,
        *,
        cluster: Callable[[str], object],
        clusters: Callable[[], Iterable[str]],
        finished: Callable[[], None],
        track: Callable[[asyncio.Task[None]], None],
        now: Callable[[], datetime],
    ) -> None:
        self._config = config
        self._catalog = catalog
        self._operations = operations
        self._leases = leases
        self._cluster = cluster
        self._clusters = clusters
        self._finished = finished
        self._track = track
        self._now = now
        # Plans shown to an operator, by restore id, until they are run or expire.
        self._restore_plans: dict[str, tuple[RestorePlan, float]] = {}

    async def plan_restore(self, request: RestoreRequest) -> RestorePlan:
        """What restoring `request` would do and destroy; changes nothing. A plan without refusals
        is held for `RESTORE_PLAN_TTL_SECONDS`, for `start_restore` to compare with."""
        backup = await asyncio.to_thread(self._catalog.get_backup, request.backup_id)
        self._cluster(backup.cluster)
        async with open_restore_session(
            self._config, backup.cluster, catalog=self._catalog
        ) as session:
            plan = await session.plan(request)
        plan = self._refused_while_busy(plan)
        if not plan.refused:
            self._forget_stale_plans()
            # Held to compare with, not to run: without the operator's keys.
            self._restore_plans[plan.restore_id] = (replace(plan, keys=NO_KEYS), time.monotonic())
        return plan

    async def start_restore(
        self, request: RestoreRequest, *, confirm_cluster: str, restore_id: str = ""
    ) -> Operation:
        """Plan `request` again and run it as an operation of kind restore.

        `restore_id` names the plan the operator confirmed (from `plan_restore`): the restore runs
        under that id, and is refused if this coordinator no longer holds that plan or if what the
        fresh plan changes or destroys differs from it. Refused before anything changes when
        `confirm_cluster` is not the backup's cluster, when the plan refuses, and (ClusterHeld)
        while a backup or another restore of the cluster runs; while it runs, the cluster's backups
        are skipped as busy.
        """
        backup = await asyncio.to_thread(self._catalog.get_backup, request.backup_id)
        self._cluster(backup.cluster)
        _check_confirmation(confirm_cluster, backup.cluster)
        shown: RestorePlan | None = None
        if restore_id:
            shown = self._held_plan(restore_id)
        restore_id = restore_id or new_restore_id(self._now())
        lease = Lease(
            backup.cluster,
            RunKind.RESTORE,
            run_id=restore_id,
            backup_id=backup.id,
            asked_by=request.requested_by,
        )

        async def prepare(session: RestoreSession) -> RestorePlan:
            plan = replace(await session.plan(request), restore_id=restore_id)
            if plan.refused:
                raise RestoreRefused("the plan refused: " + "; ".join(plan.refusals))
            if shown is not None:
                changed = _plan_changes(shown, plan)
                if changed:
                    raise RestoreRefused(
                        f"the plan of restore {restore_id} changed since it was shown ("
                        + ", ".join(changed)
                        + "); nothing was done: review the new plan (`ringsnap restore"
                        f" {backup.id} --dry-run`) and confirm it again"
                    )
            return plan

        session, plan, release = await self._open_restore(lease, prepare)
        self._restore_plans.pop(restore_id, None)
        log.warning(
            "restore starting through the API",
            restore_id=restore_id,
            backup_id=backup.id,
            cluster=backup.cluster,
            nodes=[n.name for n in plan.nodes],
            mode=plan.mode.value,
            requested_by=request.requested_by,
        )

        async def run(progress: Progress) -> RestoreRecord:
            return await session.run(plan, request.requested_by, progress)

        intro = (
            f"restore {restore_id} of backup {backup.id} ({plan.mode.value},"
            f" {len(plan.nodes)} node(s))"
        )
        return self._restore_operation(backup.id, intro, run, release)

    async def resume_restore(
        self,
        restore_id: str,
        *,
        confirm_cluster: str,
        requested_by: str = "",
        keys: RestoreKeys = NO_KEYS,
    ) -> Operation:
        """Go on with an unfinished restore from each node's last finished step, as an operation
        (the same refusals as `start_restore`; a finished restore is refused)."""
        record = await asyncio.to_thread(self._catalog.get_restore, restore_id)
        self._cluster(record.cluster)
        _check_confirmation(confirm_cluster, record.cluster)
        if record.state.finished:
            raise RestoreRefused(
                f"restore {restore_id} is finished ({record.state.value}); nothing to resume"
            )
        lease = Lease(
            record.cluster,
            RunKind.RESTORE,
            run_id=restore_id,
            backup_id=record.backup_id,
            asked_by=requested_by,
        )

        async def prepare(session: RestoreSession) -> None:
            return None

        session, _, release = await self._open_restore(lease, prepare)
        log.warning(
            "restore resuming through the API",
            restore_id=restore_id,
            backup_id=record.backup_id,
            cluster=record.cluster,
            state=record.state.value,
            requested_by=requested_by,
        )

        async def run(progress: Progress) -> RestoreRecord:
            return await session.resume(restore_id, progress, keys)

        intro = f"restore {restore_id} of backup {record.backup_id} resumed"
        return self._restore_operation(record.backup_id, intro, run, release)

    async def _open_restore(
        self,
        lease: Lease,
        prepare: Callable[[RestoreSession], Awaitable[_Prepared]],
    ) -> tuple[RestoreSession, _Prepared, Callable[[], Awaitable[None]]]:
        """Take the cluster, open its restore session and `prepare` in it; on any failure give
        both back. Returns the session, what `prepare` returned, and the (idempotent) release."""
        self._leases.take(lease)
        stack = contextlib.AsyncExitStack()

        @AtMostOnce
        async def release() -> None:
            try:
                await stack.aclose()
            finally:
                self._leases.give_back(lease)

        try:
            session = await stack.enter_async_context(
                open_restore_session(self._config, lease.cluster, catalog=self._catalog)
            )
            prepared = await prepare(session)
        except BaseException:
            await asyncio.shield(release())
            raise
        return session, prepared, release

    def _restore_operation(
        self,
        backup_id: str,
        intro: str,
        run: Callable[[Progress], Awaitable[RestoreRecord]],
        release: Callable[[], Awaitable[None]],
    ) -> Operation:
        """Run a restore as an operation: its phase is the workflow's step, its message the latest
        progress line; at the end the cluster is given back and the restore metrics refreshed."""
        updates: set[asyncio.Task[None]] = set()
        ended = False

        async def end() -> None:
            nonlocal ended
            if ended:
                return
            ended = True
            await asyncio.gather(*updates, return_exceptions=True)
            try:
                await release()
            finally:
                try:
                    await asyncio.to_thread(self._finished)
                except Exception as exc:  # metrics must never fail a restore
                    log.error("restore metrics not refreshed", error=str(exc))

        async def work(operation: Operation) -> None:
            loop = asyncio.get_running_loop()

            def progress(node: str, step: str, message: str) -> None:
                line = restore_progress_line(node, step, message)
                task = loop.create_task(operation.update(phase=step, message=line))
                updates.add(task)
                task.add_done_callback(updates.discard)

            try:
                await operation.update(phase="plan", message=f"{intro}: planned and confirmed")
                record = await run(progress)
                await asyncio.gather(*updates)  # every progress line lands before the verdict
                await operation.update(
                    phase="record",
                    message=f"restore {record.id} of backup {record.backup_id}:"
                    f" {record.state.value}",
                )
            finally:
                await asyncio.shield(end())

        operation = self._operations.start(OperationKind.RESTORE.value, work, backup_id=backup_id)

        def finished(_: object) -> None:
            # A task cancelled before its first step never ran `work`'s cleanup: run it now.
            if not ended:
                self._track(asyncio.get_running_loop().create_task(end()))

        if operation.task is not None:
            operation.task.add_done_callback(finished)
        return operation

    def running_restore(self, cluster: str) -> Lease | None:
        """The lease a restore (or table restore) of `cluster` running in this coordinator holds
        it with (its id, the restored backup's id), or None."""
        holder = self._leases.holder(cluster)
        return holder if holder is not None and holder.kind in RESTORING else None

    def refuse_while_restored(self, backup_id: str) -> None:
        """A backup a running restore reads its snapshots from is not deleted under it."""
        for cluster in self._clusters():
            holder = self.running_restore(cluster)
            if holder is not None and holder.backup_id == backup_id:
                raise BackupStateError(
                    f"backup {backup_id} is {holder.doing}: its snapshots are in use; delete it"
                    " once the restore has ended (`ringsnap status` shows it)"
                )

    def refuse_while_restoring(self, cluster: str) -> None:
        """Retention does not delete backups of a cluster being restored (it may be the one the
        restore reads)."""
        holder = self.running_restore(cluster)
        if holder is not None:
            raise BackupStateError(
                f"cluster {cluster} is {holder.doing}: retention is applied once the restore"
                " has ended (a dry run shows the plan meanwhile)"
            )

    def _refused_while_busy(self, plan: RestorePlan) -> RestorePlan:
        running = self._leases.holder(plan.backup.cluster)
        if running is None:
            return plan
        refusal = (
            f"cluster {plan.backup.cluster} is {running.doing}: a restore cannot start"
            " meanwhile; plan it again once that has ended (`ringsnap status` shows it)"
        )
        return replace(plan, refusals=(*plan.refusals, refusal))

    def _held_plan(self, restore_id: str) -> RestorePlan:
        self._forget_stale_plans()
        held = self._restore_plans.get(restore_id)
        if held is None:
            raise RestoreRefused(
                f"this coordinator holds no plan {restore_id} (plans are held"
                f" {RESTORE_PLAN_TTL_SECONDS / 60:.0f} minutes, in memory, and only when they do"
                " not refuse); nothing was done: plan the restore again and confirm that plan"
            )
        return held[0]

    def _forget_stale_plans(self) -> None:
        now = time.monotonic()
        for restore_id, (_, made) in list(self._restore_plans.items()):
            if now - made > RESTORE_PLAN_TTL_SECONDS:
                del self._restore_plans[restore_id]
        excess = len(self._restore_plans) - _HELD_PLANS + 1  # room for one more
        for restore_id in list(self._restore_plans)[: max(0, excess)]:
            del self._restore_plans[restore_id]
