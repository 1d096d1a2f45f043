"""Restores in the catalog: whole records saved and replaced atomically, read back field for field,
listed newest first, the open ones found, the ones a dead coordinator left marked interrupted, and
JSON columns edited by hand into garbage shown as warnings instead of breaking reads."""

from __future__ import annotations

import dataclasses
import sqlite3
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from ringsnap.coordinator.catalog import (
    Catalog,
    CatalogError,
    RestoreNotFoundError,
)
from ringsnap.coordinator.model import (
    RestoreNode,
    RestoreRecord,
    RestoreState,
    RestoreStep,
    RestoreVolume,
)
from ringsnap.errors import ValidationError

from .conftest import T0, restore_node, restore_record


def test_a_restore_round_trips_field_for_field(catalog: Catalog) -> None:
    record = restore_record(
        "rr-1",
        state=RestoreState.FAILED,
        finished_at=T0 + timedelta(hours=3),
        error="node n2: Cassandra did not start within 600 s",
    )
    catalog.save_restore(record)
    assert catalog.get_restore("rr-1") == record
    # The builders set every field away from its default: a field added to the model but not
    # stored by the catalog fails here.
    for kind, value in (
        (RestoreRecord, record),
        (RestoreNode, record.nodes[0]),
        (RestoreVolume, record.nodes[0].volumes[0]),
    ):
        for field in dataclasses.fields(kind):
            if field.default is not dataclasses.MISSING:
                assert getattr(value, field.name) != field.default, (kind.__name__, field.name)
    assert record.nodes[1].manifest_ok is None  # and None survives too


def test_saving_again_replaces_the_whole_record(catalog: Catalog) -> None:
    catalog.save_restore(restore_record("rr-1"))
    done = restore_record(
        "rr-1",
        state=RestoreState.PROVEN,
        finished_at=T0 + timedelta(hours=3),
        nodes=(restore_node("n1", step=RestoreStep.VERIFIED),),
        warnings=(),
        arrays_done=(),
        clones=(),
        timings=(),
        whole_ring=False,
        error="",
    )
    catalog.save_restore(done)
    assert catalog.get_restore("rr-1") == done
    rows = catalog._connection().execute("SELECT count(*) FROM restores").fetchone()[0]
    assert rows == 1


def test_a_restore_id_names_one_restore(catalog: Catalog) -> None:
    catalog.save_restore(restore_record("rr-1", "rs-1"))
    with pytest.raises(CatalogError, match="rr-1 is already used by a restore of backup rs-1"):
        catalog.save_restore(restore_record("rr-1", "rs-2"))
    with pytest.raises(CatalogError, match="already used"):
        catalog.save_restore(restore_record("rr-1", "rs-1", cluster="c2"))
    assert catalog.get_restore("rr-1").backup_id == "rs-1"


def test_save_validates_the_record(catalog: Catalog) -> None:
    with pytest.raises(ValidationError):
        catalog.save_restore(restore_record("../rr"))
    with pytest.raises(ValueError, match="needs who asked for it"):
        catalog.save_restore(restore_record("rr-1", requested_by=""))
    with pytest.raises(ValueError, match="needs its backup"):
        catalog.save_restore(restore_record("rr-1", ""))
    with pytest.raises(ValueError, match="'n1' is unnamed or twice"):
        catalog.save_restore(restore_record("rr-1", nodes=(restore_node("n1"),) * 2))
    with pytest.raises(ValueError, match="time zone"):
        catalog.save_restore(restore_record("rr-1", started_at=datetime(2026, 1, 1)))
    assert catalog.list_restores() == []


def test_an_unknown_restore_is_not_found(catalog: Catalog) -> None:
    with pytest.raises(RestoreNotFoundError, match="no restore 'rr-nope'") as raised:
        catalog.get_restore("rr-nope")
    assert isinstance(raised.value, CatalogError)
    assert raised.value.restore_id == "rr-nope"


