"""The life of a backup in the catalog: begun as running, its plan, snapshots and timings recorded,
then complete (or partial) only when nothing is missing, or failed; later verified by a restore or
drill, lost when a restore destroyed its snapshots, or deleted. Snapshots of a failed or deleted
backup become the resource ledger's snapshot entries in the same transaction."""

# S608: every query is assembled from constant fragments and "?" placeholders; values are bound.
# ruff: noqa: S608

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

from ringsnap import names
from ringsnap.coordinator.catalog import backup_rows, codec, completeness
from ringsnap.coordinator.catalog import cleanups as cleanup_rows
from ringsnap.coordinator.catalog.backup_rows import COLUMNS
from ringsnap.coordinator.catalog.columns import now, placeholders, to_us, utc
from ringsnap.coordinator.catalog.database import Database
from ringsnap.coordinator.catalog.errors import BackupStateError, IncompleteBackupError
from ringsnap.coordinator.catalog.runs import insert_resource
from ringsnap.coordinator.model import (
    Backup,
    BackupNode,
    BackupState,
    CleanupRequest,
    FreezeWindow,
    PendingCleanup,
    PhaseTiming,
    QuiesceMode,
    SnapshotKind,
    Verification,
    native_tags,
)
from ringsnap.coordinator.runs.resources import Resource
from ringsnap.logs import get_logger
from ringsnap.plugins.types import SnapshotRef

log = get_logger(__name__)

Timings = Mapping[str, float] | Iterable[PhaseTiming]


