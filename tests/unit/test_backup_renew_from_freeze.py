"""Each node's lease is renewed from its own freeze's answer, and counted from its own request's
sending: a slow node (or a long fan-out over many nodes) no longer holds up the others' renewals
until every node answered, which failed every run whose freeze phase outlasted a lease."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from datetime import datetime

import pytest

from ringsnap.coordinator.backup import BackupFailed, BackupSettings
from ringsnap.coordinator.backup.freeze import FreezeBarrier, renew_leases
from ringsnap.coordinator.ports import AgentError, AgentPort, FreezeReceipt
from tests.support.fakes import FakeAgent
from tests.unit.test_backup_lost_node import cluster


class _TimedAgent(FakeAgent):
    """Remembers when each freeze and renewal reached it, and can block the event loop (the CPU a
    client spends on a call) before its freeze is on its way."""

    def __init__(self, node: str, events: list[str], *, block: float = 0.0) -> None:
        super().__init__(node, events)
        self.block = block
        self.freeze_entered = 0.0
        self.renewed_at: list[float] = []

    async def freeze(self, operation_id: str, lease_seconds: float) -> FreezeReceipt:
        self.freeze_entered = time.monotonic()
        time.sleep(self.block)
        return await super().freeze(operation_id, lease_seconds)

    async def renew(self, operation_id: str, lease_seconds: float) -> datetime:
        self.renewed_at.append(time.monotonic())
        return await super().renew(operation_id, lease_seconds)


def test_a_node_is_renewed_while_a_slower_node_still_freezes() -> None:
    workflow, agents, array, events = cluster()
    fast = _TimedAgent("n1", events)
    workflow.nodes[0] = type(workflow.nodes[0])("n1", fast, workflow.nodes[0].volumes)
    array.agents = [fast, *agents[1:]]
    slow = agents[1]
    slow.freeze_seconds = 0.45  # answers within its lease, after the fast node's first renewal
    settings = BackupSettings(lease=0.6, freeze_budget=1.5)

    run = asyncio.run(workflow.run(settings, trigger="test"))

    assert run.snapshots and array.frozen_during_snapshot == [True]
    assert run.window is not None and run.window.freezing is not None
    frozen_at = fast.freeze_entered + run.window.freezing
    # Renewed a third of a lease after its own freeze, not once the slow node had answered.
    assert fast.renewed_at and fast.renewed_at[0] < frozen_at - 0.1, (fast.renewed_at, frozen_at)
    assert not any(e.startswith("lease-thaw") for e in events)


def test_each_nodes_lease_counts_from_its_own_request() -> None:
    """The first node's call blocks the loop (as 1,000 stub calls do) before the second is sent;
    the second's lease is counted from its own sending, never from before it (unsafe) nor from
    the first node's (too short)."""
    events: list[str] = []
    first = _TimedAgent("n1", events, block=0.2)
    second = _TimedAgent("n2", events)
    seen: dict[str, float] = {}

    async def renew_and_note(
        agents: Mapping[str, AgentPort],
        operation_id: str,
        lease: float,
        held_until: dict[str, float],
        frozen: Mapping[str, asyncio.Event],
    ) -> None:
        await asyncio.gather(*(event.wait() for event in frozen.values()))
        seen.update(held_until)
        await renew_leases(agents, operation_id, lease, held_until, frozen)

    barrier = FreezeBarrier(
        {"n1": first, "n2": second},
        "rs-test",
        budget=1.5,
        lease=0.5,
        renew=renew_and_note,
    )

    async def hold() -> None:
        await barrier.hold(lambda _left: asyncio.sleep(0.01), on_frozen=lambda: None)

    asyncio.run(hold())
    for agent in (first, second):
        assert seen[agent.node] <= agent.freeze_entered + 0.5  # never past what the agent holds
    assert seen["n2"] - seen["n1"] >= 0.19, seen


