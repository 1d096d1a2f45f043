"""A table restore's row counts against the newest proven drill of the backup, and its refusal of
a table with materialized views, on the fakes of the workflow's tests.

The proof on a real ring is tests/integration/test_table_restore.py (a drill first, then the restore
compares equal counts per node)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from ringsnap.coordinator.backup.schema import KeyspaceSchema, SchemaRow
from ringsnap.coordinator.drill.model import DrillNode, DrillRecord, DrillState, DrillVerdict
from ringsnap.coordinator.table_restore.counts import (
    NOT_COMPARED,
    DrilledCounts,
    compare_counts,
    newest_drilled_counts,
)
from ringsnap.coordinator.table_restore.model import TableRestoreRequest, TableRestoreState
from tests.support.table_restore_world import NODES, SCHEMA, World

T0 = datetime(2026, 11, 24, 2, 0, tzinfo=UTC)


def _drill(drill_id: str, minutes: int, *nodes: DrillNode) -> DrillRecord:
    return DrillRecord(
        id=drill_id,
        cluster="prod",
        backup_id="rs-1",
        trigger="test",
        requested_by="test",
        started_at=T0 + timedelta(minutes=minutes),
        nodes=nodes,
        state=DrillState.PROVEN,
    )


def _node(name: str, rows: int, verdict: DrillVerdict = DrillVerdict.PROVEN) -> DrillNode:
    return DrillNode(name=name, verdict=verdict, row_counts=(("shop.orders", rows),))


def test_a_count_that_differs_on_one_node_fails_the_verification_naming_node_and_figures() -> None:
    world = World()
    world.cql.primary_rows[("shop.orders", "host-node2")] = 998
    record = world.run(world.plan().record)

    assert record.state is TableRestoreState.NOT_PROVEN
    failed = [line for line in record.verification if line.startswith("FAILED:")]
    assert len(failed) == 1, record.verification
    assert "node node2: shop.orders: 998 rows" in failed[0]
    assert "the backup's 1000 (drill dr-20261124-020000-0001)" in failed[0]
    assert (
        "ok: node node1: shop.orders: 1000 rows over the node's primary ranges at CL=ALL, equal"
        " to the backup's (drill dr-20261124-020000-0001)" in record.verification
    )


def test_every_node_is_counted_over_its_own_primary_ranges() -> None:
    world = World()
    world.run(world.plan().record)
    counted = [e for e in world.events if e.startswith("count:")]
    assert counted == [f"count:shop.orders:host-{n}" for n in NODES]


def test_a_backup_never_drilled_says_so_and_how_and_the_other_checks_stand() -> None:
    world = World()
    world.journal.drilled = {}
    record = world.run(world.plan().record)

    assert record.state is TableRestoreState.SUCCEEDED
    not_compared = [line for line in record.verification if line.startswith(NOT_COMPARED)]
    assert len(not_compared) == len(NODES)
    assert "could not be compared" in not_compared[0]
    assert (
        "`ringsnap drill rs-20261124-030000-abcd --cluster prod --nodes node1`" in (not_compared[0])
    )
    assert any("ringsnap drill rs-20261124-030000-abcd" in w for w in record.warnings)
    assert sum(line.startswith("ok: node") for line in record.verification) == len(NODES)


def test_as_counts_the_target_table_against_the_source_tables_drilled_count() -> None:
    world = World()
    world.cql.primary_rows[("shop.orders_copy", "host-node3")] = 7
    request = TableRestoreRequest(
        backup_id="b", keyspace="shop", tables=("orders",), target=("shop", "orders_copy")
    )
    record = world.run(world.plan(request).record)

    assert [e for e in world.events if e.startswith("count:")] == [
        f"count:shop.orders_copy:host-{n}" for n in NODES
    ]
    assert record.state is TableRestoreState.NOT_PROVEN
    assert any(
        line.startswith("FAILED: node node3: shop.orders_copy: 7 rows")
        and "the backup's 1000" in line
        for line in record.verification
    )


def test_the_newest_drill_that_proved_a_node_gives_its_counts() -> None:
    newest_first = [
        # Not proven on n1: its counts are not trusted; n2 proven and newest.
        _drill("dr-3", 30, _node("n1", 5, DrillVerdict.NOT_PROVEN), _node("n2", 20)),
        _drill("dr-2", 20, _node("n1", 11), _node("n2", 21)),
        _drill("dr-1", 10, _node("n1", 10)),
        # Drilled before counts were kept: nothing to compare for n3.
        _drill("dr-0", 0, DrillNode(name="n3", verdict=DrillVerdict.PROVEN)),
    ]
    found = newest_drilled_counts(newest_first)
    assert found == {
        "n1": DrilledCounts("dr-2", {"shop.orders": 11}),
        "n2": DrilledCounts("dr-3", {"shop.orders": 20}),
    }


def test_a_drill_that_did_not_count_the_table_is_not_a_comparison() -> None:
    line = compare_counts(
        "n1", "shop.gone", "shop.gone", 3, DrilledCounts("dr-1", {"shop.orders": 1}), "b", "c"
    )
    assert line.startswith(NOT_COMPARED)
    assert "counted no table shop.gone" in line


# -- materialized views -------------------------------------------------------------------------------

VIEW = SchemaRow(
    "materialized_view",
    "orders_by_note",
    "CREATE MATERIALIZED VIEW shop.orders_by_note AS SELECT * FROM shop.orders WHERE note IS NOT"
    " NULL AND id IS NOT NULL PRIMARY KEY (note, id);",
)


def test_a_table_with_a_view_is_refused_in_place_naming_the_view_and_what_to_do() -> None:
    world = World()
    world.cql.views["shop.orders"] = ("orders_by_note",)
    plan = world.plan()
    assert plan.refused
    (refusal,) = plan.refusals
    assert "materialized view shop.orders_by_note is built on shop.orders" in refusal
    assert "DROP MATERIALIZED VIEW shop.orders_by_note" in refusal
    assert "--as" in refusal


def test_a_view_on_another_table_or_with_as_is_no_refusal() -> None:
    world = World()
    world.cql.views["shop.other"] = ("other_by_x",)
    assert not world.plan().refused
    world.cql.views["shop.orders"] = ("orders_by_note",)
    request = TableRestoreRequest(
        backup_id="b", keyspace="shop", tables=("orders",), target=("shop", "orders_copy")
    )
    assert not world.plan(request).refused


def test_a_dropped_table_whose_backup_had_a_view_is_restored_with_a_warning_to_create_it() -> None:
    world = World()
    world.cql.tables.clear()
    world.schema = KeyspaceSchema("shop", (*SCHEMA.rows, VIEW))
    plan = world.plan()
    assert not plan.refused, plan.refusals
    assert [t.action for t in plan.record.targets] == ["dropped"]
    assert any(
        "materialized view shop.orders_by_note" in w and "create it after the restore" in w
        for w in plan.warnings
    )
