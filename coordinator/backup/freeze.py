"""The freeze barrier: every included node frozen under a short lease, the snapshot work done while
they stay frozen, every node thawed whatever happened, and the window measured.

- The freezes are bounded by the freeze budget: nodes that froze stall their writes while a slow one
  answers, and a freeze that lands after the thaw is undone by its own lease.
- The work gets what is left of the budget; none is started once the freeze used all of it.
- The leases are renewed only while the work runs.
- The thaw runs in a `finally`, to completion even under cancellation.
- A node whose lease ran out before its thaw was not frozen for the whole snapshot: the run fails.
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
from ringsnap.coordinator.ports import FreezeReceipt, NodeAgent, ThawReceipt
from ringsnap.logs import get_logger

log = get_logger(__name__)

#: Keeps the leases of the frozen nodes alive until cancelled: (agents, operation id, lease).
Renewer = Callable[[Mapping[str, NodeAgent], str, float], Coroutine[Any, Any, None]]


@dataclass
class FreezeBarrier:
    """One freeze of `agents` for operation `operation_id`; `window` is set once they are thawed."""

    agents: Mapping[str, NodeAgent]
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
        try:
            results = await asyncio.gather(
                *(
                    bounded("freeze budget", a.freeze(self.operation_id, self.lease), self.budget)
                    for a in self.agents.values()
                ),
                return_exceptions=True,
            )
            freezes.update(
                (name, result)
                for name, result in zip(self.agents, results, strict=True)
                if not isinstance(result, BaseException)
            )
            raise_failures([f"node {n}" for n in self.agents], "freeze", results)
            frozen_at = time.monotonic()
            on_frozen()
            remaining = self.budget - (frozen_at - started)
            if remaining <= 0:
                # A snapshot call started now would run on after the thaw: not a frozen image.
                raise BackupFailed(
                    f"freezing took {frozen_at - started:.2f} s, the whole freeze budget"
                    f" ({self.budget:g} s); no snapshot was started. Check the nodes'"
                    " disks and load, or raise freeze_budget_seconds below the write timeout"
                )
            renewer = asyncio.create_task(self.renew(self.agents, self.operation_id, self.lease))
            work_started = time.monotonic()
            try:
                await work(remaining)
            finally:
                array_call = time.monotonic() - work_started
                renewer.cancel()
                # `wait`, not `await renewer` under suppress(CancelledError): that would also
                # swallow a cancellation of this run arriving meanwhile.
                await asyncio.wait([renewer])
        finally:
            thaw_started = time.monotonic()
            thaws = await to_completion(thaw_all(self.agents, self.operation_id))
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
        expired = [name for name, t in thaws.items() if t.lease_expired]
        if expired:
            raise BackupFailed(
                f"the freeze lease ran out on {', '.join(sorted(expired))} before the snapshot"
                " finished, so those nodes were not quiesced for it; raise the lease or check the"
                " agent's clock and load"
            )


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


async def renew_leases(agents: Mapping[str, NodeAgent], operation_id: str, lease: float) -> None:
    """Keep the freeze alive while the array call runs. A failed renewal is reported by the thaw
    (lease_expired), which fails the run."""
    while True:
        await asyncio.sleep(lease / 3)
        results = await asyncio.gather(
            *(a.renew(operation_id, lease) for a in agents.values()), return_exceptions=True
        )
        for name, result in zip(agents, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("lease renewal failed", node=name, error=str(result))


async def thaw_all(agents: Mapping[str, NodeAgent], operation_id: str) -> dict[str, ThawReceipt]:
    results = await asyncio.gather(
        *(a.thaw(operation_id) for a in agents.values()), return_exceptions=True
    )
    receipts: dict[str, ThawReceipt] = {}
    for name, result in zip(agents, results, strict=True):
        if isinstance(result, BaseException):
            # The lease thaws this node by itself within one lease length.
            log.error("thaw failed; the node's lease will thaw it", node=name, error=str(result))
        else:
            receipts[name] = result
    return receipts
