"""Snapshots that must still be deleted from an array (`pending_cleanups`): they stay until the array
confirms the deletion, so that no snapshot is ever forgotten. A failed or deleted backup's snapshots
move here in the same transaction that changes the backup (`insert`)."""

# S608: every query is assembled from constant fragments and "?" placeholders; values are bound.
# ruff: noqa: S608

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from ringsnap.coordinator.catalog import codec
from ringsnap.coordinator.catalog.columns import EPOCH, from_us, now, placeholders, to_us, utc
from ringsnap.coordinator.catalog.database import Database
from ringsnap.coordinator.catalog.errors import CatalogError
from ringsnap.coordinator.model import CleanupRequest, PendingCleanup
from ringsnap.logs import get_logger

log = get_logger(__name__)


def insert(conn: sqlite3.Connection, backup_id: str, request: CleanupRequest, at: datetime) -> int:
    """Record one snapshot to delete (merged with a cleanup of the same snapshot); its id."""
    ref = request.ref
    name = ref.snapshot_name if ref is not None else request.snapshot_name
    row = conn.execute(
        "INSERT INTO pending_cleanups"
        " (backup_id, array, snapshot_name, ref, reason, created_us) VALUES (?, ?, ?, ?, ?, ?)"
        " ON CONFLICT (array, snapshot_name)"
        " DO UPDATE SET ref = coalesce(excluded.ref, pending_cleanups.ref)"
        " RETURNING id",
        (
            backup_id,
            request.array,
            name,
            codec.encode_ref(ref) if ref is not None else None,
            request.reason,
            to_us(at),
        ),
    ).fetchone()
    log.warning(
        "snapshot recorded for cleanup",
        backup_id=backup_id,
        array=request.array,
        snapshot=name,
        reason=request.reason,
    )
    return int(row[0])


def select(conn: sqlite3.Connection, where: str, params: Sequence[Any]) -> list[PendingCleanup]:
    return [
        PendingCleanup(
            id=row["id"],
            backup_id=row["backup_id"],
            array=row["array"],
            reason=row["reason"],
            ref=codec.decode_ref(row["ref"]) if row["ref"] is not None else None,
            snapshot_name=row["snapshot_name"],
            created_at=from_us(row["created_us"]) or EPOCH,
            attempts=row["attempts"],
            last_error=row["last_error"],
            last_attempt_at=from_us(row["last_attempt_us"]),
        )
        for row in conn.execute(
            "SELECT id, backup_id, array, snapshot_name, ref, reason, created_us, attempts,"
            f" last_error, last_attempt_us FROM pending_cleanups {where} ORDER BY id",
            params,
        )
    ]


def by_ids(conn: sqlite3.Connection, ids: Sequence[int]) -> list[PendingCleanup]:
    if not ids:
        return []
    return select(conn, f"WHERE id IN ({placeholders(len(ids))})", ids)


class CleanupStore(Database):
    def add_cleanups(
        self, backup_id: str, requests: Sequence[CleanupRequest]
    ) -> list[PendingCleanup]:
        """Record snapshots that must still be deleted (the backup's row need not exist)."""
        at = now()
        with self._tx(write=True) as conn:
            return by_ids(conn, [insert(conn, backup_id, request, at) for request in requests])

    def pending_cleanups(self, array: str | None = None) -> list[PendingCleanup]:
        """Snapshots still to delete, oldest first (of one array, if given)."""
        with self._tx(write=False) as conn:
            if array is None:
                return select(conn, "", ())
            return select(conn, "WHERE array = ?", (array,))

    def cleanup_failed(self, cleanup_id: int, error: str, *, at: datetime | None = None) -> None:
        moment = utc(at) if at is not None else now()
        with self._tx(write=True) as conn:
            updated = conn.execute(
                "UPDATE pending_cleanups SET attempts = attempts + 1, last_error = ?,"
                " last_attempt_us = ? WHERE id = ?",
                (error, to_us(moment), cleanup_id),
            ).rowcount
        if not updated:
            raise CatalogError(f"no pending cleanup {cleanup_id}")

    def cleanup_done(self, cleanup_id: int) -> None:
        """The array confirmed the snapshot is gone."""
        with self._tx(write=True) as conn:
            row = conn.execute(
                "DELETE FROM pending_cleanups WHERE id = ? RETURNING backup_id, array, snapshot_name",
                (cleanup_id,),
            ).fetchone()
        if row is None:
            raise CatalogError(f"no pending cleanup {cleanup_id}")
        log.info(
            "snapshot cleaned up",
            backup_id=row["backup_id"],
            array=row["array"],
            snapshot=row["snapshot_name"],
        )