def test_a_node_lost_while_others_still_freeze_fails_the_run_and_thaws_at_once() -> None:
    workflow, agents, array, _ = cluster()

    async def refused(operation_id: str, lease_seconds: float) -> datetime:
        raise AgentError("node n1 (x): RenewLease: NOT_FOUND: no such freeze", code="NOT_FOUND")

    agents[0].renew = refused  # type: ignore[method-assign]
    agents[2].freeze_seconds = 3.0  # still freezing when n1's first renewal is refused
    started = time.monotonic()
    with pytest.raises(BackupFailed, match="node n1: its freeze has ended"):
        asyncio.run(workflow.run(BackupSettings(lease=0.6, freeze_budget=4.0), trigger="test"))
    # Failed at n1's first renewal (a third of a lease), not when n3's freeze answered.
    assert time.monotonic() - started < agents[2].freeze_seconds
    assert array.frozen_during_snapshot == []  # no snapshot call was made
    assert not agents[0].frozen and not agents[1].frozen
    assert array.snapshots == {}


def test_the_thaw_does_not_wait_for_the_renewer_to_wind_down() -> None:
    """Stopping the renewer ends a task per node (1,000 at scale): the thaw goes out meanwhile."""
    workflow, agents, array, events = cluster()

    async def slow_to_stop(*_: object) -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await asyncio.sleep(0.3)
            events.append("renewer-stopped")
            raise

    workflow._renew = slow_to_stop  # type: ignore[method-assign,assignment]
    run = asyncio.run(workflow.run(BackupSettings(lease=0.6, freeze_budget=1.5), trigger="test"))

    assert run.snapshots and array.frozen_during_snapshot == [True]
    stopped = events.index("renewer-stopped")
    assert all(events.index(f"thaw {a.node}") < stopped for a in agents), events


def test_a_run_cancelled_while_freezing_gives_up_the_freezes_still_on_their_way() -> None:
    workflow, agents, _array, events = cluster()
    agents[2].freeze_seconds = 1.0

    async def cancel_while_freezing() -> None:
        run = asyncio.ensure_future(workflow.run(BackupSettings(lease=0.6), trigger="test"))
        while "freeze n1" not in events:
            await asyncio.sleep(0.005)
        run.cancel()
        await asyncio.wait([run])
        assert run.cancelled()
        # Past when n3's freeze would have landed: it was given up, not left running.
        await asyncio.sleep(agents[2].freeze_seconds + 0.2)

    asyncio.run(cancel_while_freezing())
    assert "freeze n3" not in events, events
    assert not any(a.frozen for a in agents)
    assert {f"thaw {a.node}" for a in agents} <= set(events)


def test_a_freeze_that_answers_past_its_lease_fails_the_run_before_any_snapshot() -> None:
    workflow, agents, array, _ = cluster()
    agents[2].freeze_seconds = 0.7
    with pytest.raises(BackupFailed) as failed:
        asyncio.run(workflow.run(BackupSettings(lease=0.5, freeze_budget=1.5), trigger="test"))
    said = str(failed.value)
    # Said by the renewer, or by the check before the snapshot (whichever runs first).
    assert said.startswith(
        ("node n3: no lease renewal confirmed", "node n3: no freeze or lease renewal confirmed")
    ), said
    assert array.frozen_during_snapshot == []  # no snapshot was started


def test_the_renewer_names_a_freeze_confirmed_past_its_lease() -> None:
    async def scenario() -> None:
        lease = 0.5
        agent = FakeAgent("n1")
        frozen = {"n1": asyncio.Event()}
        frozen["n1"].set()
        # Sent 0.7 s ago, confirmed only now.
        held_until = {"n1": time.monotonic() - 0.7 + lease}
        await renew_leases({"n1": agent}, "rs-test", lease, held_until, frozen)

    with pytest.raises(BackupFailed) as failed:
        asyncio.run(scenario())
    said = str(failed.value)
    assert said.startswith("node n1: no lease renewal confirmed for 0.7"), said
    assert "last error: its freeze answered 0.7" in said
