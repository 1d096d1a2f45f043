"""The daemon's ledger retry of a clone a node mounted, as catalog migration 13 leaves a cleanup
row an older ringsnap wrote for an export's clone (`clone:` and JSON naming the node and purpose;
tests/unit/catalog/test_ledger_migration.py proves the row becomes this entry): one path for every
clone, unmounting on the agent that mounted it before the array deletes it. Through the real
coordinator and catalog; the node's agent and the array are fakes that record the order of calls.

- the node answers: UnmountClones there, then the deletion on the array;
- the node does not answer: the clone is kept (never deleted while it may be mounted), the
  cleanup stays with its error naming the node, and is retried;
- nothing is mounted any more (the agent knows no clone of the purpose): the deletion proceeds;
- a node the configuration no longer has: kept, saying what to do by hand;
- while the clone's cluster is held (its export or drill may still read the clone): not touched,
  retried once the cluster is free.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from ringsnap.coordinator.drill.cleanups import NodeAgentCache
from ringsnap.coordinator.export.model import purpose_id
from ringsnap.coordinator.export.session import export_node_opener
from ringsnap.coordinator.ports import AgentError
from ringsnap.coordinator.runs.lease import Lease, RunKind
from ringsnap.coordinator.runs.resources import Resource, ResourceType
from ringsnap.plugins.types import Volume
from tests.unit.coordinator_api.conftest import Harness

BACKUP = "rs-20261124-030000-abcd"
PURPOSE = purpose_id(BACKUP)
CLONE = Volume("n2_data_ex_20261124_030000_abcd_1f2e3d", "c-n2-data")


class NodeAgent:
    """A node's agent: UnmountClones records an event, or raises `fail` (once per call)."""

    def __init__(self, events: list[str], mounted: Sequence[str] = ("n2_data",)) -> None:
        self.events = events
        self.mounted = list(mounted)
        self.fail: Exception | None = None

    async def unmount_clones(self, purpose: str) -> list[str]:
        self.events.append(f"n2:unmount:{purpose}")
        if self.fail is not None:
            raise self.fail
        detached, self.mounted = self.mounted, []
        return detached

    async def close(self) -> None:
        return None


def _setup(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, agent: NodeAgent | None, events: list[str]
) -> list[Volume]:
    harness.catalog.add_resource(
        Resource(
            type=ResourceType.CLONE,
            cluster="prod",
            run_id=BACKUP,
            run_kind="export or table restore",
            reason=f"clone of n2_data made to export backup {BACKUP} from node n2",
            array="a1",
            name=CLONE.name,
            volume_id=CLONE.id,
            node="n2",
            mount_purpose=PURPOSE,
        )
    )
    deleted: list[Volume] = []

    async def delete_clone(volume: Volume) -> None:
        events.append(f"array:delete:{volume.name}")
        deleted.append(volume)

    monkeypatch.setattr(harness.array, "delete_clone", delete_clone)
    # The daemon's own cache, opening the fake instead of dialling the configured address.
    cache: NodeAgentCache = harness.coordinator.clone_nodes
    monkeypatch.setattr(cache, "_open", lambda c, n: agent if (c, n) == ("prod", "n2") else None)
    return deleted


def test_the_retry_unmounts_on_the_node_then_deletes_the_clone(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    deleted = _setup(harness, monkeypatch, NodeAgent(events), events)

    assert harness.call(harness.coordinator.run_pending_cleanups()) == 0

    assert events == [f"n2:unmount:{PURPOSE}", f"array:delete:{CLONE.name}"]
    assert deleted == [CLONE]
    assert harness.catalog.resources() == []


def test_an_unreachable_node_keeps_the_clone_and_its_cleanup_until_it_answers(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    agent = NodeAgent(events)
    agent.fail = AgentError(
        "node n2 (127.0.0.1:17002): UnmountClones: UNAVAILABLE: connection refused",
        code="UNAVAILABLE",
    )
    deleted = _setup(harness, monkeypatch, agent, events)

    assert harness.call(harness.coordinator.run_pending_cleanups()) == 1
    assert harness.call(harness.coordinator.run_pending_cleanups()) == 1

    assert deleted == [], "a clone was deleted while it may still be mounted"
    (pending,) = harness.catalog.resources()
    assert pending.attempts == 2
    assert "node n2 did not confirm it is unmounted" in pending.last_error
    assert "UNAVAILABLE" in pending.last_error and "kept" in pending.last_error

    agent.fail = None  # the node is back
    assert harness.call(harness.coordinator.run_pending_cleanups()) == 0
    assert deleted == [CLONE]
    assert events[-2:] == [f"n2:unmount:{PURPOSE}", f"array:delete:{CLONE.name}"]


@pytest.mark.parametrize("answer", ["nothing mounted", "no such purpose"])
def test_a_clone_already_unmounted_is_deleted(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, answer: str
) -> None:
    events: list[str] = []
    agent = NodeAgent(events, mounted=())
    if answer == "no such purpose":
        agent.fail = AgentError("UnmountClones: NOT_FOUND: no clones", code="NOT_FOUND")
    deleted = _setup(harness, monkeypatch, agent, events)

    assert harness.call(harness.coordinator.run_pending_cleanups()) == 0

    assert events == [f"n2:unmount:{PURPOSE}", f"array:delete:{CLONE.name}"]
    assert deleted == [CLONE]


def test_a_node_no_longer_configured_keeps_the_clone(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    deleted = _setup(harness, monkeypatch, None, events)

    assert harness.call(harness.coordinator.run_pending_cleanups()) == 1

    assert deleted == [] and events == []
    (pending,) = harness.catalog.resources()
    assert "node n2 of cluster prod mounted it" in pending.last_error
    assert "by hand" in pending.last_error


def test_a_clone_of_a_busy_cluster_is_left_alone_until_the_cluster_is_free(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    deleted = _setup(harness, monkeypatch, NodeAgent(events), events)
    leases = harness.coordinator.leases

    with leases.hold(Lease("prod", RunKind.EXPORT, run_id=BACKUP, backup_id=BACKUP)):
        assert harness.call(harness.coordinator.run_pending_cleanups()) == 1
    assert events == [] and deleted == [], "a clone of a running export was touched"
    (pending,) = harness.catalog.resources()
    assert pending.attempts == 0

    assert harness.call(harness.coordinator.run_pending_cleanups()) == 0
    assert events == [f"n2:unmount:{PURPOSE}", f"array:delete:{CLONE.name}"]


def test_the_daemon_opens_the_configured_agent_of_the_node(harness: Harness) -> None:
    opener = export_node_opener(harness.config)

    async def open_them() -> None:
        # In the daemon's event loop, as the daemon opens them (a gRPC aio channel needs one).
        agent = opener("prod", "n2")
        assert agent is not None and agent.address == "127.0.0.1:17002"
        assert opener("prod", "e1") is None and opener("gone", "n2") is None
        await agent.close()

    harness.call(open_them())
