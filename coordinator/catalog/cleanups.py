"""Backups' array snapshots left to delete: the resource ledger's 'snapshot' entries (catalog
migration 14 moved the old pending cleanups there). A backup run records each before the array is
asked; a failed or deleted backup's snapshots join them in the same transaction that changes the
backup (`leave_snapshot`); a completed backup takes its own (`accepted`). `pending_cleanups` is
their view as the status, the metrics and the deletion report read it."""

# S608: every query is assembled from constant fragments and "?" placeholders; values are bound.
# ruff: noqa: S608

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime

from ringsnap.coordinator.catalog import codec
from ringsnap.coordinator.catalog.columns import EPOCH, from_us, placeholders
from ringsnap.coordinator.catalog.database import Database
from ringsnap.coordinator.catalog.runs import insert_resource
from ringsnap.coordinator.model import CleanupRequest, PendingCleanup
from ringsnap.coordinator.runs.resources import array_snapshot
from ringsnap.logs import get_logger

log = get_logger(__name__)

_SNAPSHOTS = "SELECT * FROM resources WHERE type = 'snapshot'"


def leave_snapshot(
    conn: sqlite3.Connection, cluster: str, backup_id: str, request: CleanupRequest, at: datetime
) -> int:
    """Keep one snapshot of `backup_id` to delete, in the caller's transaction: the run's entry
    for that array and name gains the reference (its first reason stays), or a new entry is made.
    Its id."""
    ref = request.ref
    name = ref.snapshot_name if ref is not None else request.snapshot_name
    row = conn.execute(
        f"{_SNAPSHOTS} AND run_id = ? AND array = ? AND name = ? ORDER BY id",
        (backup_id, request.array, name),
    ).fetchone()
    if row is not None:
        if ref is not None:
            conn.execute(
                "UPDATE resources SET ref = ? WHERE id = ?", (codec.encode_ref(ref), row["id"])
            )
        return int(row["id"])
    snapshot = array_snapshot(cluster, request.array, backup_id, request.reason, ref=ref)
    entry = insert_resource(conn, replace(snapshot, name=name), at)
    log.warning(
        "snapshot recorded for cleanup",
        backup_id=backup_id,
        array=request.array,
        snapshot=name,
        reason=request.reason,
    )
    return entry.id


def accepted(conn: sqlite3.Connection, backup_id: str, arrays: Sequence[str]) -> None:
    """A completed backup took its snapshots on `arrays`: their entries are no cleanups."""
    if arrays:
        conn.execute(
            "DELETE FROM resources WHERE type = 'snapshot' AND run_id = ?"
            f" AND array IN ({placeholders(len(arrays))})",
            (backup_id, *arrays),
        )


def select(conn: sqlite3.Connection, where: str, params: Sequence[object]) -> list[PendingCleanup]:
    return [
        PendingCleanup(
            id=row["id"],
            backup_id=row["run_id"],
            array=row["array"],
            reason=row["reason"],
            ref=codec.decode_ref(row["ref"]) if row["ref"] else None,
            snapshot_name=row["name"],
            created_at=from_us(row["created_us"]) or EPOCH,
            attempts=row["attempts"],
            last_error=row["last_error"],
            last_attempt_at=from_us(row["last_attempt_us"]),
        )
        for row in conn.execute(f"{_SNAPSHOTS} {where} ORDER BY id", params)
    ]


def by_ids(conn: sqlite3.Connection, ids: Sequence[int]) -> list[PendingCleanup]:
    if not ids:
        return []
    return select(conn, f"AND id IN ({placeholders(len(ids))})", ids)


class CleanupStore(Database):
    def pending_cleanups(self, array: str | None = None) -> list[PendingCleanup]:
        """Snapshots still to delete, oldest first (of one array, if given)."""
        with self._tx(write=False) as conn:
            if array is None:
                return select(conn, "", ())
            return select(conn, "AND array = ?", (array,))