class BackupStore(Database):
    _running_at_open: frozenset[int] = frozenset()

    def _opened(self, conn: sqlite3.Connection) -> None:
        super()._opened(conn)
        self._running_at_open = frozenset(
            row["pk"] for row in conn.execute("SELECT pk FROM backups WHERE state = 'running'")
        )

    def begin_backup(
        self,
        *,
        backup_id: str,
        cluster: str,
        quiesce_mode: QuiesceMode,
        trigger: str,
        policy: str = "",
        started_at: datetime | None = None,
        nodes: Sequence[BackupNode] = (),
        snapshot_kind: SnapshotKind = SnapshotKind.ARRAY,
    ) -> Backup:
        """Record a new backup as running. `nodes` may come now or later (`record_nodes`)."""
        names.backup_id(backup_id)
        if not cluster:
            raise ValueError("a backup needs its cluster's name")
        if not trigger:
            raise ValueError("a backup needs a trigger (who or what asked for it)")
        started = utc(started_at) if started_at is not None else now()
        with self._tx(write=True) as conn:
            # Snapshots are named after their backup: reusing the id of a backup whose snapshot
            # still waits for deletion would let that cleanup delete the new backup's snapshot.
            pending = conn.execute(
                "SELECT array FROM resources WHERE type = 'snapshot' AND (name = ? OR run_id = ?)",
                (backup_id, backup_id),
            ).fetchall()
            if pending:
                raise BackupStateError(
                    f"backup id {backup_id} is still used by snapshots pending deletion on"
                    f" {', '.join(sorted({r['array'] for r in pending}))}; choose another id"
                )
            try:
                pk = conn.execute(
                    "INSERT INTO backups (id, cluster, state, quiesce_mode, trigger, policy,"
                    " started_us, snapshot_kind) VALUES (?, ?, 'running', ?, ?, ?, ?, ?)"
                    " RETURNING pk",
                    (
                        backup_id,
                        cluster,
                        QuiesceMode(quiesce_mode).value,
                        trigger,
                        policy,
                        to_us(started),
                        SnapshotKind(snapshot_kind).value,
                    ),
                ).fetchone()[0]
            except sqlite3.IntegrityError:
                raise BackupStateError(
                    f"backup {backup_id} already exists in the catalog"
                ) from None
            _upsert_nodes(conn, pk, nodes)
            backup = backup_rows.get(conn, backup_id)
        log.info("backup begun", backup_id=backup_id, cluster=cluster, trigger=trigger)
        return backup

    def record_nodes(self, backup_id: str, nodes: Sequence[BackupNode]) -> None:
        """Add or update nodes of a running backup (plan, host ids, canary ids, exclusions).

        `sstable_count` and `bytes` are ignored here: they come from the recorded manifest.
        """
        with self._tx(write=True) as conn:
            pk = backup_rows.find_running(conn, backup_id, "record nodes")
            _upsert_nodes(conn, pk, nodes)

    def record_snapshot(self, backup_id: str, ref: SnapshotRef) -> None:
        """Record the group snapshot taken on `ref.array` for a running backup.

        The array must hold volumes of the backup's included nodes. A second, different snapshot of
        the same array is refused: it would be an orphan (record it as a cleanup instead).
        """
        encoded = codec.encode_ref(ref)
        with self._tx(write=True) as conn:
            pk = backup_rows.find_running(conn, backup_id, "record a snapshot")
            planned = {
                volume.array
                for row in conn.execute(
                    "SELECT volumes FROM backup_nodes WHERE backup = ? AND excluded_reason = ''",
                    (pk,),
                )
                for volume in codec.decode_volumes(row["volumes"])
            }
            if ref.array not in planned:
                raise BackupStateError(
                    f"backup {backup_id}: array {ref.array!r} holds no volume of an included node"
                    f" (planned arrays: {', '.join(sorted(planned)) or 'none; record the nodes first'})"
                )
            existing = conn.execute(
                "SELECT ref FROM snapshots WHERE backup = ? AND array = ?", (pk, ref.array)
            ).fetchone()
            if existing is not None:
                if existing["ref"] == encoded:
                    return
                raise BackupStateError(
                    f"backup {backup_id}: a snapshot of array {ref.array} is already recorded"
                    f" ({codec.decode_ref(existing['ref']).snapshot_name}); a second one would be"
                    " orphaned: delete it or record it as a cleanup"
                )
            conn.execute(
                "INSERT INTO snapshots (backup, array, ref) VALUES (?, ?, ?)",
                (pk, ref.array, encoded),
            )

    def complete_backup(
        self,
        backup_id: str,
        *,
        finished_at: datetime | None = None,
        timings: Timings | None = None,
        freeze_window: FreezeWindow | None = None,
        warnings: Sequence[str] = (),
    ) -> Backup:
        """Mark a running backup complete (or partial, if nodes were excluded with a reason).

        Raises IncompleteBackupError, listing everything missing, unless every included node has a
        manifest and volumes, and every array of the plan a snapshot that covers those volumes.
        """
        finished = utc(finished_at) if finished_at is not None else now()
        with self._tx(write=True) as conn:
            pk = backup_rows.find_running(conn, backup_id, "complete it")
            _write_timings(conn, pk, timings, freeze_window)
            backup = backup_rows.get_pk(conn, pk)
            manifests = {
                row["node"]
                for row in conn.execute("SELECT node FROM manifests WHERE backup = ?", (pk,))
            }
            missing = completeness.missing_parts(backup, manifests)
            if missing:
                raise IncompleteBackupError(backup_id, missing)
            state = completeness.finished_state(backup)
            cleanup_rows.accepted(conn, backup_id, [ref.array for ref in backup.snapshots])
            conn.execute(
                "UPDATE backups SET state = ?, finished_us = ?, warnings = ? WHERE pk = ?",
                (state.value, to_us(finished), json.dumps(list(warnings)), pk),
            )
            backup = backup_rows.get_pk(conn, pk)
        log.info("backup recorded", backup_id=backup_id, state=state.value)
        return backup

    def fail_backup(
        self,
        backup_id: str,
        error: str,
        *,
        cleanups: Sequence[CleanupRequest] = (),
        native_tags: Sequence[Resource] = (),
        finished_at: datetime | None = None,
        timings: Timings | None = None,
        freeze_window: FreezeWindow | None = None,
        warnings: Sequence[str] = (),
    ) -> Backup:
        """Mark a running backup failed with `error`.

        In the same transaction, every snapshot recorded for it, and `cleanups` (snapshots the run
        made but could not delete, or only knows by name), are the ledger's snapshot entries to
        delete (joined with the entries the run made before asking each array), and its
        `native_tags` (native snapshots it may have taken) go in the ledger too.
        """
        if not error:
            raise ValueError("a failed backup needs its error")
        finished = utc(finished_at) if finished_at is not None else now()
        with self._tx(write=True) as conn:
            pk = backup_rows.find_running(conn, backup_id, "fail it")
            _write_timings(conn, pk, timings, freeze_window)
            reason = f"backup {backup_id} failed: {error}"
            moved = [
                CleanupRequest(array=row["array"], reason=reason, ref=codec.decode_ref(row["ref"]))
                for row in conn.execute("SELECT array, ref FROM snapshots WHERE backup = ?", (pk,))
            ]
            cluster = backup_rows.get_pk(conn, pk).cluster
            for request in [*moved, *cleanups]:
                cleanup_rows.leave_snapshot(conn, cluster, backup_id, request, finished)
            for tag in native_tags:
                insert_resource(conn, tag, finished)
            conn.execute("DELETE FROM snapshots WHERE backup = ?", (pk,))
            conn.execute(
                "UPDATE backups SET state = 'failed', finished_us = ?, error = ?, warnings = ?"
                " WHERE pk = ?",
                (to_us(finished), error, json.dumps(list(warnings)), pk),
            )
            backup = backup_rows.get_pk(conn, pk)
        log.error("backup failed", backup_id=backup_id, error=error)
        return backup

    def interrupted_backups(self) -> list[Backup]:
        """Backups that were running when this catalog was opened and still are: their runs died
        with a previous coordinator. Clean up what they left, then `fail_backup` each."""
        self._require_owner("interrupted backups")
        if not self._running_at_open:
            return []
        pks = sorted(self._running_at_open)
        with self._tx(write=False) as conn:
            rows = conn.execute(
                f"SELECT {COLUMNS} FROM backups"
                f" WHERE pk IN ({placeholders(len(pks))}) AND state = 'running'"
                " ORDER BY started_us, id",
                pks,
            ).fetchall()
            return backup_rows.load(conn, rows)

    def delete_backup(self, backup_id: str, *, reason: str) -> list[PendingCleanup]:
        """Remove a finished backup from the catalog.

        Its snapshots become ledger entries in the same transaction and are returned: the caller
        deletes them from the arrays and removes the entries (a crash in between leaves them in
        the ledger, never forgotten). A native backup's snapshot is one tag per included node: each
        goes in the resource ledger (`runs.resources.native_tag`), retried by its one path.
        """
        if not reason:
            raise ValueError("say why the backup is deleted (e.g. 'retention: beyond all buckets')")
        at = now()
        why = f"backup {backup_id} deleted: {reason}"
        with self._tx(write=True) as conn:
            pk, state = backup_rows.find(conn, backup_id)
            if state is BackupState.RUNNING:
                raise BackupStateError(f"backup {backup_id} is still running; it cannot be deleted")
            requests = [
                CleanupRequest(array=row["array"], reason=why, ref=codec.decode_ref(row["ref"]))
                for row in conn.execute("SELECT array, ref FROM snapshots WHERE backup = ?", (pk,))
            ]
            backup = backup_rows.get_pk(conn, pk)
            if backup.snapshot_kind is SnapshotKind.NATIVE:
                for tag in native_tags(backup, why):
                    insert_resource(conn, tag, at)
            ids = [
                cleanup_rows.leave_snapshot(conn, backup.cluster, backup_id, request, at)
                for request in requests
            ]
            conn.execute("DELETE FROM backups WHERE pk = ?", (pk,))
            pending = cleanup_rows.by_ids(conn, ids)
        log.info(
            "backup deleted from catalog", backup_id=backup_id, reason=reason, snapshots=len(ids)
        )
        return pending

    def mark_verified(
        self,
        backup_id: str,
        result: Verification,
        detail: str = "",
        *,
        by: str,
        at: datetime | None = None,
    ) -> Backup:
        """Record what the restore or drill `by` (its id) proved about a complete or partial backup."""
        if not by:
            raise ValueError("say which restore or drill verified the backup (its id)")
        moment = utc(at) if at is not None else now()
        with self._tx(write=True) as conn:
            pk, state = backup_rows.find(conn, backup_id)
            if not state.usable:
                raise BackupStateError(
                    f"backup {backup_id} is {state}; only finished backups are verified"
                )
            conn.execute(
                "UPDATE backups SET verification = ?, verified_us = ?, verification_detail = ?,"
                " verified_by = ? WHERE pk = ?",
                (Verification(result).value, to_us(moment), detail, by, pk),
            )
            return backup_rows.get_pk(conn, pk)

    def mark_snapshots_lost(
        self, backup_ids: Sequence[str], reason: str, *, at: datetime | None = None
    ) -> None:
        """Record that the snapshots of these backups are gone (e.g. a revert restore destroyed
        every snapshot newer than the one it restored): they are no longer restorable, and
        retention no longer counts them. `reason` names the restore that destroyed them.

        Meant for after the fact, so it never refuses over a backup: one already lost keeps its
        first reason, one no longer in the catalog is skipped (and logged).
        """
        if not reason:
            raise ValueError("say why the snapshots are gone (e.g. which restore destroyed them)")
        moment = utc(at) if at is not None else now()
        marked: list[str] = []
        unknown: list[str] = []
        with self._tx(write=True) as conn:
            for backup_id in dict.fromkeys(backup_ids):
                updated = conn.execute(
                    "UPDATE backups SET lost_reason = ?, lost_us = ?"
                    " WHERE id = ? AND lost_reason = '' RETURNING pk",
                    (reason, to_us(moment), backup_id),
                ).fetchone()
                if updated is not None:
                    marked.append(backup_id)
                elif conn.execute("SELECT 1 FROM backups WHERE id = ?", (backup_id,)).fetchone():
                    continue  # lost before: the first reason stays
                else:
                    unknown.append(backup_id)
        if marked:
            log.warning("backups lost their snapshots", backup_ids=marked, reason=reason)
        if unknown:
            log.warning("lost snapshots of backups not in the catalog", backup_ids=unknown)


