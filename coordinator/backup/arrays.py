"""The arrays' side of one backup run: each array's snapshot prepared before the freeze, committed
within the budget while frozen, finished after the thaw; on failure, aborted and deleted.

Its rules:
- each array's snapshot is in the resource ledger (by the backup's id, its name) before the array
  is asked for anything; its entry goes once the run knows no snapshot is left there (deleted, or
  never asked for), and stays otherwise, for the coordinator's retries; a completed backup takes
  its snapshots from the ledger when the catalog records it;
- a snapshot call that failed may still have made its snapshot: its name is left for cleanup;
- every snapshot a failed run made is deleted, or recorded for cleanup when it cannot be;
- a prepare or commit still running is never aborted or finished under it: it is waited for
  (bounded by the straggler grace), or what it set up is logged and kept with the run's warnings;
- a failed finish or abort never fails the run: what it left is kept with the run's warnings.

Driver calls go on in their worker threads when their coroutine is cancelled, so the tasks
started here are never cancelled: what they make is kept, and handled once they end.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence

from ringsnap.coordinator.backup.model import BackupFailed, BackupRun
from ringsnap.coordinator.backup.tasks import Cancelled, Done, Failed, Running, settled, triage
from ringsnap.coordinator.model import CleanupRequest
from ringsnap.coordinator.ports import ArrayPort
from ringsnap.coordinator.runs.ledger import Ledger
from ringsnap.coordinator.runs.resources import array_snapshot
from ringsnap.logs import get_logger
from ringsnap.plugins.api import PreparedSnapshot
from ringsnap.plugins.errors import DriverError, SnapshotMismatchError
from ringsnap.plugins.middleware import deadline
from ringsnap.plugins.types import SnapshotRef, Volume

log = get_logger(__name__)


class ArrayRun:
    """The array work of `run`, on `arrays`; made for one run and used once."""

    def __init__(
        self, arrays: Mapping[str, ArrayPort], run: BackupRun, ledger: Ledger | None = None
    ) -> None:
        self.arrays = arrays
        self.run = run
        self.ledger = ledger
        # The ledger entry of each array's snapshot, recorded before the array is asked.
        self._entries: dict[str, int] = {}
        # Prepared snapshots not yet finished or aborted, by array.
        self._prepared: dict[str, PreparedSnapshot] = {}
        # Arrays whose commit returned a snapshot (finished, not aborted, when released).
        self._committed: set[str] = set()
        # Prepares that outlived their timeout; aborted once they end.
        self._late_prepares: list[tuple[str, asyncio.Task[PreparedSnapshot]]] = []
        # Commits that overran the freeze budget; cleaned up once they end.
        self._stragglers: list[tuple[str, asyncio.Task[SnapshotRef]]] = []
        # The arrays in the plan's order (the order of the commits and of the snapshots).
        self._order: list[str] = []

    async def prepare(self, per_array: Mapping[str, Sequence[Volume]]) -> None:
        """Before the freeze: every array readies its snapshot; a failure fails the run (whose
        discard aborts what the others prepared)."""
        timeout = self.run.settings.agent_timeout
        self._order = list(per_array)
        await self._record(sorted(per_array))
        tasks = {
            array: asyncio.create_task(
                self.arrays[array].prepare_group_snapshot(per_array[array], self.run.backup_id)
            )
            for array in sorted(per_array)
        }
        try:
            if tasks:
                await asyncio.wait(tasks.values(), timeout=timeout)
        except asyncio.CancelledError:
            # A stopping coordinator does not wait for the prepares still running.
            self._prepared_by(tasks, cancelled=True)
            raise
        failures = self._prepared_by(tasks, cancelled=False)
        if failures:
            raise BackupFailed("; ".join(failures))

    async def _record(self, arrays: Sequence[str]) -> None:
        """Each array's snapshot in the ledger, by the name the array will give it."""
        if self.ledger is None:
            return
        for array in arrays:
            port = self.arrays[array]
            self._entries[array] = await self.ledger.record(
                array_snapshot(
                    self.run.cluster,
                    array,
                    self.run.backup_id,
                    f"backup {self.run.backup_id} asked array {array} for its snapshot",
                    node=port.capabilities().extra.get("node_local", ""),
                )
            )

    def _prepared_by(
        self, tasks: Mapping[str, asyncio.Task[PreparedSnapshot]], *, cancelled: bool
    ) -> list[str]:
        """Keep what the ended prepares made; say what went wrong with each of the others."""
        timeout = self.run.settings.agent_timeout
        failures = []
        for array, task in tasks.items():
            match triage(task):
                case Running():
                    if cancelled:
                        self._prepare_left_running(array, task, "the run was cancelled")
                    else:
                        failures.append(
                            f"array {array}: preparing the snapshot: no answer within {timeout:g} s"
                        )
                        self._late_prepares.append((array, task))
                case Cancelled():
                    failures.append(
                        f"array {array}: preparing the snapshot failed: the prepare was cancelled"
                    )
                case Failed(error=error):
                    failures.append(f"array {array}: preparing the snapshot failed: {error}")
                    self._report_left_behind(array, "preparing the snapshot", error)
                case Done(value=prepared):
                    self._prepared[array] = prepared
                    if prepared.existing is not None:
                        # Its image predates this run's freeze: never recorded as this backup,
                        # and not this run's to delete.
                        failures.append(
                            f"array {array}: a snapshot named {prepared.existing.snapshot_name!r}"
                            " exists already (taken before this run's freeze); delete it or use"
                            " another backup id"
                        )
        return failures

    async def commit(self, budget: float) -> None:
        """One atomic group snapshot per prepared array, in parallel, all done within `budget` s."""
        # The retry deadline leaves room for the last attempt to come back inside the budget.
        with deadline(budget * 0.7) as call_budget:
            tasks = {
                array: asyncio.create_task(self._commit(array, self._prepared[array]))
                for array in self._order
            }
        try:
            await asyncio.wait(tasks.values(), timeout=max(budget, 0.0))
        except asyncio.CancelledError:
            # The calls go on in their threads, and a stopping coordinator does not wait for
            # them: what they make is found by name later. Their set-up is left to the driver's
            # next sweep, not removed under a running snapshot call.
            self._committed_by(tasks, None, cancelled=True)
            raise
        failures = self._committed_by(tasks, call_budget.last_error, cancelled=False)
        if failures:
            raise BackupFailed("; ".join(failures))

    async def _commit(self, array: str, prepared: PreparedSnapshot) -> SnapshotRef:
        ref = await self.arrays[array].commit_group_snapshot(prepared)
        self._committed.add(array)
        return ref

    def _committed_by(
        self,
        tasks: Mapping[str, asyncio.Task[SnapshotRef]],
        said: BaseException | None,
        *,
        cancelled: bool,
    ) -> list[str]:
        """Keep the snapshots the ended commits made; say what went wrong with the others."""
        failures = []
        for array, task in tasks.items():
            match triage(task):
                case Running() if cancelled:
                    why = "cancelled while its snapshot call was running"
                    self._abandon_prepared(array, why)
                    self._leave_name(array, why)
                case Running():
                    failures.append(
                        f"array {array}: snapshot call still running after the freeze budget"
                        f" ({self.run.settings.freeze_budget:g} s); the nodes were thawed to"
                        " protect client writes"
                        + (f"; the array's last answer: {said}" if said is not None else "")
                    )
                    # Not cancelled: the driver runs in a thread; its result is cleaned up when
                    # it ends.
                    self._stragglers.append((array, task))
                case Cancelled():
                    failures.append(f"array {array}: snapshot call cancelled")
                    self._commit_failed(array, "cancelled")
                case Failed(error=error):
                    failures.append(f"array {array}: snapshot failed: {error}")
                    self._commit_failed(array, error)
                case Done(value=ref):
                    self.run.snapshots.append(ref)
        return failures

    async def finish(self) -> None:
        """After the thaw: each array completes the description of its snapshot (what the commit
        left to read once writes flow again), then removes what its prepare set up. A failed
        read never fails the run; a snapshot the array describes as holding other volumes than
        asked for does, once every array is finished (the run's discard then deletes it, or
        records it for the cleanup)."""
        refused = await asyncio.gather(*(self._describe(i) for i in range(len(self.run.snapshots))))
        await self._release(list(self._prepared))
        if any(refused):
            raise BackupFailed("; ".join(reason for reason in refused if reason))

    async def _describe(self, index: int) -> str:
        """Describe snapshot `index`; why it is refused ('' when it is not)."""
        ref = self.run.snapshots[index]
        prepared = self._prepared.get(ref.array)
        if prepared is None:
            return ""
        try:
            self.run.snapshots[index] = await self.arrays[ref.array].describe_group_snapshot(
                prepared, ref
            )
        except SnapshotMismatchError as exc:
            # What the array made, every volume it holds named: what the discard deletes.
            self.run.snapshots[index] = exc.snapshot
            return (
                f"array {ref.array}: {exc}. The snapshot is deleted with this failed run, or kept"
                " as a pending cleanup when it cannot be; check the group on the array and run"
                " the backup again"
            )
        except Exception as exc:  # the snapshot is good; its driver finds it by name
            self._warn(
                ref.array,
                f"array {ref.array}: snapshot {ref.snapshot_name!r} was taken, but reading its"
                f" description after the thaw failed ({exc}); it is recorded by name and found"
                " by name when it is used",
            )
        return ""

    async def discard(self, reason: str) -> None:
        """Abort what a failed run prepared and delete what it made; record for cleanup what
        cannot be deleted now. Calls still running are waited for, each up to the grace."""
        grace = self.run.settings.straggler_grace
        # A straggler's handle is released only once its commit has ended (below).
        running = {array for array, _ in self._stragglers}
        await self._release([a for a in self._prepared if a not in running])
        late, self._late_prepares = self._late_prepares, []
        for array, prepare in late:
            match await settled(prepare, grace):
                case Running():
                    self._prepare_left_running(array, prepare, "no answer")
                case Failed(error=error):
                    log.info("late prepare failed", array=array, error=str(error))
                    self._report_left_behind(array, "preparing the snapshot", error)
                case Done(value=prepared):
                    self._prepared[array] = prepared
                    await self._release([array])
        for ref in list(self.run.snapshots):
            if await self._delete(ref, f"{reason}; delete failed"):
                log.info(
                    "deleted snapshot of failed run", array=ref.array, snapshot=ref.snapshot_name
                )
        self.run.snapshots.clear()
        stragglers, self._stragglers = self._stragglers, []
        # What became of each call that outlived the freeze budget is kept with the run's
        # warnings: the failed run's record says where its late snapshot went.
        overran = "the snapshot call that outlived the freeze budget"
        for array, commit in stragglers:
            match await settled(commit, grace):
                case Running():
                    # Its prepared set-up stays too: the driver's next prepare sweeps it.
                    self._abandon_prepared(array, "its snapshot call never returned")
                    self._leave_name(array, f"{reason}; call never returned")
                    self._warn(
                        array,
                        f"array {array}: {overran} did not return within {grace:g} s; the snapshot"
                        f" it may make is a pending cleanup, looked for by name",
                    )
                case Failed(error=error):
                    self._commit_failed(array, error)
                    self._warn(
                        array,
                        f"array {array}: {overran} failed after the thaw ({error}); the snapshot"
                        " the array may have made anyway is a pending cleanup, looked for by name",
                    )
                    await self._release([array])
                case Done(value=ref):
                    await self._release([array])
                    if await self._delete(ref, f"{reason}; delete of late snapshot failed"):
                        self._warn(
                            array,
                            f"array {array}: {overran} ended after the thaw; its snapshot"
                            f" {ref.snapshot_name!r} was deleted",
                        )
                    else:
                        self._warn(
                            array,
                            f"array {array}: {overran} ended after the thaw; its snapshot"
                            f" {ref.snapshot_name!r} could not be deleted and is a pending cleanup",
                        )
        await self._forget_deleted()

    async def _forget_deleted(self) -> None:
        """The ledger entries of the arrays where nothing is left (their snapshot deleted, or
        never asked for) go; the others stay, joined by the run's record of what is left."""
        if self.ledger is None:
            return
        left = {cleanup.array for cleanup in self.run.pending_cleanups}
        for array, entry in list(self._entries.items()):
            if array not in left:
                await self.ledger.gone(entry)
                del self._entries[array]

    async def _delete(self, ref: SnapshotRef, failed: str) -> bool:
        """Delete `ref`, or record it for the cleanup with `failed` and the reason."""
        try:
            await self.arrays[ref.array].delete_snapshot(ref)
        except Exception as exc:  # recorded, and retried by the cleanup
            self.run.pending_cleanups.append(
                CleanupRequest(array=ref.array, reason=f"{failed}: {exc}", ref=ref)
            )
            return False
        return True

    async def _release(self, arrays: Iterable[str]) -> None:
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
                left = list(getattr(exc, "left_on_array", ()))
                # One sentence with the array's answer and what it kept, for the catalog.
                said = str(exc) if isinstance(exc, DriverError) else f"array {array}: {exc}"
                self.run.array_warnings.append(f"{step} of the prepared snapshot failed: {said}")
                log.warning(
                    f"{step} of a prepared snapshot failed; the driver removes what is left before"
                    " its next snapshot of these volumes",
                    backup_id=self.run.backup_id,
                    array=array,
                    error=str(exc),
                    leftovers=left,
                )

        pending = [(a, self._prepared.pop(a)) for a in list(arrays) if a in self._prepared]
        await asyncio.gather(*(release(array, prepared) for array, prepared in pending))

    # -- what is left on the arrays, for the record ------------------------------------------------

    def _warn(self, array: str, warning: str) -> None:
        """Logged, and kept with the run's warnings (the record shows them)."""
        self.run.array_warnings.append(warning)
        log.warning(warning, backup_id=self.run.backup_id, array=array)

    def _leave_name(self, array: str, reason: str) -> None:
        """The cleanup looks for a snapshot of the run's name on `array`."""
        self.run.pending_cleanups.append(
            CleanupRequest(array=array, reason=reason, snapshot_name=self.run.backup_id)
        )

    def _commit_failed(self, array: str, error: BaseException | str) -> None:
        """A failed snapshot call may still have made its snapshot, or part of it (a request
        that timed out after the array acted, retries stopped by the freeze budget, a failed
        read of what the array made): the cleanup looks for it by name."""
        self._leave_name(
            array, f"its snapshot call failed ({error}); the array may have made it anyway"
        )

    def _abandon_prepared(self, array: str, why: str) -> None:
        """Give up the prepared snapshot of `array` without finish or abort (its commit may
        still be running, and a finish or abort must not run under it). What its prepare set up
        stays on the array until the driver's next prepare of these volumes."""
        prepared = self._prepared.pop(array, None)
        if prepared is None or not prepared.state:
            return
        setup = ", ".join(f"{key} {value}" for key, value in prepared.state)
        self._warn(
            array,
            f"array {array}: {why}; what its prepare set up stays on the array until the"
            f" driver's next snapshot of these volumes: {setup}",
        )

    def _prepare_left_running(
        self, array: str, task: asyncio.Task[PreparedSnapshot], why: str
    ) -> None:
        """A prepare nobody waits for any more: no abort will remove what it sets up (the
        driver's next prepare of these volumes does)."""
        self._warn(
            array,
            f"array {array}: {why} while preparing the snapshot; what the prepare set up on the"
            " array (e.g. a temporary consistency group) is removed by the driver before its next"
            " snapshot of these volumes",
        )

        def ended(done: asyncio.Task[PreparedSnapshot]) -> None:
            if isinstance(outcome := triage(done), Done):
                log.warning(
                    "a prepare nobody waited for ended; the driver's next prepare removes what it"
                    " set up",
                    backup_id=self.run.backup_id,
                    array=array,
                    state=dict(outcome.value.state),
                )

        task.add_done_callback(ended)

    def _report_left_behind(self, array: str, step: str, error: BaseException) -> None:
        """What a failed driver call says it left on the array (`DriverError.left_on_array`)."""
        left = tuple(getattr(error, "left_on_array", ()))
        if left:
            self._warn(
                array,
                f"array {array}: {step} failed and may have left {', '.join(left)}; the driver"
                " removes it before its next snapshot of these volumes",
            )
