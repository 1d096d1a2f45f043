"""Drills in the catalog: whole records saved and replaced, read back field for field, listed newest
first by cluster and by backup, running ones a dead coordinator left marked interrupted, and JSON
columns edited by hand into garbage shown as warnings instead of breaking reads."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from ringsnap.coordinator.catalog import Catalog, CatalogError, DrillNotFoundError
from ringsnap.coordinator.drill.model import (
    DrillClone,
    DrillNode,
    DrillRecord,
    DrillState,
    DrillStep,
    DrillVerdict,
)

from .conftest import T0


def drill_node(name: str, **fields: Any) -> DrillNode:
    values: dict[str, Any] = {
        "name": name,
        "host_id": f"host-{name}",
        "purpose_id": f"dr-20261121-100000-0001-{name}",
        "step": DrillStep.CHECKED,
        "verdict": DrillVerdict.NOT_PROVEN,
        "proof": ("digests: 3 SSTables equal",),
        "problems": ("canary: row absent",),
        "teardown": ("delete clone a1:x: volume busy",),
        "clones": (
            DrillClone(
                array="a1",
                source=f"{name}_data",
                name=f"{name}_data_dr",
                id="uuid-1",
                role="data",
                wwn="600a",
                deleted=True,
            ),
        ),
        "step_seconds": (("cloned", 1.5), ("mounted", 0.25)),
        "bytes_verified": 4096,
        "row_counts": (("shop.orders", 1200), ("shop.users", 0)),
    }
    values.update(fields)
    return DrillNode(**values)


def drill_record(drill_id: str = "dr-20261121-100000-0001", **fields: Any) -> DrillRecord:
    values: dict[str, Any] = {
        "id": drill_id,
        "cluster": "c1",
        "backup_id": "rs-1",
        "trigger": "schedule:nightly",
        "requested_by": "alice",
        "started_at": T0,
        "nodes": (drill_node("n1"), drill_node("n2", clones=())),
        "state": DrillState.NOT_PROVEN,
        "finished_at": T0 + timedelta(minutes=3),
        "error": "node n1: canary: row absent",
        "warnings": ("teardown incomplete",),
    }
    values.update(fields)
    return DrillRecord(**values)


def test_a_drill_round_trips_field_for_field(catalog: Catalog) -> None:
    record = drill_record()
    catalog.save_drill(record)
    assert catalog.get_drill(record.id) == record
    # Every field away from its default: a field added to the model but not stored fails here.
    for kind, value in (
        (DrillRecord, record),
        (DrillNode, record.nodes[0]),
        (DrillClone, record.nodes[0].clones[0]),
    ):
        for field in dataclasses.fields(kind):
            if field.default is not dataclasses.MISSING:
                assert getattr(value, field.name) != field.default, (kind.__name__, field.name)


def test_saving_again_replaces_the_record_and_an_id_names_one_drill(catalog: Catalog) -> None:
    catalog.save_drill(drill_record(state=DrillState.RUNNING, finished_at=None))
    done = drill_record(state=DrillState.PROVEN, error="", warnings=())
    catalog.save_drill(done)
    assert catalog.get_drill(done.id) == done
    with pytest.raises(CatalogError, match="already used by a drill of backup rs-1"):
        catalog.save_drill(drill_record(backup_id="rs-2"))
    with pytest.raises(DrillNotFoundError):
        catalog.get_drill("dr-20261121-100000-ffff")


def test_bad_records_are_refused(catalog: Catalog) -> None:
    with pytest.raises(ValueError, match="invalid drill id"):
        catalog.save_drill(drill_record("rr-1"))
    with pytest.raises(ValueError, match="listed twice"):
        catalog.save_drill(drill_record(nodes=(drill_node("n1"), drill_node("n1"))))
    with pytest.raises(ValueError, match="needs its end time"):
        catalog.save_drill(drill_record(finished_at=None))


def test_drills_are_listed_newest_first_by_cluster_and_backup(catalog: Catalog) -> None:
    for minute, (cluster, backup) in enumerate([("c1", "rs-1"), ("c2", "rs-9"), ("c1", "rs-2")]):
        catalog.save_drill(
            drill_record(
                f"dr-20261121-10{minute:02d}00-000{minute}",
                cluster=cluster,
                backup_id=backup,
                started_at=T0 + timedelta(minutes=minute),
            )
        )
    assert [d.backup_id for d in catalog.list_drills("c1")] == ["rs-2", "rs-1"]
    assert [d.cluster for d in catalog.list_drills(backup_id="rs-9")] == ["c2"]
    latest = catalog.latest_drill("c1")
    assert latest is not None and latest.backup_id == "rs-2"
    assert catalog.latest_drill("c3") is None


def test_a_running_drill_found_at_open_is_interrupted(tmp_path: Path) -> None:
    path = tmp_path / "catalog.db"
    with Catalog(path) as first:
        first.save_drill(drill_record(state=DrillState.RUNNING, finished_at=None))
    with Catalog(path) as second:
        found = second.get_drill("dr-20261121-100000-0001")
        assert found.state is DrillState.INTERRUPTED and found.finished_at is not None
        assert [d.id for d in second.interrupted_drills()] == [found.id]
        assert found.clones == drill_record().clones  # the clones stay known


@pytest.mark.parametrize(
    ("column", "garbage", "expected"),
    [
        ("nodes", "{not json", "unreadable nodes in the catalog (not JSON"),
        ("nodes", '[{"name": "n1", "step": "flying", "verdict": "proven"}]', "step 'flying'"),
        ("clones", '[{"node": "n1", "array": "a1"}]', "clone #1: source is missing"),
        ("clones", '[{"node": "n7", "array": "a1", "source": "s", "name": "c"}]', "node n7"),
        ("warnings", "[1, 2]", "unreadable warnings in the catalog (not a list of strings)"),
    ],
)
def test_a_hand_edited_column_is_a_warning_not_a_broken_read(
    catalog: Catalog, column: str, garbage: str, expected: str
) -> None:
    catalog.save_drill(drill_record())
    catalog._connection().execute(f"UPDATE drills SET {column} = ?", (garbage,))
    found = catalog.get_drill("dr-20261121-100000-0001")
    assert any(expected in w for w in found.warnings), found.warnings
    assert found.state is DrillState.NOT_PROVEN
