"""Native backups (clusters with `snapshots = "native"`): the workflow's order, the catalog entry the
service records, and the clearing of the nodes' snapshots when a run fails, when the backup is
deleted and when a coordinator died mid-run; on the real coordinator and catalog, fake agents."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar, cast

import pytest

from ringsnap.config import validate
from ringsnap.coordinator.backup import BackupFailed, BackupSettings, BackupWorkflow, NodeTarget
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.metrics import CoordinatorMetrics
from ringsnap.coordinator.model import BackupNode, BackupState, QuiesceMode, SnapshotKind
from ringsnap.coordinator.ports import AgentPort
from ringsnap.coordinator.runs.resources import ResourceType
from ringsnap.coordinator.scheduler import BackupRequest
from ringsnap.coordinator.service import ClusterRuntime, Coordinator
from tests.support.coordinator_config import unread_tls
from tests.support.fakes import FakeAgent
from tests.support.manifests import one_sstable

T = TypeVar("T")
NODES = ("n1", "n2", "n3")
#: A native snapshot's manifest: its file in the snapshot's directory.
MANIFEST = one_sstable("ks/t-1/snapshots/x/nb-1-big-Data.db")


def native_settings(**kwargs: Any) -> BackupSettings:
    return BackupSettings(snapshots=SnapshotKind.NATIVE, **kwargs)


def test_flush_then_a_snapshot_on_every_node_then_its_manifest_no_freeze() -> None:
    events: list[str] = []
    agents = [FakeAgent(n, events, manifest=MANIFEST) for n in NODES]
    workflow = BackupWorkflow("c", [_target(a) for a in agents], {}, None)

    run = asyncio.run(workflow.run(native_settings(), trigger="test"))

    assert [e.split()[0] for e in events] == ["flush"] * 3 + ["native-snapshot"] * 3
    assert all(a.native_snapshots == {run.backup_id} for a in agents)
    assert not any(a.frozen for a in agents)
    assert run.snapshots == [] and run.native_snapshots == list(NODES)
    assert all(run.nodes[n].manifest == MANIFEST for n in NODES)
    assert list(run.clock.phases) == ["plan", "canary", "schema", "flush", "snapshot", "record"]


def test_a_snapshot_that_holds_nothing_fails_the_run() -> None:
    agents = [FakeAgent(n, manifest=()) for n in NODES]
    workflow = BackupWorkflow("c", [_target(a) for a in agents], {}, None)
    with pytest.raises(BackupFailed, match=r"node n1: its snapshot rs-.* holds no SSTable"):
        asyncio.run(workflow.run(native_settings(), trigger="test"))


def _target(agent: FakeAgent) -> NodeTarget:
    return NodeTarget(agent.node, agent, ())


# -- through the coordinator ---------------------------------------------------------------------


def config_data(tmp: Path) -> dict[str, Any]:
    return {
        "coordinator": {
            "listen": "127.0.0.1:0",
            "catalog": str(tmp / "catalog.db"),
            "metrics_listen": "",
        },
        "tls": unread_tls(tmp),
        "clusters": [
            {
                "name": "das",
                "contact_points": ["127.0.0.1"],
                "snapshots": "native",
                "nodes": [
                    {"name": n, "agent": f"127.0.0.1:{17101 + i}"} for i, n in enumerate(NODES)
                ],
            }
        ],
    }


class Rig:
    def __init__(self, tmp: Path) -> None:
        self.config = validate(config_data(tmp), CoordinatorConfig, source="<test>")
        self.agents = {n: FakeAgent(n, leases=False, manifest=MANIFEST) for n in NODES}
        self.catalog = Catalog(self.config.coordinator.catalog)
        section = self.config.cluster("das")
        runtime = ClusterRuntime(
            section, {n: cast(AgentPort, agent) for n, agent in self.agents.items()}, None
        )
        self.coordinator = Coordinator(
            self.config, self.catalog, CoordinatorMetrics(["das"]), {}, {"das": runtime}
        )

    def events(self) -> list[str]:
        return [e for agent in self.agents.values() for e in agent.events]


def run_in(rig_factory: Callable[[], Rig], work: Callable[[Rig], Coroutine[Any, Any, T]]) -> T:
    async def main() -> T:
        rig = rig_factory()
        await rig.coordinator.start()
        try:
            return await work(rig)
        finally:
            await rig.coordinator.stop()
            rig.catalog.close()

    return asyncio.run(main())


@pytest.fixture
def rig(tmp_path: Path) -> Callable[[], Rig]:
    return lambda: Rig(tmp_path)


async def _backup(rig: Rig) -> Any:
    return await rig.coordinator.backup(BackupRequest("das", trigger="test"))


def test_a_native_backup_is_recorded_complete_and_its_deletion_clears_every_node(
    rig: Callable[[], Rig],
) -> None:
    async def work(r: Rig) -> None:
        backup = await _backup(r)
        assert backup.state is BackupState.COMPLETE
        assert backup.snapshot_kind is SnapshotKind.NATIVE
        assert backup.quiesce_mode is QuiesceMode.FLUSH_ONLY  # never frozen, whatever the config
        assert backup.snapshots == () and all(not n.volumes for n in backup.nodes)
        assert r.catalog.load_manifest(backup.id, "n2") == list(MANIFEST)
        assert all(a.native_snapshots == {backup.id} for a in r.agents.values())

        await r.coordinator.delete_backup(backup.id, "test")

        assert all(a.native_snapshots == set() for a in r.agents.values())
        assert r.catalog.pending_cleanups() == []

    run_in(rig, work)


def test_a_failed_native_backup_clears_the_tag_wherever_it_was_asked_for(
    rig: Callable[[], Rig],
) -> None:
    async def work(r: Rig) -> None:
        r.agents["n3"].fail_snapshot = RuntimeError("nodetool snapshot: exit 2")
        r.agents["n1"].fail_clear = RuntimeError("connection refused")
        with pytest.raises(BackupFailed, match="node n3: snapshot failed: nodetool snapshot"):
            await _backup(r)
        (failed,) = r.catalog.backup_summaries("das")
        assert failed.state is BackupState.FAILED
        assert r.agents["n2"].native_snapshots == set()
        assert "clear-snapshot n3" in r.agents["n3"].events
        # n1 did not answer: its clearing stays in the ledger, and is retried.
        assert r.catalog.pending_cleanups() == []
        (left,) = r.catalog.resources()
        assert (left.resource.type, left.resource.cluster, left.resource.node) == (
            ResourceType.NATIVE_TAG,
            "das",
            "n1",
        )
        assert (left.resource.name, left.resource.run_id) == (failed.id, failed.id)
        r.agents["n1"].fail_clear = None
        assert await r.coordinator.run_pending_cleanups() == 0
        assert r.agents["n1"].native_snapshots == set(), r.agents["n1"].events

    run_in(rig, work)


def test_a_native_backup_left_running_by_a_dead_coordinator_is_cleared_on_every_node(
    rig: Callable[[], Rig],
) -> None:
    async def main() -> None:
        dead = rig()
        dead.catalog.begin_backup(
            backup_id="rs-dead",
            cluster="das",
            quiesce_mode=QuiesceMode.FREEZE,
            trigger="test",
            nodes=[BackupNode(name=n) for n in NODES],
            snapshot_kind=SnapshotKind.NATIVE,
        )
        dead.catalog.close()  # the coordinator died: nothing else ran
        again = rig()
        for agent in again.agents.values():
            agent.native_snapshots.add("rs-dead")
        await again.coordinator.start()  # recovers: fails the run, clears the nodes
        try:
            assert again.catalog.get_backup("rs-dead").state is BackupState.FAILED
            assert all(a.native_snapshots == set() for a in again.agents.values())
            assert again.catalog.pending_cleanups() == []
            assert again.catalog.resources() == []
        finally:
            await again.coordinator.stop()
            again.catalog.close()

    asyncio.run(main())
