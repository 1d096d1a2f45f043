"""Restore drills: each one's whole record (its nodes' proofs, or why a node is not proven, and
every clone it made), saved as it goes. Drills found running when the catalog is opened by its
coordinator died with a previous one: they are marked interrupted then (their clones that are not
deleted are pending cleanups already, recorded before the drill used them).

The per-node records, clones and warnings are JSON columns, validated when read: a column edited by
hand into something unreadable shows up in the drill's warnings, it never fails a read.
"""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from typing import Any, TypeVar

from ringsnap.coordinator.catalog.codec import CodecError
from ringsnap.coordinator.catalog.columns import EPOCH, from_us, now, to_us
from ringsnap.coordinator.catalog.database import Database
from ringsnap.coordinator.catalog.errors import CatalogError
from ringsnap.coordinator.catalog.listing import MAX_PAGE_SIZE
from ringsnap.coordinator.catalog.records import JsonColumns, RecordRows
from ringsnap.coordinator.catalog.restore_codec import (
    decode_sentences,
    dumps,
    json_object,
    load_list,
    text,
    texts,
)
from ringsnap.coordinator.drill.model import (
    DRILL_ID,
    DrillClone,
    DrillNode,
    DrillRecord,
    DrillState,
    DrillStep,
    DrillVerdict,
)

_FIELDS = (
    "id",
    "cluster",
    "backup_id",
    "state",
    "trigger",
    "requested_by",
    "started_us",
    "finished_us",
    "error",
    "nodes",
    "clones",
    "warnings",
)
#: The catalog migration that made the drills table.
_DRILLS_VERSION = 5

T = TypeVar("T")


class DrillNotFoundError(CatalogError):
    exit_code = 66

    def __init__(self, drill_id: str) -> None:
        self.drill_id = drill_id
        super().__init__(f"no drill {drill_id!r} in the catalog")


class DrillStore(Database):
    _drills_interrupted_at_open: frozenset[str] = frozenset()

    def _opened(self, conn: sqlite3.Connection) -> None:
        super()._opened(conn)
        # A catalog opened with fewer migrations (tests of older versions) has no drills table.
        if not self._exclusive or self.schema_version < _DRILLS_VERSION:
            return
        self._drills_interrupted_at_open = _ROWS.mark_interrupted(
            conn,
            ", finished_us = ?, error = 'the coordinator stopped during the drill'",
            (to_us(now()),),
        )

    def save_drill(self, record: DrillRecord) -> None:
        """Insert the drill, or replace the whole record of the same id, in one transaction. An id
        already used by a drill of another cluster or backup is refused."""
        if not DRILL_ID.fullmatch(record.id):
            raise ValueError(f"invalid drill id {record.id!r} (expected dr-YYYYMMDD-HHMMSS-xxxx)")
        _ROWS.require(
            record.id,
            (
                (record.cluster, "its cluster"),
                (record.backup_id, "its backup"),
                (record.trigger, "its trigger"),
                (record.requested_by, "who asked for it"),
            ),
        )
        names = [n.name for n in record.nodes]
        if len(set(names)) != len(names) or not all(names):
            raise ValueError(f"drill {record.id}: a node is unnamed or listed twice")
        finished = record.finished_at
        if record.state is DrillState.RUNNING:
            finished = None
        elif finished is None:
            raise ValueError(f"drill {record.id}: a finished drill needs its end time")
        values = (
            record.id,
            record.cluster,
            record.backup_id,
            DrillState(record.state).value,
            record.trigger,
            record.requested_by,
            to_us(record.started_at),
            to_us(finished) if finished is not None else None,
            record.error,
            encode_nodes(record.nodes),
            encode_clones(record.nodes),
            dumps(list(record.warnings)),
        )
        with self._tx(write=True) as conn:
            _ROWS.save(conn, values)

    def get_drill(self, drill_id: str) -> DrillRecord:
        with self._tx(write=False) as conn:
            return _ROWS.get(conn, drill_id)

    def list_drills(
        self, cluster: str | None = None, *, backup_id: str | None = None, limit: int = 50
    ) -> list[DrillRecord]:
        """The newest `limit` drills (at most MAX_PAGE_SIZE), of `cluster` and/or of one backup."""
        if limit < 1:
            raise ValueError("limit must be 1 or more")
        where: list[str] = []
        params: list[Any] = []
        if cluster:
            where.append("cluster = ?")
            params.append(cluster)
        if backup_id:
            where.append("backup_id = ?")
            params.append(backup_id)
        with self._tx(write=False) as conn:
            return _ROWS.newest(conn, where, params, limit=min(limit, MAX_PAGE_SIZE))

    def latest_drill(self, cluster: str) -> DrillRecord | None:
        found = self.list_drills(cluster, limit=1)
        return found[0] if found else None

    def interrupted_drills(self) -> list[DrillRecord]:
        """The drills that were running when this coordinator opened the catalog."""
        self._require_owner("interrupted drills")
        ids = sorted(self._drills_interrupted_at_open)
        if not ids:
            return []
        with self._tx(write=False) as conn:
            return _ROWS.of_ids(conn, ids)


# -- the JSON columns ------------------------------------------------------------------------------


def encode_nodes(nodes: tuple[DrillNode, ...]) -> str:
    return dumps(
        [
            {
                "name": n.name,
                "host_id": n.host_id,
                "purpose_id": n.purpose_id,
                "step": n.step.value,
                "verdict": n.verdict.value,
                "proof": list(n.proof),
                "problems": list(n.problems),
                "teardown": list(n.teardown),
                "step_seconds": [[step, seconds] for step, seconds in n.step_seconds],
                "bytes_verified": n.bytes_verified,
                "row_counts": [[table, rows] for table, rows in n.row_counts],
            }
            for n in nodes
        ]
    )


