"""The restore workflow's S3 source (`ringsnap restore BACKUP --from s3`), with the fakes of
test_restore_workflow: every node downloads and verifies before anything is stopped, the array is
never asked, the install replaces release/revert/attach, the commit log follows the discard; a
download failing on one node stops nothing; an install failing on one node leaves a record saying
what state each node is in and the exact next step; resume. The proof on the real ring is
tests/integration/test_s3_restore.py."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

from ringsnap.coordinator.cli import restore as restore_cli
from ringsnap.coordinator.cli.client import CliError, ExitCode
from ringsnap.coordinator.model import (
    NodeVerdict,
    RestoreMode,
    RestoreState,
    RestoreStep,
    Verification,
)
from ringsnap.coordinator.restore.plan import RestoreRequest
from ringsnap.coordinator.restore.workflow import RestoreFailed
from ringsnap.coordinator.table_restore.model import (
    Step as TableStep,
)
from ringsnap.coordinator.table_restore.model import (
    TableRestoreFailed,
    TableRestoreRequest,
    TableRestoreState,
)
from ringsnap.coordinator.table_restore.workflow import TableRestoreWorkflow
from tests.support import table_restore_world as table_world
from tests.support.restore_world import NODES, first_index, last_index, restore_backup
from tests.support.s3_restore_fakes import S3, S3Rig, TableS3Agent


def test_every_node_downloads_before_anything_stops_and_the_array_is_never_asked() -> None:
    rig = S3Rig()
    rig.array.missing = True  # the array's snapshots are gone: the plan does not care
    lost = replace(restore_backup(), lost_reason="array destroyed")
    plan = rig.plan(S3, lost)
    assert not plan.refused, plan.refusals
    assert plan.arrays == () and all(n.volumes == () for n in plan.nodes)
    assert ".ringsnap-replaced/<restore id>/" in plan.destroyed[0]

    record = asyncio.run(rig.workflow().run(plan, "me"))

    events = rig.events
    assert last_index(events, ":download") < first_index(events, "ring:pre-restore canary")
    assert last_index(events, ":download") < first_index(events, ":stop")
    assert last_index(events, ":stop") < first_index(events, ":install")
    assert last_index(events, ":install") < first_index(events, ":discard:hints=True")
    for node in NODES:
        assert events.index(f"{node}:discard:hints=True") < events.index(f"{node}:commitlog")
    assert last_index(events, ":commitlog") < first_index(events, ":manifest")
    assert events.index("node2:start:gossip") < events.index("node1:start")
    assert not any("release" in e or "attach" in e or e.startswith("array:") for e in events)
    assert record.state is RestoreState.PROVEN and record.mode is RestoreMode.S3
    assert all(n.verdict is NodeVerdict.PROVEN for n in record.nodes)
    assert rig.journal.verified == [("rs-1", Verification.PROVEN, "rr-1")]
    steps = {(n.name, n.step) for r in rig.journal.saved for n in r.nodes}
    assert all((n, RestoreStep.DOWNLOADED) in steps for n in NODES)
    assert not any(s in (RestoreStep.RELEASED, RestoreStep.ATTACHED) for _, s in steps)
    # Progress per node: bytes, files, rate, ETA.
    assert ("node1", "download from S3", "1/2 files, 0.0/0.0 MiB, 0.0 MiB/s, ETA 2 s") in rig.lines


def test_a_download_failing_on_one_node_stops_nothing_and_names_the_object() -> None:
    rig = S3Rig()
    key = "copies/sstables/node3/ks/t-abc/nb-1-big-123/Data.db-100"
    rig.s3["node3"].fail["download"] = RuntimeError(f"object {key!r} is corrupt (CRC32 1)")

    with pytest.raises(RestoreFailed, match="node node3: downloaded: object") as failed:
        asyncio.run(rig.workflow().run(rig.plan(S3), "me"))

    assert key in str(failed.value)
    assert not any(e.endswith((":stop", ":install")) or "canary" in e for e in rig.events)
    last = rig.journal.saved[-1]
    assert last.state is RestoreState.FAILED
    assert last.node("node1").step is RestoreStep.DOWNLOADED
    assert last.node("node3").step is RestoreStep.PLANNED
    for node in last.nodes:
        assert node.next_step.startswith("nothing was changed on this node")


def test_a_resume_downloads_again_where_the_staging_was_removed_before_anything_stops() -> None:
    """An operator who removed a node's staging to give the restore up, then resumed: that node
    downloads again before any stop (not an install refused with Cassandra stopped)."""
    rig = S3Rig()
    rig.s3["node3"].fail["download"] = RuntimeError("S3 endpoint unreachable")
    with pytest.raises(RestoreFailed):
        asyncio.run(rig.workflow().run(rig.plan(S3), "me"))
    last = rig.journal.saved[-1]
    assert last.node("node1").step is RestoreStep.DOWNLOADED
    assert "`ringsnap restore --abort rr-1` gives the restore up" in last.node("node1").next_step

    rig.s3["node3"].fail.clear()
    rig.s3["node1"].check = replace(rig.s3["node1"].check, download_complete=False)
    rig.events.clear()
    final = asyncio.run(rig.workflow().resume(last, {}))

    assert final.state is RestoreState.PROVEN
    assert sorted(e for e in rig.events if e.endswith(":check")) == ["node1:check", "node2:check"]
    downloads = sorted(e for e in rig.events if e.endswith(":download"))
    assert downloads == ["node1:download", "node3:download"]
    assert last_index(rig.events, ":download") < first_index(rig.events, ":stop")


def test_an_install_failing_on_one_node_says_where_each_node_stands_and_resume_finishes() -> None:
    rig = S3Rig()
    rig.s3["node3"].fail["install"] = OSError("No space left on device")
    with pytest.raises(RestoreFailed, match="node node3: restored: No space left"):
        asyncio.run(rig.workflow().run(rig.plan(S3), "me"))
    last = rig.journal.saved[-1]
    assert last.state is RestoreState.FAILED
    assert last.node("node1").step is RestoreStep.RESTORED
    assert "commit log still holds newer writes" in last.node("node1").next_step
    assert last.node("node3").step is RestoreStep.STOPPED
    assert "installing the downloaded copy may have begun" in last.node("node3").next_step
    assert "--resume rr-1" in last.node("node3").next_step
    assert not any(":discard" in e or ":start" in e for e in rig.events)

    rig.s3["node3"].fail.clear()
    rig.events.clear()
    final = asyncio.run(rig.workflow().resume(last, {}))

    assert final.state is RestoreState.PROVEN
    assert [e for e in rig.events if e.endswith(":install")] == ["node3:install"]
    assert not any(e.endswith((":download", ":stop")) for e in rig.events)


def test_a_node_left_stopped_whose_staging_was_removed_downloads_again_on_resume() -> None:
    rig = S3Rig()
    rig.s3["node3"].fail["install"] = OSError("No space left on device")
    with pytest.raises(RestoreFailed):
        asyncio.run(rig.workflow().run(rig.plan(S3), "me"))
    last = rig.journal.saved[-1]
    assert last.node("node3").step is RestoreStep.STOPPED

    rig.s3["node3"].fail.clear()
    rig.s3["node3"].check = replace(rig.s3["node3"].check, download_complete=False)
    rig.events.clear()
    final = asyncio.run(rig.workflow().resume(last, {}))

    assert final.state is RestoreState.PROVEN
    node3 = [e for e in rig.events if e.startswith("node3:")]
    assert node3[:3] == ["node3:check", "node3:download", "node3:install"]
    assert not any(e.endswith(":download") for e in rig.events if not e.startswith("node3:"))
    assert not any(e.endswith(":stop") or "canary" in e for e in rig.events)
    assert final.node("node3").step is RestoreStep.VERIFIED


def test_a_commit_log_failing_after_the_discard_is_repeated_with_it_on_resume() -> None:
    rig = S3Rig()
    rig.s3["node1"].fail["commitlog"] = RuntimeError("segment refused")
    with pytest.raises(RestoreFailed, match="node node1: cleared: segment refused"):
        asyncio.run(rig.workflow().run(rig.plan(S3), "me"))
    last = rig.journal.saved[-1]
    assert last.node("node1").step is RestoreStep.RESTORED
    assert "do not start it by hand" in last.node("node1").next_step

    rig.s3["node1"].fail.clear()
    rig.events.clear()
    final = asyncio.run(rig.workflow().resume(last, {}))

    assert final.state is RestoreState.PROVEN
    assert rig.events.index("node1:discard:hints=True") < rig.events.index("node1:commitlog")
    assert not any(e.startswith(("node2:discard", "node3:discard")) for e in rig.events)


def test_one_node_alone_from_s3_keeps_the_others_running() -> None:
    rig = S3Rig()
    plan = rig.plan(RestoreRequest("rs-1", ("node1",), RestoreMode.S3))
    assert not plan.refused and not plan.whole_ring
    record = asyncio.run(rig.workflow().run(plan, "me"))
    assert record.state is RestoreState.PROVEN
    assert "node1:discard:hints=False" in rig.events
    assert not any(e.startswith(("node2:", "node3:")) for e in rig.events)


# -- a table from S3 into the live ring (the table restore's staging filled from the bucket) ------


def _table_world(components: int = 2) -> tuple[table_world.World, dict[str, TableS3Agent]]:
    world = table_world.World()
    agents = {n: TableS3Agent(world.agents[n], components) for n in NODES}
    return world, agents


def _table_run(world: table_world.World, agents: dict[str, TableS3Agent], plan: Any) -> Any:
    workflow = TableRestoreWorkflow(
        world.backup,
        table_world.SCHEMA,
        world.agents,
        {"array1": world.array},  # type: ignore[dict-item]
        world.cql,
        world.journal,
        s3_agents=agents,
    )
    return asyncio.run(workflow.run(plan.record))


def test_a_table_from_s3_is_staged_from_the_bucket_without_clones_then_imported() -> None:
    world, agents = _table_world()
    request = TableRestoreRequest(
        backup_id=world.backup.id, keyspace="shop", tables=("orders",), from_s3=True
    )
    plan = world.plan(request, lost_reason="array destroyed")  # the array's snapshots are gone
    assert not plan.refused, plan.refusals
    assert plan.record.from_s3 and plan.record.clones == ()

    record = _table_run(world, agents, plan)

    assert record.state is TableRestoreState.SUCCEEDED, record.error
    events = world.events
    assert not any(e.startswith("array:") or "mount" in e or ":stage:" in e for e in events)
    downloads = [i for i, e in enumerate(events) if ":download:shop.orders->shop.orders" in e]
    assert len(downloads) == 3
    assert max(downloads) < min(i for i, e in enumerate(events) if ":import:" in e)
    assert [n.step for n in record.nodes] == [TableStep.CLEANUP] * 3


def test_a_table_copy_in_the_bucket_that_differs_from_the_manifest_imports_nothing() -> None:
    world, agents = _table_world(components=1)  # the manifest's SSTable has 2 components
    request = TableRestoreRequest(
        backup_id=world.backup.id, keyspace="shop", tables=("orders",), from_s3=True
    )
    plan = world.plan(request)

    with pytest.raises(TableRestoreFailed, match="the bucket's copy holds 1 components"):
        _table_run(world, agents, plan)

    assert not any(":import:" in e or e.startswith("cql:CREATE") for e in world.events)


# -- the command line -----------------------------------------------------------------------------


def test_from_s3_is_the_s3_mode_and_refuses_what_it_cannot_do() -> None:
    assert restore_cli._mode_with_source(RestoreMode.REVERT, "s3") is RestoreMode.S3
    assert restore_cli._mode_with_source(RestoreMode.CLONE, "") is RestoreMode.CLONE
    for mode, source, message in (
        (RestoreMode.CLONE, "s3", "--mode clone clones array snapshots"),
        (RestoreMode.REVERT, "gcs", "the only other source is s3"),
    ):
        with pytest.raises(CliError, match=message) as refused:
            restore_cli._mode_with_source(mode, source)
        assert refused.value.exit_code == ExitCode.USAGE
