"""Backups as rows: the columns of `backups` and how they, with their nodes, snapshots and timings,
become `BackupSummary` and `Backup` values. Functions over an open connection (in a transaction)."""

# S608: every query is assembled from constant fragments and "?" placeholders; values are bound.
# ruff: noqa: S608

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from ringsnap.coordinator.catalog import codec
from ringsnap.coordinator.catalog.columns import from_us, placeholders, sentences
from ringsnap.coordinator.catalog.errors import (
    BackupNotFoundError,
    BackupStateError,
    DamagedRowError,
)
from ringsnap.coordinator.model import (
    Backup,
    BackupNode,
    BackupState,
    BackupSummary,
    FreezeWindow,
    PhaseTiming,
    QuiesceMode,
    SnapshotKind,
    Verification,
)
from ringsnap.plugins.types import SnapshotRef

COLUMNS = (
    "pk, id, cluster, state, quiesce_mode, trigger, policy, started_us, finished_us, error,"
    " verification, verified_us, verification_detail, verified_by, freeze_total, freeze_slowest,"
    " freeze_array_call, freeze_slowest_thaw, warnings, lost_reason, lost_us, snapshot_kind"
)


def summary(row: sqlite3.Row) -> BackupSummary:
    return BackupSummary(**_summary_fields(row))


#: What decoding a row changed outside ringsnap raises (a CodecError is a ValueError).
_DAMAGE = (ValueError, TypeError, OverflowError, KeyError, AttributeError, AssertionError)


def _summary_fields(row: sqlite3.Row) -> dict[str, Any]:
    try:
        return _decoded_summary_fields(row)
    except _DAMAGE as exc:
        raise DamagedRowError(str(row["id"]), "backups", exc) from exc


def _seconds(row: sqlite3.Row, column: str) -> float:
    value = row[column]
    # A duration the API can carry: a protobuf Duration holds at most about 10,000 years.
    if not isinstance(value, int | float) or not 0 <= value < 3e11:
        raise ValueError(f"{column} = {value!r} is not a duration in seconds")
    return float(value)


def _decoded_summary_fields(row: sqlite3.Row) -> dict[str, Any]:
    window = None
    if row["freeze_total"] is not None:
        window = FreezeWindow(
            total=_seconds(row, "freeze_total"),
            slowest_freeze=_seconds(row, "freeze_slowest"),
            array_call=_seconds(row, "freeze_array_call"),
            slowest_thaw=_seconds(row, "freeze_slowest_thaw"),
        )
    started = from_us(row["started_us"])
    assert started is not None
    return {
        "id": row["id"],
        "cluster": row["cluster"],
        "state": BackupState(row["state"]),
        "quiesce_mode": QuiesceMode(row["quiesce_mode"]),
        "trigger": row["trigger"],
        "policy": row["policy"],
        "started_at": started,
        "finished_at": from_us(row["finished_us"]),
        "error": row["error"],
        "verification": Verification(row["verification"]),
        "verified_at": from_us(row["verified_us"]),
        "verification_detail": row["verification_detail"],
        "verified_by": row["verified_by"],
        "freeze_window": window,
        "warnings": sentences(row["warnings"]),
        "lost_reason": row["lost_reason"],
        "lost_at": from_us(row["lost_us"]),
        "snapshot_kind": SnapshotKind(row["snapshot_kind"]),
    }


def load(conn: sqlite3.Connection, rows: Sequence[sqlite3.Row]) -> list[Backup]:
    """Full backups for `rows` of `backups`, with a fixed number of queries whatever their count."""
    if not rows:
        return []
    pks = [row["pk"] for row in rows]
    ids = {row["pk"]: str(row["id"]) for row in rows}
    marks = placeholders(len(pks))
    nodes: dict[int, list[BackupNode]] = {pk: [] for pk in pks}
    for row in conn.execute(
        "SELECT backup, name, host_id, volumes, canary_id, excluded_reason, sstable_count, bytes"
        f" FROM backup_nodes WHERE backup IN ({marks}) ORDER BY backup, name",
        pks,
    ):
        try:
            volumes = codec.decode_volumes(row["volumes"])
        except _DAMAGE as exc:
            raise DamagedRowError(ids[row["backup"]], "backup_nodes.volumes", exc) from exc
        nodes[row["backup"]].append(
            BackupNode(
                name=row["name"],
                host_id=row["host_id"],
                volumes=volumes,
                canary_id=row["canary_id"],
                excluded_reason=row["excluded_reason"],
                sstable_count=row["sstable_count"],
                bytes=row["bytes"],
            )
        )
    snapshots: dict[int, list[SnapshotRef]] = {pk: [] for pk in pks}
    for row in conn.execute(
        f"SELECT backup, ref FROM snapshots WHERE backup IN ({marks}) ORDER BY backup, array",
        pks,
    ):
        try:
            snapshots[row["backup"]].append(codec.decode_ref(row["ref"]))
        except _DAMAGE as exc:
            raise DamagedRowError(ids[row["backup"]], "snapshots.ref", exc) from exc
    timings: dict[int, list[PhaseTiming]] = {pk: [] for pk in pks}
    for row in conn.execute(
        f"SELECT backup, phase, seconds FROM phase_timings WHERE backup IN ({marks})"
        " ORDER BY backup, ord",
        pks,
    ):
        try:
            seconds = _seconds(row, "seconds")
        except ValueError as exc:
            raise DamagedRowError(ids[row["backup"]], "phase_timings", exc) from exc
        timings[row["backup"]].append(PhaseTiming(phase=row["phase"], seconds=seconds))
    return [
        Backup(
            **_summary_fields(row),
            nodes=tuple(nodes[row["pk"]]),
            snapshots=tuple(snapshots[row["pk"]]),
            timings=tuple(timings[row["pk"]]),
        )
        for row in rows
    ]


def get(conn: sqlite3.Connection, backup_id: str) -> Backup:
    row = conn.execute(f"SELECT {COLUMNS} FROM backups WHERE id = ?", (backup_id,)).fetchone()
    if row is None:
        raise BackupNotFoundError(backup_id)
    return load(conn, [row])[0]


def get_pk(conn: sqlite3.Connection, pk: int) -> Backup:
    return load(
        conn, conn.execute(f"SELECT {COLUMNS} FROM backups WHERE pk = ?", (pk,)).fetchall()
    )[0]


def find(conn: sqlite3.Connection, backup_id: str) -> tuple[int, BackupState]:
    row = conn.execute("SELECT pk, state FROM backups WHERE id = ?", (backup_id,)).fetchone()
    if row is None:
        raise BackupNotFoundError(backup_id)
    return row["pk"], BackupState(row["state"])


def find_running(conn: sqlite3.Connection, backup_id: str, doing: str) -> int:
    pk, state = find(conn, backup_id)
    if state is not BackupState.RUNNING:
        raise BackupStateError(f"cannot {doing}: backup {backup_id} is {state}, not running")
    return pk
