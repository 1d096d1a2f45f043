"""A node whose freeze never answers: the barrier fails naming that node's freeze, thaws every
node, starts no work, and never reads a lease time for it (there is none: its lease was never
confirmed), even when its thaw says a lease ran out."""

from __future__ import annotations

import asyncio

import pytest

from ringsnap.coordinator.backup import BackupFailed
from ringsnap.coordinator.backup.freeze import FreezeBarrier, renew_leases
from ringsnap.coordinator.ports import FreezeReceipt, ThawReceipt
from tests.support.fakes import FakeAgent


class _NeverAnswers(FakeAgent):
    """Its freeze is sent and never answered; its thaw says its lease ran out (the freeze landed
    after the coordinator gave up on it, and its lease thawed it)."""

    async def freeze(self, operation_id: str, lease_seconds: float) -> FreezeReceipt:
        self.events.append(f"freeze-sent {self.node}")
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def thaw(self, operation_id: str) -> ThawReceipt:
        self.events.append(f"thaw {self.node}")
        return ThawReceipt((), 0.0, 0.0, lease_expired=True)


def test_a_node_that_never_answered_its_freeze_fails_the_run_naming_it() -> None:
    events: list[str] = []
    answers = FakeAgent("n1", events)
    barrier = FreezeBarrier(
        {"n1": answers, "n2": _NeverAnswers("n2", events)},
        "rs-test",
        budget=0.3,
        lease=0.5,
        renew=renew_leases,
    )
    worked: list[float] = []

    async def work(left: float) -> None:
        worked.append(left)

    with pytest.raises(BackupFailed) as failed:
        asyncio.run(barrier.hold(work, on_frozen=lambda: None))
    assert str(failed.value) == "node n2: freeze failed: freeze budget: no answer within 0.3 s"
    assert worked == [], "work started without every node frozen"
    assert {"thaw n1", "thaw n2"} <= set(events) and not answers.frozen
    assert barrier.window is not None and barrier.window.freezing is None
