"""A table restore's clones are in the real catalog's resource ledger from before the array makes
them: a coordinator killed mid-restore leaves nothing that only the restore's record knows. The
daemon's retry unmounts each clone on the node that mounted it (under the restore's id) before the
array deletes it, and leaves them alone while the restore holds the cluster."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ringsnap.coordinator.runs.lease import Lease, RunKind
from ringsnap.coordinator.table_restore.session import CatalogTableJournal
from ringsnap.plugins.types import Volume
from tests.support.table_restore_world import World
from tests.unit.coordinator_api.conftest import ARRAY, Harness


class NodeAgent:
    def __init__(self, name: str, events: list[str]) -> None:
        self.name = name
        self.events = events

    async def unmount_clones(self, purpose: str) -> list[str]:
        self.events.append(f"{self.name}:unmount:{purpose}")
        return ["/data"]

    async def close(self) -> None:
        return None


def test_a_table_restores_clones_are_retried_like_every_clone(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = replace(World().plan().record, cluster="prod", id="tr-20261124-083600-3fa9")
    clones = [
        replace(c, array=ARRAY, clone=f"{c.volume}_tr_20261124_083600_3fa9", clone_id=f"c-{c.node}")
        for c in record.clones
    ]
    journal = CatalogTableJournal(harness.catalog)

    # In the ledger before the array is asked (by the suffix), then named once made.
    ids = harness.call(journal.clones_planned(record, clones, "tr_20261124_083600_3fa9"))
    assert all(not e.resource.made for e in harness.catalog.resources())
    for entry_id, clone in zip(ids, clones, strict=True):
        harness.call(journal.clone_made(entry_id, clone))

    pending = {e.id: e.resource for e in harness.catalog.resources()}
    assert sorted(pending) == sorted(ids) and len(ids) == len(clones) == 3
    for cleanup_id, clone in zip(ids, clones, strict=True):
        entry = pending[cleanup_id]
        assert (entry.cluster, entry.node, entry.mount_purpose, entry.name, entry.volume_id) == (
            "prod",
            clone.node,
            record.id,
            clone.clone,
            clone.clone_id,
        )
        assert record.id in entry.reason
        assert harness.call(journal.cleanup_pending(cleanup_id))

    events: list[str] = []

    async def delete_clone(volume: Volume) -> None:
        events.append(f"array:delete:{volume.name}")

    monkeypatch.setattr(harness.array, "delete_clone", delete_clone)
    agents = {n: NodeAgent(n, events) for n in ("node1", "node2", "node3")}
    monkeypatch.setattr(
        harness.coordinator.clone_nodes, "_open", lambda c, n: agents[n] if c == "prod" else None
    )

    # While the restore holds the cluster, its clones are its own.
    lease = Lease("prod", RunKind.TABLE_RESTORE, run_id=record.id, backup_id=record.backup_id)
    with harness.coordinator.leases.hold(lease):
        assert harness.call(harness.coordinator.run_pending_cleanups()) == 3
    assert events == []

    # A coordinator killed mid-restore: the daemon unmounts each on its node, then deletes it.
    assert harness.call(harness.coordinator.run_pending_cleanups()) == 0
    for clone in clones:
        unmount = events.index(f"{clone.node}:unmount:{record.id}")
        assert unmount < events.index(f"array:delete:{clone.clone}")
    assert harness.catalog.resources() == []
    assert not harness.call(journal.cleanup_pending(ids[0]))
