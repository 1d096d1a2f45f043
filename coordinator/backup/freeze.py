"""The freeze barrier: every included node frozen under a short lease, the snapshot work done while
they stay frozen, every node thawed whatever happened, and the window measured.

- The freezes are bounded by the freeze budget: nodes that froze stall their writes while a slow one
  answers, and a freeze that lands after the thaw is undone by its own lease.
- The work gets what is left of the budget; none is started once the freeze used all of it.
- The leases are renewed only while the work runs, each node on its own: a node that does not answer
  never delays the others' renewals. A node whose lease can no longer be shown to run (no renewal
  confirmed within a lease, or the agent says the freeze ended) fails the run at once: every node
  is thawed then, not when the array answers, and what the array makes is discarded.
- The thaw runs in a `finally`, to completion even under cancellation; each node's thaw is awaited
  for at most a lease (at least `THAW_WAIT_FLOOR`): by then an unreachable node's lease has thawed
  it by itself, and waiting longer would only hold the run.
- A node whose lease ran out before its thaw was not frozen for the whole snapshot, and one whose
  thaw was not confirmed cannot be shown to have been: either fails the run, naming the node.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from ringsnap.coordinator.backup.model import BackupFailed
from ringsnap.coordinator.backup.tasks import bounded, raise_failures, to_completion
from ringsnap.coordinator.model import FreezeWindow
from ringsnap.coordinator.ports import AgentPort, FreezeReceipt, ThawReceipt
from ringsnap.logs import get_logger

log = get_logger(__name__)

#: Keeps the leases of the frozen nodes alive until cancelled: (agents, operation id, lease, each
#: node's `held_until`, each node's event set when its freeze answered: its renewals start then).
#: Raises BackupFailed when a node's lease can no longer be shown to run.
Renewer = Callable[
    [Mapping[str, AgentPort], str, float, dict[str, float], Mapping[str, asyncio.Event]],
    Coroutine[Any, Any, None],
]
#: The shortest wait for a thaw's answer, whatever the lease (an agent's answer crosses a network).
THAW_WAIT_FLOOR = 1.0
#: Agent answers (gRPC status names) that say the freeze has ended: no renewal can revive it.
_FREEZE_ENDED = frozenset({"FAILED_PRECONDITION", "NOT_FOUND"})


@dataclass
class FreezeBarrier:
    """One freeze of `agents` for operation `operation_id`; `window` is set once they are thawed."""

    agents: Mapping[str, AgentPort]
    operation_id: str
    budget: float
    lease: float
    renew: Renewer
    window: FreezeWindow | None = None

    async def hold(
        self, work: Callable[[float], Awaitable[None]], *, on_frozen: Callable[[], None]
    ) -> None:
        """Freeze every node, then `work(seconds left of the budget)`, then thaw every node."""
        freezes: dict[str, FreezeReceipt] = {}
        thaws: dict[str, ThawReceipt] = {}
        started = time.monotonic()
        frozen_at: float | None = None
        array_call = 0.0
        # Started as soon as a node is lost while the work runs; else as the renewer is stopped.
        thawing: asyncio.Future[dict[str, ThawReceipt]] | None = None
        thaw_started = 0.0
        lost: BaseException | None = None
        # Per node, on the monotonic clock: its lease surely runs until then (an agent starts a
        # lease when it gets the request, so a lease after the last confirmed request was sent).
        held_until = {name: started + self.lease for name in self.agents}
        work_ended: float | None = None
        # The work's own failure, reported after what the thaw says of the nodes.
        work_error: BackupFailed | None = None
        # Set when a node's freeze answered: its renewals start then, not once every node froze
        # (a freeze phase longer than a lease would let the first nodes' leases run out).
        frozen = {name: asyncio.Event() for name in self.agents}
        renewer = asyncio.create_task(
            self.renew(self.agents, self.operation_id, self.lease, held_until, frozen)
        )
        freezing = asyncio.ensure_future(self._freeze_all(held_until, frozen, freezes))
        try:
            try:
                await asyncio.wait([freezing, renewer], return_when=asyncio.FIRST_COMPLETED)
                if not freezing.done() and (lost := _failure(renewer)) is not None:
                    # A node that froze is lost while others still freeze: the run has failed;
                    # the frozen nodes are thawed now, and a freeze that lands after the thaw is
                    # undone by its own lease.
                    log.warning(
                        "a frozen node is lost while freezing; thawing every node now",
                        backup_id=self.operation_id,
                        error=str(lost),
                    )
                    raise lost
                results = await freezing
                raise_failures([f"node {n}" for n in self.agents], "freeze", results)
                frozen_at = time.monotonic()
                self._check_leases_run(held_until, frozen_at, renewer)
                on_frozen()
                remaining = self.budget - (frozen_at - started)
                if remaining <= 0:
                    # A snapshot call started now would run on after the thaw: not a frozen image.
                    raise BackupFailed(
                        f"freezing took {frozen_at - started:.2f} s, the whole freeze budget"
                        f" ({self.budget:g} s); no snapshot was started. Check the nodes'"
                        " disks and load, or raise freeze_budget_seconds below the write timeout"
                    )
                work_started = time.monotonic()
                working = asyncio.ensure_future(work(remaining))
                try:
                    await asyncio.wait([working, renewer], return_when=asyncio.FIRST_COMPLETED)
                    if not working.done() and (lost := _failure(renewer)) is not None:
                        # That node may thaw (or has) before the snapshot: the run has failed.
                        # The others stall their clients' writes for nothing: thaw them now, not
                        # when the array answers; the array call ends (or overruns) as usual and
                        # is discarded.
                        log.warning(
                            "a frozen node is lost; thawing every node now",
                            backup_id=self.operation_id,
                            error=str(lost),
                        )
                        thaw_started = time.monotonic()
                        thawing = asyncio.ensure_future(
                            thaw_all(self.agents, self.operation_id, self._thaw_wait)
                        )
                    try:
                        await working
                        work_ended = time.monotonic()
                    except BackupFailed as exc:
                        work_error = exc
                finally:
                    array_call = (thaw_started or time.monotonic()) - work_started
                    if not working.done():  # this run was cancelled while waiting
                        working.cancel()
                        await asyncio.wait([working])
            finally:
                renewer.cancel()
                if not freezing.done():  # lost while freezing, or this run was cancelled
                    # Given up before the thaw goes out; a freeze that lands anyway is undone by
                    # its lease.
                    freezing.cancel()
                    await asyncio.wait([freezing])
                if thawing is None:
                    # Now, not once the renewer has wound down a task per node: a renewal that
                    # lands after the thaw is refused by the agent and changes nothing.
                    thaw_started = time.monotonic()
                    thawing = asyncio.ensure_future(
                        thaw_all(self.agents, self.operation_id, self._thaw_wait)
                    )
                # `wait`, not `await renewer` under suppress(CancelledError): that would also
                # swallow a cancellation of this run arriving meanwhile.
                await asyncio.wait([renewer])
                if lost is None and (late := _failure(renewer)) is not None:
                    if work_error is not None:
                        lost = late  # lost as the work failed: the record names the node too
                    else:
                        # Lost after the work ended: the thaw's answer says whether it held.
                        log.warning(
                            "lease renewal failed", backup_id=self.operation_id, error=str(late)
                        )
        finally:
            if thawing is None:
                thaw_started = time.monotonic()
                thawing = asyncio.ensure_future(
                    thaw_all(self.agents, self.operation_id, self._thaw_wait)
                )
            thaws = await to_completion(thawing)
            ended = time.monotonic()
            self.window = FreezeWindow(
                total=ended - started,
                slowest_freeze=max((f.freeze_seconds for f in freezes.values()), default=0.0),
                array_call=array_call,
                slowest_thaw=max((t.thaw_seconds for t in thaws.values()), default=0.0),
                freezing=frozen_at - started if frozen_at is not None else None,
                thawing=ended - thaw_started,
            )
            log.info(
                "freeze window",
                backup_id=self.operation_id,
                window_ms=round(self.window.total * 1000, 1),
                freezing_ms=_ms(self.window.freezing),
                array_call_ms=_ms(array_call),
                thawing_ms=_ms(self.window.thawing),
                agents_slowest_freeze_ms=_ms(self.window.slowest_freeze),
                agents_slowest_thaw_ms=_ms(self.window.slowest_thaw),
                overhead_ms=_ms(self.window.overhead),
            )
        problems = [str(lost)] if lost is not None else []
        if work_error is not None:
            problems.append(str(work_error))
        # A lease that ran out after the snapshot call had answered (a thaw held up on its way, on
        # a lossy link) held the node frozen through the snapshot: the coordinator's clock says so.
        # Reached only once every node's freeze answered (a freeze that did not raised above), so
        # each `held_until` here is a confirmed lease, never the seed of a node that did not answer.
        expired = [
            name
            for name, t in thaws.items()
            if t.lease_expired
            and work_error is None
            and (work_ended is None or held_until[name] < work_ended)
        ]
        if expired:
            problems.append(
                f"the freeze lease ran out on {', '.join(sorted(expired))} before the snapshot"
                " finished, so those nodes were not quiesced for it; raise the lease or check the"
                " agent's clock and load"
            )
        unconfirmed = [name for name in self.agents if name not in thaws]
        if unconfirmed:
            problems.append(
                f"the thaw of {', '.join(unconfirmed)} was not confirmed within"
                f" {self._thaw_wait:g} s, so those nodes cannot be shown to have stayed frozen"
                f" through the snapshot; each thaws by its lease ({self.lease:g} s) by itself."
                " Check the network between the coordinator and their agents"
            )
        if problems:
            raise BackupFailed("; ".join(problems)) from work_error

    async def _freeze_all(
        self,
        held_until: dict[str, float],
        frozen: Mapping[str, asyncio.Event],
        freezes: dict[str, FreezeReceipt],
    ) -> list[FreezeReceipt | BaseException]:
        """Every node's freeze in parallel, each bounded by the budget; a node's event is set (its
        renewals start) and its receipt kept as soon as it answers. Each node's lease is counted
        from when its own request was sent: with many nodes the sends spread over the event
        loop's turns, and the first node's send time would cut the last ones' leases short."""

        async def freeze(name: str, agent: AgentPort) -> FreezeReceipt:
            held_until[name] = time.monotonic() + self.lease
            receipt = await agent.freeze(self.operation_id, self.lease)
            freezes[name] = receipt
            frozen[name].set()
            return receipt

        return await asyncio.gather(
            *(
                bounded("freeze budget", freeze(name, agent), self.budget)
                for name, agent in self.agents.items()
            ),
            return_exceptions=True,
        )

    def _check_leases_run(
        self, held_until: Mapping[str, float], now: float, renewer: asyncio.Task[None]
    ) -> None:
        """Before any snapshot call: every node's lease must still be shown to run. A node whose
        freeze (or last renewal) was confirmed only past a lease of its sending may have thawed
        by itself: its renewer is about to fail the run; no snapshot is started meanwhile."""
        if (lost := _failure(renewer)) is not None:
            raise lost
        late = [name for name in self.agents if held_until[name] <= now]
        if late:
            raise BackupFailed(
                f"{', '.join(f'node {name}' for name in late)}: no freeze or lease renewal"
                f" confirmed within a lease ({self.lease:g} s) of its sending: the node may have"
                " thawed by itself, so no snapshot was started and every node was thawed. Check"
                " the node's load and the network to its agent, or raise lease_seconds"
            )

    @property
    def _thaw_wait(self) -> float:
        return max(self.lease, THAW_WAIT_FLOOR)


