"""The restore workflow's branch for backups of native snapshots, with the fakes of
test_restore_workflow: the order (no release, array or attach: each agent restores its own
snapshot), a record after every node's step, resume from each node's last step, the plan's
refusals. The proof on the real ring is tests/integration/test_restore_native.py."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ringsnap.config import validate
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.model import (
    Backup,
    BackupNode,
    NodeVerdict,
    RestoreMode,
    RestoreState,
    RestoreStep,
    SnapshotKind,
    Verification,
)
from ringsnap.coordinator.ports import RestoredTable, SSTable
from ringsnap.coordinator.restore.plan import RestoreRequest
from ringsnap.coordinator.restore.session import RestoreSession
from ringsnap.coordinator.restore.workflow import RestoreFailed, RestoreRefused, RestoreSettings
from tests.support.coordinator_config import unread_tls
from tests.support.restore_world import (
    NODES,
    Events,
    FakeAgent,
    Rig,
    first_index,
    last_index,
    restore_backup,
    restore_sstable,
)


class NativeAgent(FakeAgent):
    """A node whose agent holds native snapshots (by tag) and restores them."""

    def __init__(self, name: str, events: Events) -> None:
        super().__init__(name, events)
        self.tags = {"rs-1"}

    async def manifest(self, snapshot_tag: str = "") -> list[SSTable]:
        if snapshot_tag:
            self._call(f"manifest:{snapshot_tag}")
            return [restore_sstable("1")] if snapshot_tag in self.tags else []
        return await super().manifest()

    async def restore_snapshot(self, operation_id: str, tag: str) -> tuple[RestoredTable, ...]:
        self._call("restore_snapshot")
        return (
            RestoredTable(
                "/data", "ks", "t-abc", True, 3, 2, "/data/ks/t-abc/.ringsnap-replaced/x"
            ),
            RestoredTable("/data", "ks", "late-def", False, 0, 0, ""),
        )


def native_backup(backup_id: str = "rs-1") -> Backup:
    array = restore_backup(backup_id=backup_id)
    return replace(
        array,
        snapshot_kind=SnapshotKind.NATIVE,
        snapshots=(),
        nodes=tuple(replace(n, volumes=()) for n in array.nodes),
    )


class NativeRig(Rig):
    def __init__(self) -> None:
        super().__init__()
        self.agents = {n: NativeAgent(n, self.events) for n in NODES}

    def plan(self, request: RestoreRequest, backup: Backup | None = None, **kwargs: Any) -> Any:
        return super().plan(request, backup or native_backup(), **kwargs)


def test_each_node_restores_its_own_snapshot_between_the_stop_and_the_discard() -> None:
    rig = NativeRig()
    plan = rig.plan(RestoreRequest("rs-1"))
    assert not plan.refused, plan.refusals
    assert plan.arrays == () and all(n.volumes == () for n in plan.nodes)
    assert ".ringsnap-replaced/<restore id>/" in plan.destroyed[0]

    record = asyncio.run(rig.workflow().run(plan, "me"))

    events = rig.events
    assert last_index(events, ":stop") < first_index(events, ":restore_snapshot")
    assert last_index(events, ":restore_snapshot") < first_index(events, ":discard:hints=True")
    assert last_index(events, ":discard:hints=True") < first_index(events, ":manifest")
    assert events.index("node2:start:gossip") < events.index("node1:start")
    assert "node1:discard:hints=True" in events
    assert not any(("release" in e or "attach" in e or e.startswith("array:")) for e in events)
    assert record.state is RestoreState.PROVEN
    assert all(n.verdict is NodeVerdict.PROVEN for n in record.nodes)
    assert rig.journal.verified == [("rs-1", Verification.PROVEN, "rr-1")]
    steps = {(n.name, n.step) for r in rig.journal.saved for n in r.nodes}
    skipped = {
        RestoreStep.PLANNED,
        RestoreStep.DOWNLOADED,
        RestoreStep.RELEASED,
        RestoreStep.ATTACHED,
    }
    assert {(n, s) for n in NODES for s in RestoreStep if s not in skipped} <= steps
    assert not any(s in (RestoreStep.RELEASED, RestoreStep.ATTACHED) for _, s in steps)


def test_a_node_restored_alone_keeps_its_hints_and_is_told_to_repair() -> None:
    rig = NativeRig()
    plan = rig.plan(RestoreRequest("rs-1", ("node1",)))
    assert not plan.refused and not plan.whole_ring
    record = asyncio.run(rig.workflow().run(plan, "me"))
    assert record.state is RestoreState.PROVEN
    assert "node1:discard:hints=False" in rig.events
    assert not any(e.startswith(("node2:", "node3:")) for e in rig.events)


def test_the_plan_refuses_a_clone_and_a_node_without_the_snapshot_naming_it() -> None:
    rig = NativeRig()
    rig.agents["node3"].tags = set()
    plan = rig.plan(RestoreRequest("rs-1", mode=RestoreMode.CLONE))
    assert any("--mode clone needs array snapshots" in r for r in plan.refusals), plan.refusals
    assert any(r.startswith("node node3 holds no native snapshot rs-1") for r in plan.refusals)
    assert not any("node1" in r or "node2" in r for r in plan.refusals)
    with pytest.raises(RestoreRefused):
        asyncio.run(rig.workflow().run(plan, "me"))
    assert not any(e.endswith((":stop", ":restore_snapshot")) for e in rig.events)


def test_a_failed_snapshot_restore_says_so_and_resume_restores_only_what_is_left() -> None:
    rig = NativeRig()
    rig.agents["node3"].fail["restore_snapshot"] = OSError("No space left on device")
    with pytest.raises(RestoreFailed, match="node node3: restored: No space left"):
        asyncio.run(rig.workflow().run(rig.plan(RestoreRequest("rs-1")), "me"))
    last = rig.journal.saved[-1]
    assert last.state is RestoreState.FAILED
    assert last.node("node1").step is RestoreStep.RESTORED
    assert "commit log still holds newer writes" in last.node("node1").next_step
    assert last.node("node3").step is RestoreStep.STOPPED
    assert "may have begun" in last.node("node3").next_step
    assert "--resume rr-1" in last.node("node3").next_step
    assert not any(e.endswith(":discard:hints=True") or ":start" in e for e in rig.events)

    rig.agents["node3"].fail.clear()
    rig.events.clear()
    final = asyncio.run(rig.workflow().resume(last, {}, native=True))

    assert final.state is RestoreState.PROVEN
    assert [e for e in rig.events if e.endswith(":restore_snapshot")] == ["node3:restore_snapshot"]
    assert not any(e.endswith(":stop") for e in rig.events)


# -- resumed through the session, which reads the backup's kind from the catalog -----------------


def test_the_session_resumes_a_native_restore_as_one(tmp_path: Path) -> None:
    config = validate(
        {
            "coordinator": {"catalog": str(tmp_path / "catalog.db"), "metrics_listen": ""},
            "tls": unread_tls(tmp_path),
            "clusters": [
                {
                    "name": "c",
                    "contact_points": ["127.0.0.1"],
                    "snapshots": "native",
                    "seeds": ["node2"],
                    "nodes": [
                        {"name": n, "agent": f"127.0.0.1:{17201 + i}"} for i, n in enumerate(NODES)
                    ],
                }
            ],
        },
        CoordinatorConfig,
        source="<test>",
    )
    rig = NativeRig()
    rig.agents["node1"].fail["restore_snapshot"] = OSError("interrupted")
    with Catalog(config.coordinator.catalog) as catalog:
        _record_native_backup(catalog)
        session = RestoreSession(
            config,
            catalog,
            config.cluster("c"),
            rig.agents,
            {},
            rig.ring,  # type: ignore[arg-type]
            RestoreSettings(),
        )
        plan = asyncio.run(session.plan(RestoreRequest("rs-1")))
        with pytest.raises(RestoreFailed):
            asyncio.run(session.run(plan, "me"))
        rig.agents["node1"].fail.clear()
        rig.events.clear()

        final = asyncio.run(session.resume(plan.restore_id))

        assert final.state is RestoreState.PROVEN
        assert "node1:restore_snapshot" in rig.events
        assert not any("release" in e or "attach" in e for e in rig.events)
        assert catalog.get_backup("rs-1").verification is Verification.PROVEN


def _record_native_backup(catalog: Catalog) -> None:
    backup = native_backup()
    catalog.begin_backup(
        backup_id=backup.id,
        cluster="c",
        quiesce_mode=backup.quiesce_mode,
        trigger="test",
        started_at=backup.started_at,
        nodes=[
            BackupNode(name=n.name, host_id=n.host_id, canary_id=n.canary_id) for n in backup.nodes
        ],
        snapshot_kind=SnapshotKind.NATIVE,
    )
    for node in backup.nodes:
        catalog.record_manifest(backup.id, node.name, [restore_sstable("1")])
    catalog.complete_backup(backup.id)
