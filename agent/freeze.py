"""Freezing the node's Cassandra filesystems under a lease.

Rules (docs/backup-protocol.md, "Safety rules and invariants"):
- only filesystems that hold a configured data or commit-log directory are ever frozen; never `/`,
  the filesystem of the agent's state directory, or the one its own program runs from (the rule
  restores follow too: `ringsnap.agent.protected`);
- every freeze is recorded (fsynced) before the first ioctl; the record goes only once all is thawed;
- a watchdog task per operation thaws when the lease runs out, whatever the caller does;
- an operation id freezes at most once: repeating the call returns the same result, reusing the id
  of an ended operation is refused;
- a filesystem frozen by another operation (or by someone outside the agent) is refused.

Ioctls run in a small dedicated thread pool, so the event loop (and with it every watchdog) never
waits behind a slow FIFREEZE.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import errno
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ringsnap import logs, mountinfo
from ringsnap.agent import fsfreeze
from ringsnap.agent.errors import Conflict, FreezeFailed, NotFound
from ringsnap.agent.freezable import Freezable, freezable, freeze_targets
from ringsnap.agent.freezestate import StateStore, thaw_all, valid_operation_id
from ringsnap.agent.lease import Clock, Lease, LeasePolicy
from ringsnap.agent.metrics import AgentMetrics
from ringsnap.errors import ValidationError

log = logs.get_logger(__name__)
_HISTORY = 1024
_THAW_RETRY_SECONDS = (0.1, 0.5, 2.0, 10.0, 30.0)


class State(enum.Enum):
    FREEZING = "freezing"
    FROZEN = "frozen"
    THAWING = "thawing"
    ENDED = "ended"


class EndReason(enum.Enum):
    THAWED = "thawed by request"
    LEASE_EXPIRED = "lease expired"
    SHUTDOWN = "agent shutting down"
    FAILED = "freeze failed"


@dataclass(frozen=True, slots=True)
class FrozenFilesystem:
    mount_point: str
    #: Unix time when the filesystem was frozen (the ioctl returned).
    frozen_at: float
    #: How long FIFREEZE took (the kernel writes back dirty data inside it).
    freeze_seconds: float
    #: How long the syncfs before it took (0 without sync_first).
    sync_seconds: float


@dataclass(frozen=True, slots=True)
class FreezeResult:
    run_id: str
    filesystems: tuple[FrozenFilesystem, ...]
    lease_expires_at: float


@dataclass(frozen=True, slots=True)
class ThawedFilesystem:
    mount_point: str
    #: False if it was no longer frozen when this call came (the lease, or an operator, thawed it).
    was_frozen: bool
    #: How long it stayed frozen, if this call thawed it.
    frozen_seconds: float | None = None
    thaw_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class ThawResult:
    run_id: str
    filesystems: tuple[ThawedFilesystem, ...]
    lease_expired: bool


@dataclass
class _Operation:
    run_id: str
    mount_points: tuple[str, ...]
    devices: frozenset[int]
    lease: Lease
    state: State = State.FREEZING
    frozen: dict[str, FrozenFilesystem] = field(default_factory=dict)
    frozen_mono: dict[str, float] = field(default_factory=dict)
    freeze_done: asyncio.Event = field(default_factory=asyncio.Event)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    ending: asyncio.Future[ThawResult] | None = None
    end_reason: EndReason | None = None
    watchdog: asyncio.Task[None] | None = None
    thaw_failures: int = 0
    thawed: list[ThawedFilesystem] = field(default_factory=list)


class FreezeManager:
    def __init__(
        self,
        *,
        data_directories: Sequence[Path],
        commitlog_directory: Path,
        store: StateStore,
        policy: LeasePolicy,
        clock: Clock = time.monotonic,
        mounts: Callable[[], list[mountinfo.Mount]] = mountinfo.read,
        metrics: AgentMetrics | None = None,
    ) -> None:
        self.metrics = metrics or AgentMetrics()
        self._directories = {"data": list(data_directories), "commitlog": [commitlog_directory]}
        self._store = store
        self.policy = policy
        self._clock = clock
        self._mounts = mounts
        self._active: dict[str, _Operation] = {}
        self._ended: OrderedDict[str, _Operation] = OrderedDict()
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="ringsnap-freeze")

    # -- what may be frozen -------------------------------------------------------------------

    def freezable(self) -> tuple[list[Freezable], dict[str, str]]:
        """(filesystems that may be frozen, {mount point: why it may not}) for the configured
        data and commit-log directories, as mounted now."""
        return freezable(self._directories, self._mounts(), self._store.directory)

    def _targets(self, requested: Sequence[str]) -> list[Freezable]:
        allowed, refused = self.freezable()
        return freeze_targets(requested, allowed, refused)

    # -- freeze, renew, thaw ------------------------------------------------------------------

    async def freeze(
        self,
        run_id: str,
        mount_points: Sequence[str] = (),
        *,
        lease_seconds: float | None = None,
        sync_first: bool = False,
    ) -> FreezeResult:
        _check_operation_id(run_id)
        seconds = self.policy.choose(lease_seconds)
        existing = self._active.get(run_id) or self._ended.get(run_id)
        targets = self._targets(mount_points)
        wanted = tuple(sorted(fs.mount_point for fs in targets))
        if existing is not None:
            return await self._repeat(existing, wanted)
        devices = frozenset(fs.device_number for fs in targets)
        for other in self._active.values():
            if other.devices & devices:
                busy = sorted(set(other.mount_points) & set(wanted)) or list(other.mount_points)
                raise Conflict(
                    f"{', '.join(busy)} is frozen by operation {other.run_id!r}; thaw it"
                    " first or wait for its lease to run out"
                )
        # Registered synchronously, before any await: a concurrent request sees the operation and
        # cannot claim the same devices.
        operation = _Operation(
            run_id=run_id,
            mount_points=wanted,
            devices=devices,
            lease=Lease(seconds, clock=self._clock),
        )
        self._active[run_id] = operation
        # Shielded: a caller that disconnects mid-freeze must not cancel the bookkeeping that the
        # watchdog relies on to thaw.
        work = asyncio.ensure_future(self._freeze_operation(operation, sync_first))
        return await asyncio.shield(work)

    async def _freeze_operation(self, operation: _Operation, sync_first: bool) -> FreezeResult:
        run_id, wanted = operation.run_id, operation.mount_points
        loop = asyncio.get_running_loop()
        # syncfs freezes nothing: it writes back while the record is written, so that the
        # record's fsync (milliseconds, much more on a busy disk) is not added to the freeze.
        # No FIFREEZE starts before the record is durable.
        syncs = {
            point: loop.run_in_executor(self._pool, fsfreeze.syncfs, point)
            for point in (wanted if sync_first else ())
        }
        try:
            await loop.run_in_executor(self._pool, self._store.write, run_id, wanted)
        except BaseException:
            self._active.pop(run_id, None)
            await asyncio.gather(*syncs.values(), return_exceptions=True)
            raise
        operation.watchdog = asyncio.create_task(
            self._watch(operation), name=f"lease-{run_id}"
        )
        log.info(
            "freezing",
            run_id=run_id,
            mount_points=list(wanted),
            lease_seconds=operation.lease.seconds,
            sync_first=sync_first,
        )

        # Every syncfs is done before the first FIFREEZE: a filesystem frozen as soon as its own
        # syncfs returned (the small commit log's, first) would stall Cassandra's writes while
        # the others still write back. A failed syncfs freezes nothing.
        synced = await asyncio.gather(*syncs.values(), return_exceptions=True)
        sync_seconds = dict(zip(syncs, synced, strict=True))
        failures: list[tuple[str, BaseException]] = [
            (point, error)
            for point, error in sync_seconds.items()
            if isinstance(error, BaseException)
        ]
        outcomes: list[tuple[float, FrozenFilesystem] | BaseException] = []
        if not failures:
            outcomes = await asyncio.gather(
                *(
                    loop.run_in_executor(
                        self._pool, _freeze_one, point, _seconds(sync_seconds.get(point, 0.0))
                    )
                    for point in wanted
                ),
                return_exceptions=True,
            )
        for point, outcome in zip(wanted, outcomes, strict=False):
            if isinstance(outcome, BaseException):
                failures.append((point, outcome))
            else:
                frozen_at_mono, frozen = outcome
                operation.frozen[point] = frozen
                operation.frozen_mono[point] = frozen_at_mono
        operation.state = State.FROZEN
        operation.freeze_done.set()
        for frozen in operation.frozen.values():
            self.metrics.freeze_seconds.observe(frozen.freeze_seconds)
        self.metrics.freezes.labels(result="failed" if failures else "ok").inc()
        if failures:
            error = _freeze_error(failures)
            await self._end(operation, EndReason.FAILED)
            raise error
        result = self._freeze_result(operation)
        log.info(
            "frozen",
            run_id=run_id,
            freeze_ms={
                fs.mount_point: round(fs.freeze_seconds * 1000, 2) for fs in result.filesystems
            },
            sync_ms={fs.mount_point: round(fs.sync_seconds * 1000, 2) for fs in result.filesystems},
        )
        return result

    async def _repeat(self, operation: _Operation, wanted: tuple[str, ...]) -> FreezeResult:
        if operation.mount_points != wanted:
            raise Conflict(
                f"operation {operation.run_id!r} froze {', '.join(operation.mount_points)},"
                f" not {', '.join(wanted)}; use a new run id"
            )
        await operation.freeze_done.wait()
        if operation.state is not State.FROZEN or operation.end_reason is not None:
            why = operation.end_reason.value if operation.end_reason else operation.state.value
            raise Conflict(
                f"operation {operation.run_id!r} has ended ({why}); its filesystems are"
                " thawed; use a new run id"
            )
        return self._freeze_result(operation)

    def _freeze_result(self, operation: _Operation) -> FreezeResult:
        return FreezeResult(
            run_id=operation.run_id,
            filesystems=tuple(operation.frozen[point] for point in operation.mount_points),
            lease_expires_at=operation.lease.expires_at_wall(),
        )

    async def renew(self, run_id: str, lease_seconds: float | None = None) -> float:
        """Extend the lease; returns its new end as a Unix time."""
        _check_operation_id(run_id)
        seconds = self.policy.choose(lease_seconds)
        operation = self._active.get(run_id)
        if operation is None or operation.state not in (State.FREEZING, State.FROZEN):
            ended = self._ended.get(run_id) or operation
            if ended is not None:
                why = ended.end_reason.value if ended.end_reason else "thawing"
                raise Conflict(
                    f"operation {run_id!r} has ended ({why}); its filesystems are thawed"
                )
            raise NotFound(f"no freeze operation {run_id!r} on this agent")
        if operation.lease.expired():
            # The watchdog is about to thaw; a late renewal must not revive the freeze.
            raise Conflict(f"the lease of operation {run_id!r} has run out")
        operation.lease.renew(seconds)
        operation.wake.set()
        self.metrics.lease_renewals.inc()
        log.debug("lease renewed", run_id=run_id, lease_seconds=seconds)
        return operation.lease.expires_at_wall()

    async def thaw(self, run_id: str) -> ThawResult:
        """Thaw what `run_id` froze. Unknown or ended operations are not an error: the result
        then says that nothing was frozen any more (`was_frozen` False)."""
        _check_operation_id(run_id)
        operation = self._active.get(run_id) or self._ended.get(run_id)
        if operation is None:
            log.info("thaw of an unknown operation: nothing frozen", run_id=run_id)
            return ThawResult(run_id, (), lease_expired=False)
        if operation.end_reason is not None and operation.state is State.ENDED:
            return _already_thawed(operation)
        if operation.ending is not None:
            # The lease (or shutdown) is thawing right now: wait for it, and report that this call
            # found the filesystems no longer held.
            await asyncio.shield(operation.ending)
            return _already_thawed(operation)
        # Shielded: a caller that disconnects must not interrupt a thaw half-way.
        return await asyncio.shield(self._end(operation, EndReason.THAWED))

    async def thaw_everything(self, reason: EndReason = EndReason.SHUTDOWN) -> list[ThawResult]:
        operations = list(self._active.values())
        results = await asyncio.gather(
            *(asyncio.shield(self._end(operation, reason)) for operation in operations),
            return_exceptions=True,
        )
        return [result for result in results if isinstance(result, ThawResult)]

    def active_operations(self) -> list[str]:
        return sorted(self._active)

    async def recover(self) -> None:
        """Thaw whatever a previous agent process recorded (run before serving)."""
        outcomes = await asyncio.get_running_loop().run_in_executor(
            self._pool, thaw_all, self._store
        )
        thawed = [outcome.mount_point for outcome in outcomes if outcome.was_frozen]
        failed = [outcome for outcome in outcomes if outcome.error]
        self.metrics.thaw_all_runs.inc()
        self.metrics.thaw_all_thawed.inc(len(thawed))
        if thawed:
            log.warning("thawed filesystems a previous agent left frozen", mount_points=thawed)
        for outcome in failed:
            log.error(
                "could not thaw a recorded freeze; the record stays",
                run_id=outcome.run_id,
                mount_point=outcome.mount_point,
                error=outcome.error,
            )

    async def close(self) -> None:
        await self.thaw_everything(EndReason.SHUTDOWN)
        self._pool.shutdown(wait=False)

    # -- the watchdog and the single path that thaws --------------------------------------------

    async def _watch(self, operation: _Operation) -> None:
        while operation.state in (State.FREEZING, State.FROZEN):
            delay = operation.lease.remaining()
            if delay <= 0:
                self.metrics.lease_expirations.inc()
                log.warning(
                    "lease expired: thawing",
                    run_id=operation.run_id,
                    lease_seconds=operation.lease.seconds,
                    renewals=operation.lease.renewals,
                )
                # A failure is logged and the next attempt already scheduled by _thaw_operation.
                with contextlib.suppress(FreezeFailed):
                    await asyncio.shield(self._end(operation, EndReason.LEASE_EXPIRED))
                return
            operation.wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(operation.wake.wait(), delay)

    async def _retry_thaw(self, operation: _Operation, reason: EndReason, delay: float) -> None:
        await asyncio.sleep(delay)
        with contextlib.suppress(FreezeFailed):  # logged; the next attempt is scheduled
            await asyncio.shield(self._end(operation, reason))

    def _end(self, operation: _Operation, reason: EndReason) -> asyncio.Future[ThawResult]:
        """Thaw the operation's filesystems once; concurrent callers share the one attempt."""
        if operation.ending is None:
            operation.ending = asyncio.ensure_future(self._thaw_operation(operation, reason))
        return operation.ending

    async def _thaw_operation(self, operation: _Operation, reason: EndReason) -> ThawResult:
        await operation.freeze_done.wait()
        operation.state = State.THAWING
        operation.end_reason = reason
        operation.wake.set()  # lets the watchdog see that it has nothing left to do
        loop = asyncio.get_running_loop()
        thawed = operation.thawed
        pending = [point for point in operation.mount_points if point in operation.frozen]
        for pause in (0.0, 0.05):
            if pause:
                await asyncio.sleep(pause)
            outcomes = await asyncio.gather(
                *(loop.run_in_executor(self._pool, fsfreeze.thaw, point) for point in pending),
                return_exceptions=True,
            )
            still: list[str] = []
            for point, outcome in zip(pending, outcomes, strict=True):
                if isinstance(outcome, BaseException):
                    still.append(point)
                    log.error(
                        "thaw failed",
                        run_id=operation.run_id,
                        mount_point=point,
                        error=str(outcome),
                    )
                    continue
                frozen_for = self._clock() - operation.frozen_mono[point]
                self.metrics.frozen_seconds.observe(frozen_for)
                thawed.append(ThawedFilesystem(point, outcome.changed, frozen_for, outcome.seconds))
                log.info(
                    "thawed",
                    run_id=operation.run_id,
                    mount_point=point,
                    reason=reason.value,
                    frozen_ms=round(frozen_for * 1000, 2),
                    thaw_ms=round(outcome.seconds * 1000, 2),
                    was_frozen=outcome.changed,
                )
            pending = still
            if not pending:
                break
        if pending:
            # Still frozen: the operation stays active (nothing else may claim the filesystems), the
            # record stays on disk, and a background task keeps trying with growing pauses.
            for fs in thawed:
                operation.frozen.pop(fs.mount_point, None)
            operation.state = State.FROZEN
            operation.ending = None
            delay = _THAW_RETRY_SECONDS[min(operation.thaw_failures, len(_THAW_RETRY_SECONDS) - 1)]
            operation.thaw_failures += 1
            operation.watchdog = asyncio.create_task(self._retry_thaw(operation, reason, delay))
            raise FreezeFailed(
                f"could not thaw {', '.join(pending)} for operation {operation.run_id!r};"
                f" retrying in {delay:g} s; `ringsnap-agent thaw-all` also retries; check the"
                " kernel log"
            )
        await loop.run_in_executor(self._pool, self._store.remove, operation.run_id)
        operation.state = State.ENDED
        self._active.pop(operation.run_id, None)
        self._ended[operation.run_id] = operation
        while len(self._ended) > _HISTORY:
            self._ended.popitem(last=False)
        order = {point: index for index, point in enumerate(operation.mount_points)}
        return ThawResult(
            operation.run_id,
            tuple(sorted(thawed, key=lambda fs: order[fs.mount_point])),
            lease_expired=reason is EndReason.LEASE_EXPIRED,
        )