def _upsert_nodes(conn: sqlite3.Connection, pk: int, nodes: Sequence[BackupNode]) -> None:
    seen: set[str] = set()
    for node in nodes:
        if not node.name:
            raise ValueError("a backup node needs a name")
        if node.name in seen:
            raise ValueError(f"node {node.name!r} is listed twice")
        seen.add(node.name)
        for volume in node.volumes:
            if not volume.array or not volume.volume:
                raise ValueError(f"node {node.name!r}: a volume needs an array and a name")
    conn.executemany(
        "INSERT INTO backup_nodes (backup, name, host_id, volumes, canary_id, excluded_reason)"
        " VALUES (?, ?, ?, ?, ?, ?)"
        " ON CONFLICT (backup, name) DO UPDATE SET host_id = excluded.host_id,"
        " volumes = excluded.volumes, canary_id = excluded.canary_id,"
        " excluded_reason = excluded.excluded_reason",
        [
            (pk, n.name, n.host_id, codec.encode_volumes(n.volumes), n.canary_id, n.excluded_reason)
            for n in nodes
        ],
    )


def _write_timings(
    conn: sqlite3.Connection,
    pk: int,
    timings: Timings | None,
    window: FreezeWindow | None,
) -> None:
    """Replace the phase timings (in run order) and set the freeze window."""
    if timings is not None:
        if isinstance(timings, Mapping):
            pairs = [(phase, float(seconds)) for phase, seconds in timings.items()]
        else:
            pairs = [(t.phase, float(t.seconds)) for t in timings]
        conn.execute("DELETE FROM phase_timings WHERE backup = ?", (pk,))
        conn.executemany(
            "INSERT INTO phase_timings (backup, ord, phase, seconds) VALUES (?, ?, ?, ?)",
            [(pk, ord_, phase, seconds) for ord_, (phase, seconds) in enumerate(pairs)],
        )
    if window is not None:
        conn.execute(
            "UPDATE backups SET freeze_total = ?, freeze_slowest = ?, freeze_array_call = ?,"
            " freeze_slowest_thaw = ? WHERE pk = ?",
            (window.total, window.slowest_freeze, window.array_call, window.slowest_thaw, pk),
        )
