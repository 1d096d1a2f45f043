"""The daemon's retry of the resource ledger, through the real coordinator and catalog: a clone an
export recorded (before making it, then named, with the node and purpose it is mounted under) and
left behind when its process died is unmounted on that node before the array deletes it; an
unmount not confirmed keeps it; a held cluster is left alone. The node's agent and the array are
fakes recording the order of calls."""

from __future__ import annotations

import pytest

from ringsnap.coordinator.drill.cleanups import NodeAgentCache
from ringsnap.coordinator.export.ledger import clone_resource
from ringsnap.coordinator.export.model import clone_suffix, purpose_id
from ringsnap.coordinator.ports import AgentError
from ringsnap.coordinator.runs.lease import Lease, RunKind
from ringsnap.plugins.types import Volume
from tests.unit.coordinator_api.conftest import Harness

BACKUP = "rs-20261124-030000-abcd"
PURPOSE = purpose_id(BACKUP)
SUFFIX = clone_suffix(BACKUP, "1f2e3d")
CLONE = Volume(f"n2-data_{SUFFIX}", "c-n2-data")


class NodeAgent:
    def __init__(self, events: list[str]) -> None:
        self.events = events
        self.fail: Exception | None = None

    async def unmount_clones(self, purpose: str) -> list[str]:
        self.events.append(f"n2:unmount:{purpose}")
        if self.fail is not None:
            raise self.fail
        return ["/var/lib/ringsnap/clones/x"]

    async def close(self) -> None:
        return None


def _left_by_a_killed_export(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, agent: NodeAgent, events: list[str]
) -> list[Volume]:
    entry = harness.catalog.add_resource(
        clone_resource(
            "prod",
            BACKUP,
            "a1",
            SUFFIX,
            f"clone of n2-data made to export backup {BACKUP} from node n2",
            node="n2",
            purpose=PURPOSE,
        )
    )
    harness.catalog.resource_made(entry.id, CLONE.name, CLONE.id)
    deleted: list[Volume] = []

    async def delete_clone(volume: Volume) -> None:
        events.append(f"array:delete:{volume.name}")
        deleted.append(volume)

    monkeypatch.setattr(harness.array, "delete_clone", delete_clone)
    cache: NodeAgentCache = harness.coordinator.clone_nodes
    monkeypatch.setattr(cache, "_open", lambda c, n: agent if (c, n) == ("prod", "n2") else None)
    return deleted


def test_an_export_clone_is_unmounted_on_its_node_before_the_array_deletes_it(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    agent = NodeAgent(events)
    deleted = _left_by_a_killed_export(harness, monkeypatch, agent, events)
    agent.fail = AgentError("node n2: UnmountClones: UNAVAILABLE", code="UNAVAILABLE")

    assert harness.call(harness.coordinator.run_pending_cleanups()) == 1
    assert deleted == [], "a clone was deleted while it may still be mounted"
    (kept,) = harness.catalog.resources()
    assert "node n2 did not confirm it is unmounted" in kept.last_error

    agent.fail = None
    assert harness.call(harness.coordinator.run_pending_cleanups()) == 0
    assert events == [f"n2:unmount:{PURPOSE}"] * 2 + [f"array:delete:{CLONE.name}"]
    assert deleted == [CLONE]
    assert harness.catalog.resources() == []


def test_a_clone_of_a_held_cluster_is_left_alone(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    deleted = _left_by_a_killed_export(harness, monkeypatch, NodeAgent(events), events)
    leases = harness.coordinator.leases
    with leases.hold(Lease("prod", RunKind.EXPORT, run_id=BACKUP, backup_id=BACKUP)):
        assert harness.call(harness.coordinator.run_pending_cleanups()) == 1
    assert events == [] and deleted == []
    assert harness.call(harness.coordinator.run_pending_cleanups()) == 0
    assert events == [f"n2:unmount:{PURPOSE}", f"array:delete:{CLONE.name}"]


def _gauge(harness: Harness, name: str) -> float | None:
    return harness.coordinator.metrics.registry.get_sample_value(name)


def test_a_left_over_entry_is_measured_for_its_alert_and_a_held_one_is_not(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    agent = NodeAgent(events)
    _left_by_a_killed_export(harness, monkeypatch, agent, events)
    agent.fail = AgentError("node n2: UnmountClones: UNAVAILABLE", code="UNAVAILABLE")
    (entry,) = harness.catalog.resources()

    leases = harness.coordinator.leases
    with leases.hold(Lease("prod", RunKind.EXPORT, run_id=BACKUP, backup_id=BACKUP)):
        assert harness.call(harness.coordinator.run_pending_cleanups()) == 1
    assert _gauge(harness, "ringsnap_ledger_entries") == 0, "an entry in use was counted"
    assert _gauge(harness, "ringsnap_oldest_ledger_entry_timestamp_seconds") == 0

    assert harness.call(harness.coordinator.run_pending_cleanups()) == 1
    assert _gauge(harness, "ringsnap_ledger_entries") == 1
    assert _gauge(harness, "ringsnap_oldest_ledger_entry_timestamp_seconds") == pytest.approx(
        entry.created_at.timestamp(), abs=1e-3
    )
    # The ledger is not an array snapshot cleanup: that alert keeps its own meaning.
    assert _gauge(harness, "ringsnap_pending_cleanups") == 0

    agent.fail = None
    assert harness.call(harness.coordinator.run_pending_cleanups()) == 0
    assert _gauge(harness, "ringsnap_ledger_entries") == 0
    assert _gauge(harness, "ringsnap_oldest_ledger_entry_timestamp_seconds") == 0