def _already_thawed(operation: _Operation) -> ThawResult:
    return ThawResult(
        operation.run_id,
        tuple(ThawedFilesystem(fs.mount_point, was_frozen=False) for fs in operation.thawed),
        lease_expired=operation.end_reason is EndReason.LEASE_EXPIRED,
    )


def _freeze_one(mount_point: str, sync_seconds: float) -> tuple[float, FrozenFilesystem]:
    result = fsfreeze.freeze(mount_point)
    return time.monotonic(), FrozenFilesystem(
        mount_point=mount_point,
        frozen_at=time.time(),
        freeze_seconds=result.seconds,
        sync_seconds=sync_seconds,
    )


def _freeze_error(failures: list[tuple[str, BaseException]]) -> Exception:
    messages = []
    busy = False
    for point, error in failures:
        if isinstance(error, OSError) and error.errno == errno.EBUSY:
            busy = True
            messages.append(f"{point} is already frozen, not by this agent (fsfreeze -u it first?)")
        elif isinstance(error, OSError):
            messages.append(f"{point}: {os.strerror(error.errno or 0)}")
        else:
            messages.append(f"{point}: {error}")
    text = "freeze failed, nothing left frozen: " + "; ".join(messages)
    return Conflict(text) if busy else FreezeFailed(text)


def _check_operation_id(value: str) -> None:
    if not valid_operation_id(value):
        raise ValidationError(
            f"invalid run id {value!r}: use 1-128 letters, digits, '.', '-' or '_',"
            " starting with a letter or digit"
        )


def _seconds(outcome: float | BaseException) -> float:
    return outcome if isinstance(outcome, float) else 0.0