def test_listing_is_newest_first_per_cluster_and_limited(catalog: Catalog) -> None:
    for i in range(6):
        catalog.save_restore(
            restore_record(
                f"rr-{i}",
                cluster="c1" if i % 2 else "c2",
                started_at=T0 + timedelta(hours=i // 2),  # pairs share a start: the id breaks it
            )
        )
    assert [r.id for r in catalog.list_restores()] == [f"rr-{i}" for i in range(5, -1, -1)]
    assert [r.id for r in catalog.list_restores("c1")] == ["rr-5", "rr-3", "rr-1"]
    assert [r.id for r in catalog.list_restores(limit=2)] == ["rr-5", "rr-4"]
    assert catalog.list_restores("nope") == []
    with pytest.raises(ValueError, match="limit"):
        catalog.list_restores(limit=0)


def test_open_restores_are_those_not_finished(catalog: Catalog) -> None:
    for i, state in enumerate(RestoreState):
        catalog.save_restore(
            restore_record(
                f"rr-{state.value}",
                state=state,
                cluster="c1" if state is not RestoreState.FAILED else "c2",
                started_at=T0 + timedelta(minutes=i),
            )
        )
    assert [r.id for r in catalog.open_restores()] == [
        "rr-interrupted",
        "rr-failed",
        "rr-running",
    ]
    assert [r.state for r in catalog.open_restores("c1")] == [
        RestoreState.INTERRUPTED,
        RestoreState.RUNNING,
    ]
    assert all(not r.state.finished for r in catalog.open_restores())


def test_restores_running_when_the_catalog_is_opened_are_marked_interrupted(
    tmp_path: Path,
) -> None:
    path = tmp_path / "catalog.db"
    with Catalog(path) as catalog:
        catalog.save_restore(restore_record("rr-died", started_at=T0))
        catalog.save_restore(restore_record("rr-failed", state=RestoreState.FAILED))
        catalog.save_restore(restore_record("rr-done", state=RestoreState.PROVEN))
        catalog.save_restore(restore_record("rr-died-too", started_at=T0 + timedelta(hours=1)))
        assert catalog.interrupted_restores() == []  # running in this process

    # A reader neither marks nor reports them.
    with Catalog(path, exclusive=False) as reader:
        assert reader.get_restore("rr-died").state is RestoreState.RUNNING
        with pytest.raises(CatalogError, match="only to the coordinator owning"):
            reader.interrupted_restores()

    with Catalog(path) as catalog:
        interrupted = catalog.interrupted_restores()
        assert [r.id for r in interrupted] == ["rr-died", "rr-died-too"]  # oldest first
        assert all(r.state is RestoreState.INTERRUPTED for r in interrupted)
        assert interrupted[0] == restore_record(
            "rr-died", started_at=T0, state=RestoreState.INTERRUPTED
        )
        assert catalog.get_restore("rr-died").state is RestoreState.INTERRUPTED
        assert catalog.get_restore("rr-failed").state is RestoreState.FAILED
        assert {r.id for r in catalog.open_restores()} == {"rr-died", "rr-died-too", "rr-failed"}
        # Resumed (running again in this process): no longer interrupted, and never re-marked.
        catalog.save_restore(restore_record("rr-died", started_at=T0))
        catalog.save_restore(restore_record("rr-new"))
        assert [r.id for r in catalog.interrupted_restores()] == ["rr-died-too"]
        assert catalog.get_restore("rr-died").state is RestoreState.RUNNING


def test_a_node_record_from_an_older_ringsnap_takes_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "catalog.db"
    with Catalog(path) as catalog:
        catalog.save_restore(restore_record("rr-1"))
    raw = sqlite3.connect(path)
    raw.execute(
        "UPDATE restores SET nodes = ?",
        ('[{"name": "n1", "volumes": [{"array": "a1", "volume": "v", "role": "data"}]}]',),
    )
    raw.commit()
    raw.close()
    with Catalog(path) as catalog:
        [n1] = catalog.get_restore("rr-1").nodes
        assert n1 == RestoreNode(
            name="n1", volumes=(RestoreVolume(array="a1", volume="v", role=n1.volumes[0].role),)
        )
        assert n1.step is RestoreStep.PLANNED and n1.manifest_ok is None


#: Column -> hand-edited values, each with what the warning says about it.
HOSTILE: dict[str, list[tuple[object, str]]] = {
    "nodes": [
        ("oops, not json", "not JSON"),
        ('{"name": "n1"}', "a JSON dict, not a list"),
        ("[1]", "node #1 is not a JSON object"),
        ('[{"host_id": "h"}]', "node #1: name is missing"),
        ('[{"name": "n1", "step": "teleported"}]', "node n1: step 'teleported' is not one of"),
        ('[{"name": "n1", "verdict": true}]', "node n1: verdict True is not one of"),
        ('[{"name": "n1", "was_running": "yes"}]', "node n1: was_running is not true or false"),
        ('[{"name": "n1", "manifest_ok": 1}]', "node n1: manifest_ok is not true, false or null"),
        ('[{"name": "n1", "proof": "all good"}]', "node n1: proof is not a list of strings"),
        ('[{"name": "n1", "volumes": [{"array": "a1", "volume": "v"}]}]', "role is missing"),
        ('[{"name": "n1", "volumes": {}}]', "node n1: volumes is not a list"),
        ('[{"name": "n1", "step_seconds": [["stopped", true]]}]', "not a number of seconds"),
        ('[{"name": "n1", "step_seconds": [["stopped", NaN]]}]', "not a number of seconds"),
        ('[{"name": "n1"}, {"name": "n1"}]', "a node is listed twice"),
        (b"\xff\xfe", "not UTF-8 text"),
        (42, "a JSON int, not a list"),  # TEXT affinity stores it as "42"
    ],
    "warnings": [("[1, null]", "not a list of strings"), ('"one sentence"', "a JSON str")],
    "arrays_done": [('[["a1"]]', "is not a list of 2 strings"), ("{}", "a JSON dict")],
    "clones": [('[["a1", "v", 3]]', "is not a list of 3 strings"), ("[", "not JSON")],
    "timings": [('[["plan"]]', "is not a [name, seconds] pair"), ("[[1, 2]]", "is not a [name")],
}


@pytest.mark.parametrize(
    ("column", "stored", "why"),
    [(column, stored, why) for column, cases in HOSTILE.items() for stored, why in cases],
)
def test_a_json_column_edited_by_hand_never_breaks_a_read(
    tmp_path: Path, column: str, stored: object, why: str
) -> None:
    path = tmp_path / "catalog.db"
    good = restore_record("rr-good", started_at=T0, state=RestoreState.PROVEN)
    with Catalog(path) as catalog:
        catalog.save_restore(restore_record("rr-bad", state=RestoreState.FAILED))
        catalog.save_restore(good)
    raw = sqlite3.connect(path)
    raw.execute(f"UPDATE restores SET {column} = ? WHERE id = 'rr-bad'", (stored,))
    raw.commit()
    raw.close()
    with Catalog(path) as catalog:
        bad = catalog.get_restore("rr-bad")
        assert getattr(bad, column) == () or column == "warnings"
        unreadable = [
            w for w in bad.warnings if w.startswith(f"unreadable {column.replace('_', ' ')}")
        ]
        assert len(unreadable) == 1, bad.warnings
        assert why in unreadable[0]
        assert len(unreadable[0]) < 400, "a long value is quoted in part"
        # Every other column of the record, and every other record, reads as saved.
        expected = restore_record("rr-bad", state=RestoreState.FAILED)
        for other in ("nodes", "arrays_done", "clones", "timings"):
            if other != column:
                assert getattr(bad, other) == getattr(expected, other), other
        if column != "warnings":
            assert bad.warnings[:-1] == expected.warnings
        assert catalog.get_restore("rr-good") == good
        assert [r.id for r in catalog.list_restores()] == ["rr-bad", "rr-good"]
        assert [r.id for r in catalog.open_restores()] == ["rr-bad"]


def test_a_huge_unreadable_column_is_quoted_in_part(tmp_path: Path) -> None:
    path = tmp_path / "catalog.db"
    with Catalog(path) as catalog:
        catalog.save_restore(restore_record("rr-1"))
    raw = sqlite3.connect(path)
    raw.execute("UPDATE restores SET nodes = ?", ("x" * 100_000,))
    raw.commit()
    raw.close()
    with Catalog(path) as catalog:
        [warning] = [w for w in catalog.get_restore("rr-1").warnings if "unreadable" in w]
        assert warning.endswith("...") and len(warning) < 400
