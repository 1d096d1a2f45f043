"""The table restore's planner and run with fakes of its own ports: the refusals (each naming what),
the order (everything staged on every node before anything in the ring changes), the record after
every step, resume from the exact step, clones never left behind, staging kept until imported.

The proof that table restores work is tests/integration/test_table_restore.py on the real ring.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from ringsnap.coordinator.model import SnapshotKind
from ringsnap.coordinator.table_restore.model import (
    CloneRecord,
    Step,
    TableRestoreFailed,
    TableRestoreRecord,
    TableRestoreRequest,
    TableRestoreState,
)
from ringsnap.coordinator.table_restore.ports import ImportedTable
from tests.support.table_restore_world import NODES, World, shop_sstable

# -- the planner's refusals --------------------------------------------------------------------------


def test_a_good_plan_clones_only_the_data_volumes_and_sizes_each_node() -> None:
    plan = World().plan()
    assert not plan.refused, plan.refusals
    assert [(c.node, c.volume, c.source_mount_point) for c in plan.record.clones] == [
        (n, f"{n}_data", "/data") for n in NODES
    ]
    assert [t.action for t in plan.record.targets] == ["exists"]
    for node in plan.record.nodes:
        assert [(t.table, t.sstables, t.bytes) for t in node.tables] == [("orders", 1, 1010)]


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        (lambda w: w.cql.problems.append("node 127.0.0.3 is down"), "not healthy: node 127.0.0.3"),
        (lambda w: setattr(w.agents["node2"], "free", 100), "node node2: /data/.ringsnap-staging"),
        (lambda w: setattr(w.agents["node3"], "running", False), "node node3: Cassandra is not"),
        (
            lambda w: w.manifests.update(node1=[shop_sstable(complete=False)]),
            "node node1: shop.orders SSTable 1 is incomplete",
        ),
        (
            lambda w: [m.clear() for m in w.manifests.values()],
            "no node's manifest in the backup holds an SSTable of shop.orders",
        ),
    ],
)
def test_the_plan_refuses_naming_what(change: object, refusal: str) -> None:
    world = World()
    change(world)  # type: ignore[operator]
    plan = world.plan()
    assert any(refusal in r for r in plan.refusals), plan.refusals


def test_a_table_missing_from_the_backups_schema_is_refused_with_the_tables_it_had() -> None:
    world = World()
    request = TableRestoreRequest(backup_id="b", keyspace="shop", tables=("nope",))
    assert any(
        "shop.nope is not in the schema" in r and "orders" in r
        for r in world.plan(request).refusals
    )


def test_lost_native_and_partial_backups_are_refused() -> None:
    world = World()
    partial = tuple(
        replace(n, excluded_reason="agent unreachable") if n.name == "node2" else n
        for n in world.backup.nodes
    )
    refusals = world.plan(
        lost_reason="reverted away", snapshot_kind=SnapshotKind.NATIVE, nodes=partial
    ).refusals
    assert any("snapshots are gone (reverted away)" in r for r in refusals)
    assert any("native snapshots" in r for r in refusals)
    assert any("node node2 is not in backup" in r for r in refusals)


def test_as_needs_one_table_and_a_new_name() -> None:
    world = World()
    two = TableRestoreRequest(
        backup_id="b", keyspace="shop", tables=("orders", "other"), target=("shop", "copy")
    )
    assert any("exactly one table" in r for r in world.plan(two).refusals)
    taken = TableRestoreRequest(
        backup_id="b", keyspace="shop", tables=("orders",), target=("shop", "orders")
    )
    assert any("that table exists" in r for r in world.plan(taken).refusals)


# -- the run -----------------------------------------------------------------------------------------


def test_everything_is_staged_everywhere_before_the_ring_changes() -> None:
    world = World()
    world.cql.tables.clear()  # dropped
    plan = world.plan()
    assert [t.action for t in plan.record.targets] == ["dropped"]

    record = world.run(plan.record)

    assert record.state is TableRestoreState.SUCCEEDED, record.error
    events = world.events
    last_stage = max(i for i, e in enumerate(events) if ":stage:" in e)
    first_change = events.index("cql:CREATE TABLE shop.orders")
    assert last_stage < first_change
    assert max(i for i, e in enumerate(events) if e.startswith("array:delete")) < first_change
    assert min(i for i, e in enumerate(events) if ":import:" in e) > first_change
    assert all(c.deleted for c in record.clones)
    assert [n.step for n in record.nodes] == [Step.CLEANUP] * 3
    assert all(line.startswith("ok:") for line in record.verification), record.verification
    # A record after every step: the saved steps go through the whole run in order.
    steps = [s.step for s in world.journal.saved]
    assert steps == sorted(steps, key=list(Step).index)
    assert steps[-1] is Step.DONE


def test_a_failed_stage_deletes_the_clones_keeps_the_staging_and_resumes() -> None:
    world = World()
    world.agents["node2"].fail["stage:shop.orders"] = RuntimeError("disk full")
    plan = world.plan()

    with pytest.raises(TableRestoreFailed, match="node node2: disk full") as failed:
        world.run(plan.record)

    record = failed.value.record
    assert record is not None
    assert record.state is TableRestoreState.FAILED
    assert record.step is Step.PLANNED and record.next_step is Step.CLONE
    assert all(c.clone == "" for c in record.clones)  # deleted, to be made again
    assert world.events.count("array:delete:node1_data_tr_1") == 1
    assert not any("remove-staging" in e or ":import:" in e for e in world.events)
    assert record.node("node1").step is Step.STAGE
    assert record.node("node2").step is Step.MOUNT

    world.events.clear()
    done = world.run(record)
    assert done.state is TableRestoreState.SUCCEEDED
    # node1 and node3 had staged: only node2 stages again.
    assert [e for e in world.events if ":stage:" in e] == ["node2:stage:shop.orders"]


def _failed_with_two_clones_left(world: World) -> tuple[TableRestoreRecord, list[CloneRecord]]:
    """A run whose mount fails and whose clean-up cannot delete two of the clones."""
    world.agents["node1"].fail["mount"] = RuntimeError("attach hook failed")
    world.array.fail_delete = 2

    with pytest.raises(TableRestoreFailed) as failed:
        world.run(world.plan().record)

    record = failed.value.record
    assert record is not None
    return record, [c for c in record.clones if c.clone and not c.deleted]


def test_a_clone_the_array_would_not_delete_stays_in_the_record_and_resume_deletes_it() -> None:
    world = World()
    record, left = _failed_with_two_clones_left(world)
    assert len(left) == 2
    assert any("clones not deleted" in w for w in record.warnings)

    done = world.run(record)
    assert done.state is TableRestoreState.SUCCEEDED
    assert all(c.deleted for c in done.clones)


def test_a_failed_import_keeps_the_staging_and_imports_only_where_it_failed() -> None:
    world = World()
    world.agents["node3"].fail["import:shop.orders"] = RuntimeError("Jolokia timed out")

    with pytest.raises(TableRestoreFailed, match="node node3: Jolokia timed out") as failed:
        world.run(world.plan().record)

    record = failed.value.record
    assert record is not None
    assert record.step is Step.SCHEMA and record.next_step is Step.IMPORT
    assert "import the staged SSTables" in record.next_action
    assert not any("remove-staging" in e for e in world.events)
    assert all(c.deleted for c in record.clones)

    world.events.clear()
    done = world.run(record)
    assert done.state is TableRestoreState.SUCCEEDED
    assert [e for e in world.events if ":import:" in e] == ["node3:import:shop.orders"]


def test_import_reporting_failed_directories_fails_the_run() -> None:
    world = World()

    async def failing(restore_id: str, keyspace: str, table: str) -> ImportedTable:
        return ImportedTable(0, ("/data/.ringsnap-staging/tr-1/shop/orders",), 0.1, "nodetool")

    world.agents["node1"].import_staged_table = failing  # type: ignore[method-assign]
    with pytest.raises(TableRestoreFailed, match="imported 0 of 1 staged SSTables"):
        world.run(world.plan().record)


def test_abort_removes_the_staging_and_the_clones() -> None:
    world = World()
    world.agents["node1"].fail["import:shop.orders"] = RuntimeError("no")
    with pytest.raises(TableRestoreFailed) as failed:
        world.run(world.plan().record)
    record = failed.value.record
    assert record is not None

    aborted = asyncio.run(world.workflow().abort(record))

    assert aborted.state is TableRestoreState.ABORTED
    assert sum("remove-staging" in e for e in world.events) == 3


def test_abort_runs_the_engines_undos_in_reverse_and_an_abort_that_stopped_goes_on() -> None:
    world = World()
    world.agents["node1"].fail["stage:shop.orders"] = RuntimeError("disk full")
    world.array.fail_delete = 100  # the failed run could not delete its clones
    with pytest.raises(TableRestoreFailed) as failed:
        world.run(world.plan().record)
    record = failed.value.record
    assert record is not None and world.array.live
    world.array.fail_delete = 1  # the abort's first deletion fails: it stops there
    world.events.clear()

    with pytest.raises(TableRestoreFailed, match="abort stopped") as stopped:
        asyncio.run(world.workflow().abort(record))

    first = list(world.events)
    staged = [e for e in first if e.endswith(":remove-staging")]
    unmounted = [e for e in first if e.endswith(":unmount")]
    # node1's staging failed halfway: what it staged goes too.
    assert sorted(staged) == [f"node{i}:remove-staging" for i in (1, 2, 3)], first
    assert unmounted, first
    # In reverse of the steps: staging (after mount) first, then the unmounts, then the array.
    assert max(first.index(e) for e in staged) < min(first.index(e) for e in unmounted)
    assert max(first.index(e) for e in unmounted) < first.index(
        next(e for e in first if e.startswith("array:delete"))
    )
    kept = stopped.value.record
    assert kept is not None and kept.state is not TableRestoreState.ABORTED

    deleted_first = {e.split(":")[-1] for e in first if e.startswith("array:delete:")}
    (refused,) = [e.split(":")[-1] for e in first if e.startswith("array:delete-failed:")]
    world.events.clear()
    aborted = asyncio.run(world.workflow().abort(kept))
    assert aborted.state is TableRestoreState.ABORTED
    # Only what the first abort left: the clone the array refused, not those already deleted.
    again = {e.split(":")[-1] for e in world.events if e.startswith("array:delete")}
    assert again == {refused} and not again & deleted_first
    assert world.array.live == set()


def test_as_creates_the_copy_without_the_old_id() -> None:
    world = World()
    request = TableRestoreRequest(
        backup_id="b", keyspace="shop", tables=("orders",), target=("shop", "orders_copy")
    )
    plan = world.plan(request)
    assert not plan.refused, plan.refusals
    record = world.run(plan.record)
    assert record.state is TableRestoreState.SUCCEEDED
    assert "cql:CREATE TABLE shop.orders_copy" in world.events
    assert world.cql.tables["shop.orders_copy"] == "new-id"
    assert "node1:import:shop.orders_copy" in world.events


def test_a_row_count_that_times_out_is_a_warning_not_a_failed_check() -> None:
    world = World()
    world.cql.count_error = TimeoutError("Operation timed out - received only 0 responses")
    record = world.run(world.plan().record)
    assert record.state is TableRestoreState.SUCCEEDED
    assert any("rows were not counted" in w for w in record.warnings)
    assert all(line.startswith("ok:") for line in record.verification)


def test_clones_that_fail_to_delete_once_are_deleted_by_the_failure_and_not_made_again() -> None:
    world = World()
    world.array.fail_delete = 1  # the run's delete fails once; the failure's clean-up deletes them

    with pytest.raises(TableRestoreFailed, match="not deleted: array busy") as failed:
        world.run(world.plan().record)

    record = failed.value.record
    assert record is not None
    assert all(c.deleted for c in record.clones)
    assert record.step is Step.DELETE_CLONES and record.next_step is Step.SCHEMA
    world.events.clear()
    done = world.run(record)
    assert done.state is TableRestoreState.SUCCEEDED
    assert not any(e.startswith("array:clone") or ":stage:" in e for e in world.events)


def test_a_dropped_keyspace_is_created_again_before_its_table() -> None:
    world = World()
    world.cql.tables.clear()
    world.cql.keyspaces.clear()
    plan = world.plan()
    assert not plan.refused, plan.refusals
    assert any("keyspace shop was dropped" in w for w in plan.warnings)

    record = world.run(plan.record)

    assert record.state is TableRestoreState.SUCCEEDED
    schema = [e for e in world.events if e.startswith("cql:")]
    assert schema == [
        "cql:CREATE KEYSPACE shop WITH replication = {}",
        "cql:CREATE TABLE shop.orders",
    ]
    assert record.schema_statements[0].startswith("CREATE KEYSPACE shop")


def test_a_table_created_by_someone_else_meanwhile_stops_the_run_before_any_import() -> None:
    world = World()
    world.cql.tables.clear()
    plan = world.plan()
    world.cql.tables["shop.orders"] = "someone-elses-id"

    with pytest.raises(TableRestoreFailed, match="was created again"):
        world.run(plan.record)
    assert not any(":import:" in e for e in world.events)


def test_every_clone_is_a_pending_cleanup_from_its_making_until_its_deletion() -> None:
    world = World()
    record = world.run(world.plan().record)

    assert record.state is TableRestoreState.SUCCEEDED, record.error
    cloned = next(r for r in world.journal.saved if any(c.clone for c in r.clones))
    # The first record that names the clones already carries their cleanups.
    assert all(c.cleanup_id for c in cloned.clones)
    assert world.journal.next_cleanup_id == 3
    assert world.journal.pending_cleanups == {}, "a deleted clone is still a pending cleanup"


def test_a_clone_left_pending_is_not_deleted_again_once_the_daemon_deleted_it() -> None:
    world = World()
    record, left = _failed_with_two_clones_left(world)
    assert sorted(world.journal.pending_cleanups) == sorted(c.cleanup_id for c in left)
    assert all("array busy" in world.journal.cleanup_errors[c.cleanup_id] for c in left)

    # The daemon's retry deleted one of them before the operator resumed.
    by_daemon = left[0]
    world.journal.pending_cleanups.pop(by_daemon.cleanup_id)
    world.events.clear()
    done = world.run(record)

    assert done.state is TableRestoreState.SUCCEEDED
    assert f"array:delete:{by_daemon.clone}" not in world.events
    assert f"array:delete:{left[1].clone}" in world.events
    assert all(c.deleted for c in done.clones)


def test_a_run_whose_process_died_mid_stage_is_resumed_from_its_record() -> None:
    # What a SIGKILL leaves: the last record saved (running; the catalog's open marks it
    # interrupted), node2's stage begun, the clones made and mounted.
    world = World()

    class Killed(BaseException):
        pass

    world.agents["node2"].fail["stage:shop.orders"] = Killed()
    with pytest.raises(Killed):
        world.run(world.plan().record)
    left = replace(world.journal.saved[-1], state=TableRestoreState.INTERRUPTED)
    assert left.step is Step.MOUNT and left.node("node2").step is Step.MOUNT
    assert [n.step for n in left.nodes if n.name != "node2"] == [Step.STAGE] * 2

    world.events.clear()
    done = world.run(left)
    assert done.state is TableRestoreState.SUCCEEDED, done.error
    # Only node2 stages; nothing was cloned again; every clone deleted.
    assert [e for e in world.events if ":stage:" in e] == ["node2:stage:shop.orders"]
    assert not any(e.startswith("array:clone") for e in world.events)
    assert all(c.deleted for c in done.clones) and world.journal.pending_cleanups == {}