def encode_clones(nodes: tuple[DrillNode, ...]) -> str:
    return dumps(
        [
            {
                "node": n.name,
                "array": c.array,
                "source": c.source,
                "name": c.name,
                "id": c.id,
                "role": c.role,
                "wwn": c.wwn,
                "deleted": c.deleted,
            }
            for n in nodes
            for c in n.clones
        ]
    )


def _count(fields: dict[str, Any], key: str, what: str) -> int:
    value = fields.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CodecError(f"{what}: {key} is not a count")
    return value


def _timings(fields: dict[str, Any], what: str) -> tuple[tuple[str, float], ...]:
    value = fields.get("step_seconds", [])
    pairs: list[tuple[str, float]] = []
    if not isinstance(value, list):
        raise CodecError(f"{what}: step_seconds is not a list")
    for pair in value:
        if (
            not isinstance(pair, list)
            or len(pair) != 2
            or not isinstance(pair[0], str)
            or isinstance(pair[1], bool)
            or not isinstance(pair[1], int | float)
        ):
            raise CodecError(f"{what}: step_seconds holds {pair!r}, not a [step, seconds] pair")
        pairs.append((pair[0], float(pair[1])))
    return tuple(pairs)


def _row_counts(fields: dict[str, Any], what: str) -> tuple[tuple[str, int], ...]:
    """[["keyspace.table", rows], ...]; absent in drills recorded before counts were kept."""
    value = fields.get("row_counts", [])
    if not isinstance(value, list):
        raise CodecError(f"{what}: row_counts is not a list")
    counts: list[tuple[str, int]] = []
    for entry in value:
        if (
            not isinstance(entry, list)
            or len(entry) != 2
            or not isinstance(entry[0], str)
            or not isinstance(entry[1], int)
            or isinstance(entry[1], bool)
            or entry[1] < 0
        ):
            raise CodecError(f'{what}: row count {entry!r} is not ["keyspace.table", rows]')
        counts.append((entry[0], entry[1]))
    return tuple(counts)


def _enum(kind: type[T], fields: dict[str, Any], key: str, what: str) -> T:
    value = fields.get(key)
    try:
        return kind(value)  # type: ignore[call-arg]
    except ValueError:
        raise CodecError(f"{what}: {key} {value!r} is not a known value") from None


def decode_nodes(stored: object) -> tuple[DrillNode, ...]:
    nodes: list[DrillNode] = []
    for index, value in enumerate(load_list(stored)):
        fields = json_object(value, f"node #{index + 1}")
        name = text(fields, "name", f"node #{index + 1}", required=True)
        what = f"node {name}"
        nodes.append(
            DrillNode(
                name=name,
                host_id=text(fields, "host_id", what),
                purpose_id=text(fields, "purpose_id", what),
                step=_enum(DrillStep, fields, "step", what),
                verdict=_enum(DrillVerdict, fields, "verdict", what),
                proof=texts(fields, "proof", what),
                problems=texts(fields, "problems", what),
                teardown=texts(fields, "teardown", what),
                step_seconds=_timings(fields, what),
                bytes_verified=_count(fields, "bytes_verified", what),
                row_counts=_row_counts(fields, what),
            )
        )
    if len({n.name for n in nodes}) != len(nodes):
        raise CodecError("a node is listed twice")
    return tuple(nodes)


def decode_clones(stored: object) -> tuple[tuple[str, DrillClone], ...]:
    """(node, clone) pairs."""
    clones: list[tuple[str, DrillClone]] = []
    for index, value in enumerate(load_list(stored)):
        what = f"clone #{index + 1}"
        fields = json_object(value, what)
        deleted = fields.get("deleted", False)
        if not isinstance(deleted, bool):
            raise CodecError(f"{what}: deleted is not true or false")
        clone = DrillClone(
            array=text(fields, "array", what, required=True),
            source=text(fields, "source", what, required=True),
            name=text(fields, "name", what, required=True),
            id=text(fields, "id", what),
            role=text(fields, "role", what),
            wwn=text(fields, "wwn", what),
            deleted=deleted,
        )
        clones.append((text(fields, "node", what, required=True), clone))
    return tuple(clones)


def _record(row: sqlite3.Row) -> DrillRecord:
    columns = JsonColumns(row)
    problems = columns.problems
    nodes = columns.read("nodes", decode_nodes)
    clones = columns.read("clones", decode_clones)
    warnings = columns.read("warnings", decode_sentences)
    by_node: dict[str, list[DrillClone]] = {}
    for node_name, clone in clones:
        by_node.setdefault(node_name, []).append(clone)
    known = {n.name for n in nodes}
    for node_name in sorted(set(by_node) - known):
        problems.append(f"clones recorded for node {node_name}, which the drill does not list")
    return DrillRecord(
        id=row["id"],
        cluster=row["cluster"],
        backup_id=row["backup_id"],
        trigger=row["trigger"],
        requested_by=row["requested_by"],
        started_at=from_us(row["started_us"]) or EPOCH,
        state=DrillState(row["state"]),
        finished_at=from_us(row["finished_us"]),
        error=row["error"],
        nodes=tuple(replace(n, clones=tuple(by_node.get(n.name, ()))) for n in nodes),
        warnings=(*warnings, *problems),
    )


_ROWS = RecordRows("drills", "drill", _FIELDS, _record, DrillNotFoundError)