def _failure(task: asyncio.Task[None]) -> BaseException | None:
    """What an ended task raised (None while it runs, once it returned or was cancelled)."""
    if not task.done() or task.cancelled():
        return None
    return task.exception()


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


async def renew_leases(
    agents: Mapping[str, AgentPort],
    operation_id: str,
    lease: float,
    held_until: dict[str, float],
    frozen: Mapping[str, asyncio.Event],
) -> None:
    """Keep every node's freeze alive from its freeze's answer (`frozen[node]` set) until
    cancelled, each node on its own; `held_until[node]` (monotonic) is moved on with every
    confirmed renewal. Raises BackupFailed naming the nodes whose lease can no longer be shown to
    run."""
    tasks = [
        asyncio.create_task(
            _keep_renewed(
                name, agent, operation_id, lease, held_until=held_until, frozen=frozen[name]
            )
        )
        for name, agent in agents.items()
    ]
    if not tasks:
        return
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        problems = [str(error) for task in tasks if task in done and (error := task.exception())]
        raise BackupFailed("; ".join(problems))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks)


async def _keep_renewed(
    name: str,
    agent: AgentPort,
    operation_id: str,
    lease: float,
    *,
    held_until: dict[str, float],
    frozen: asyncio.Event,
) -> None:
    """Once the node's freeze answered (`frozen`), renew its lease every third of a lease; a
    failed renewal is retried while the lease surely still runs. The agent starts (and restarts) a
    lease only after it received the request, so a lease runs at least until a lease after the
    confirmed request was sent; past that, the node may have thawed by itself (or is about to),
    and a snapshot cannot be shown to hold it frozen."""
    await frozen.wait()
    valid_until = held_until[name]
    # What the failure says if no renewal was tried: a freeze answered past its lease (a slow
    # node, or a coordinator too busy to read the answer in time).
    error: BaseException | str = (
        f"its freeze answered {time.monotonic() - valid_until + lease:.2f} s after it was sent"
    )
    retry, delay = False, 0.0
    while True:
        # Due once a third of the lease has passed since the last confirmed request was sent.
        due = valid_until - lease * 2 / 3
        await asyncio.sleep(max(0.0, due - time.monotonic()) if not retry else delay)
        sent = time.monotonic()
        left = valid_until - sent
        if left <= 0:
            raise BackupFailed(
                f"node {name}: no lease renewal confirmed for {sent - valid_until + lease:.2f} s"
                f" (the lease is {lease:g} s; last error: {error}): the node may have thawed by"
                " itself before the snapshot was taken, so every node was thawed. Check the"
                " network between the coordinator and this node's agent"
            )
        try:
            # `timeout`, not `wait_for`: on 3.11 `wait_for` swallows a cancellation that comes as
            # the renewal answers, and this task would go on renewing after the barrier ended it
            # (a lost node then failed the run only when the array answered).
            async with asyncio.timeout(left):
                await agent.renew(operation_id, lease)
        except TimeoutError:
            error, retry, delay = f"no answer within {left:.2f} s", True, 0.0
        except Exception as exc:
            if getattr(exc, "code", "") in _FREEZE_ENDED:
                raise BackupFailed(
                    f"node {name}: its freeze has ended before the snapshot was taken ({exc});"
                    " every node was thawed"
                ) from exc
            # Retried at once if the lease leaves room, a little later if it answered at once.
            error, retry = exc, True
            delay = min(lease / 10, max(valid_until - time.monotonic(), 0.0))
            log.warning("lease renewal failed", node=name, error=str(exc))
        else:
            valid_until, retry = sent + lease, False
            held_until[name] = valid_until


async def thaw_all(
    agents: Mapping[str, AgentPort], operation_id: str, wait: float
) -> dict[str, ThawReceipt]:
    """Thaw every node in parallel; each answer awaited `wait` seconds at most. A node missing
    from the receipts did not confirm its thaw (its lease thaws it)."""
    results = await asyncio.gather(
        *(bounded("thaw", a.thaw(operation_id), wait) for a in agents.values()),
        return_exceptions=True,
    )
    receipts: dict[str, ThawReceipt] = {}
    for name, result in zip(agents, results, strict=True):
        if isinstance(result, BaseException):
            # The lease thaws this node by itself within one lease length.
            log.error("thaw failed; the node's lease will thaw it", node=name, error=str(result))
        else:
            receipts[name] = result
    return receipts
