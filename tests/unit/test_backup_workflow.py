"""The backup protocol's safety rules, against fakes of our own seams (agents and arrays).

The real-parts proof is in tests/integration; these pin the ordering and failure handling.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from ringsnap.coordinator.backup import (
    BackupFailed,
    BackupRefused,
    BackupSettings,
    BackupWorkflow,
)
from ringsnap.coordinator.model import QuiesceMode
from ringsnap.coordinator.ports import FreezeReceipt
from ringsnap.plugins.errors import DriverError
from tests.support.fakes import FakeAgent, FakeArray, ScriptedDriver, node_targets, volumes_of


def cluster(
    n: int = 3, **agent_kwargs: bool
) -> tuple[BackupWorkflow, list[FakeAgent], FakeArray, list[str]]:
    events: list[str] = []
    agents = [FakeAgent(f"n{i}", events) for i in range(1, n + 1)]
    array = FakeArray("a1", volumes_of(a.node for a in agents), events=events, agents=agents)
    return BackupWorkflow("c", node_targets(agents), {"a1": array}, None), agents, array, events


def test_protocol_order_and_one_snapshot_per_array() -> None:
    workflow, agents, array, events = cluster()
    run = asyncio.run(workflow.run(BackupSettings(), trigger="test"))
    kinds = [e.split()[0] for e in events]
    assert kinds == ["flush"] * 3 + ["freeze"] * 3 + ["snapshot"] + ["thaw"] * 3
    assert array.frozen_during_snapshot == [True]
    assert len(run.snapshots) == 1 and len(run.snapshots[0].members) == 6
    assert run.window is not None and run.window.total >= run.window.array_call
    assert not any(a.frozen for a in agents)


def test_array_overrunning_the_budget_thaws_in_time_and_cleans_up_the_late_snapshot() -> None:
    workflow, agents, array, events = cluster()
    array.delay = 0.6
    settings = BackupSettings(freeze_budget=0.2, lease=0.5, straggler_grace=5)
    with pytest.raises(BackupFailed, match="still running after the freeze budget"):
        asyncio.run(workflow.run(settings, trigger="test"))
    assert not any(a.frozen for a in agents)
    # Thawed before the array answered; the late snapshot was deleted after it arrived.
    deletes = [i for i, e in enumerate(events) if e.startswith("delete ")]
    assert deletes and events.index("thaw n1") < deletes[0]
    assert array.snapshots == {}


def test_array_error_fails_the_run_and_thaws() -> None:
    workflow, agents, array, _ = cluster()
    array.error = DriverError("HTTP 500: internal error", array="a1")
    with pytest.raises(BackupFailed, match="HTTP 500"):
        asyncio.run(workflow.run(BackupSettings(), trigger="test"))
    assert not any(a.frozen for a in agents)


def test_lease_expiry_during_snapshot_fails_the_run_and_deletes_the_snapshot() -> None:
    workflow, _agents, array, _ = cluster()
    array.delay = 0.3

    async def no_renewal(*_: object) -> None:
        await asyncio.sleep(3600)

    workflow._renew = no_renewal  # type: ignore[method-assign,assignment]
    with pytest.raises(BackupFailed, match="lease ran out"):
        asyncio.run(workflow.run(BackupSettings(lease=0.1, freeze_budget=1.0), trigger="test"))
    assert array.snapshots == {}


def test_renewal_keeps_nodes_frozen_through_a_long_snapshot() -> None:
    workflow, _agents, array, _ = cluster()
    array.delay = 0.5
    run = asyncio.run(workflow.run(BackupSettings(lease=0.15, freeze_budget=2.0), trigger="test"))
    assert array.frozen_during_snapshot == [True]
    assert run.snapshots


def test_a_failed_freeze_thaws_the_nodes_that_did_freeze() -> None:
    workflow, agents, _array, events = cluster()
    agents[1].fail_freeze = True
    with pytest.raises(BackupFailed, match="node n2: freeze failed"):
        asyncio.run(workflow.run(BackupSettings(), trigger="test"))
    assert not any(a.frozen for a in agents)
    assert "snapshot a1" not in events


def test_a_freeze_slower_than_the_budget_fails_the_run_and_thaws_the_others_in_time() -> None:
    workflow, agents, _array, events = cluster()
    slow = agents[2]
    original = slow.freeze

    async def late_freeze(operation_id: str, lease_seconds: float) -> FreezeReceipt:
        await asyncio.sleep(5)
        return await original(operation_id, lease_seconds)

    slow.freeze = late_freeze  # type: ignore[method-assign]
    started = time.monotonic()
    with pytest.raises(
        BackupFailed, match=r"node n3: freeze failed: freeze budget: no answer within 0\.5 s"
    ):
        asyncio.run(workflow.run(BackupSettings(freeze_budget=0.5), trigger="test"))
    assert time.monotonic() - started < 2.0
    assert not any(a.frozen for a in agents)
    assert "snapshot a1" not in events


def test_unreachable_agent_refuses_unless_partial_is_allowed() -> None:
    workflow, agents, _array, events = cluster()
    agents[2].unreachable = True
    with pytest.raises(BackupRefused, match=r"node n3: agent unreachable.*allow a partial") as no:
        asyncio.run(workflow.run(BackupSettings(), trigger="test"))
    assert events == []
    assert "allow_partial = true" in str(no.value) and "[[clusters]]" in str(no.value)
    assert "--allow-partial" not in str(no.value), "no command has that option"
    run = asyncio.run(workflow.run(BackupSettings(allow_partial=True), trigger="test"))
    assert run.included == ["n1", "n2"]
    assert "refused connection" in run.nodes["n3"].excluded_reason
    assert len(run.snapshots[0].members) == 4


def test_agents_of_another_cluster_or_the_same_node_twice_refuse_before_any_freeze() -> None:
    workflow, agents, array, events = cluster()
    agents[1].cluster_name = "other"
    with pytest.raises(
        BackupRefused, match=r"more than one Cassandra cluster \(n1, n3 in 'c'; n2 in 'other'\)"
    ):
        asyncio.run(workflow.run(BackupSettings(allow_partial=True), trigger="test"))
    agents[1].cluster_name = "c"
    agents[2].host_id = agents[0].host_id
    with pytest.raises(BackupRefused, match=r"nodes n1, n3 reach the same Cassandra node"):
        asyncio.run(workflow.run(BackupSettings(), trigger="test"))
    assert events == [] and array.snapshots == {}


def test_cancelled_run_still_thaws() -> None:
    workflow, agents, array, _ = cluster()
    array.delay = 5

    async def cancel_mid_snapshot() -> None:
        task = asyncio.create_task(
            workflow.run(BackupSettings(freeze_budget=10, lease=1), trigger="t")
        )
        while not array.events or array.events[-1] != "snapshot a1":
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_mid_snapshot())
    assert not any(a.frozen for a in agents)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [(QuiesceMode.FLUSH_ONLY, ["flush", "snapshot"]), (QuiesceMode.NONE, ["snapshot"])],
)
def test_quiesce_modes(mode: QuiesceMode, expected: list[str]) -> None:
    workflow, _, _, events = cluster()
    asyncio.run(workflow.run(BackupSettings(quiesce=mode), trigger="test"))
    assert sorted({e.split()[0] for e in events}) == sorted(expected)


def test_driver_retries_stop_at_the_freeze_budget_and_report_the_arrays_error() -> None:
    """A retrying driver under the budget: the run fails with the array's message, in time."""
    from ringsnap.plugins.middleware import AsyncDriver, RetryPolicy, wrap

    failing = ScriptedDriver(
        [
            DriverError("HTTP 500: controller failure", array="a1", retryable=True)
            for _ in range(10)
        ],
        volumes=volumes_of(f"n{i}" for i in (1, 2, 3)),
    )
    workflow, agents, _array, _events = cluster()
    policy = RetryPolicy(attempts=10, initial_delay=0.2, jitter=0)
    workflow.arrays["a1"] = AsyncDriver(wrap(failing, retry=policy))
    with pytest.raises(BackupFailed, match="controller failure"):
        asyncio.run(workflow.run(BackupSettings(freeze_budget=0.5, lease=0.3), trigger="t"))
    assert 1 < failing.calls < 10
    assert not any(a.frozen for a in agents)
