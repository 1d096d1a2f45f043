"""The run engine's journal and resource ledger (`coordinator/runs`): each run's record as one
JSON document saved after every change, runs found running at open marked interrupted (their
process died with them: this one owns the catalog), and the typed ledger of what runs made."""

# S608: every query is assembled from constant fragments and "?" placeholders; values are bound.
# ruff: noqa: S608

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from datetime import datetime

from ringsnap.coordinator.catalog import codec
from ringsnap.coordinator.catalog.columns import EPOCH, from_us, now, to_us, utc
from ringsnap.coordinator.catalog.database import Database
from ringsnap.coordinator.catalog.errors import CatalogError
from ringsnap.coordinator.runs.resources import LedgerEntry, Resource, ResourceType
from ringsnap.logs import get_logger
from ringsnap.plugins.types import SnapshotRef

log = get_logger(__name__)

#: The catalog migration that made the runs and resources tables.
_RUNS_VERSION = 10
_COLUMNS = (
    "type, cluster, run_id, run_kind, reason, array, name, volume_id, name_hint, node,"
    " mount_purpose, host, drill_host, ref"
)


def _entry(row: sqlite3.Row) -> LedgerEntry:
    return LedgerEntry(
        id=row["id"],
        resource=Resource(
            type=ResourceType(row["type"]),
            cluster=row["cluster"],
            run_id=row["run_id"],
            run_kind=row["run_kind"],
            reason=row["reason"],
            array=row["array"],
            name=row["name"],
            volume_id=row["volume_id"],
            name_hint=row["name_hint"],
            node=row["node"],
            mount_purpose=row["mount_purpose"],
            host=row["host"],
            drill_host=bool(row["drill_host"]),
            ref=codec.decode_ref(row["ref"]) if row["ref"] else None,
        ),
        created_at=from_us(row["created_us"]) or EPOCH,
        attempts=row["attempts"],
        last_error=row["last_error"],
        last_attempt_at=from_us(row["last_attempt_us"]),
    )


def insert_resource(conn: sqlite3.Connection, resource: Resource, at: datetime) -> LedgerEntry:
    """One ledger entry, in the caller's transaction (a failed or deleted backup's native tags go
    in with the change of the backup)."""
    values = (
        resource.type.value,
        resource.cluster,
        resource.run_id,
        resource.run_kind,
        resource.reason,
        resource.array,
        resource.name,
        resource.volume_id,
        resource.name_hint,
        resource.node,
        resource.mount_purpose,
        resource.host,
        int(resource.drill_host),
        codec.encode_ref(resource.ref) if resource.ref is not None else "",
        to_us(at),
    )
    try:
        row = conn.execute(
            f"INSERT INTO resources ({_COLUMNS}, created_us)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING *",
            values,
        ).fetchone()
    except sqlite3.IntegrityError as exc:
        raise CatalogError(f"ledger entry refused ({exc}): {resource}") from None
    return _entry(row)


class RunStore(Database):
    _runs_interrupted_at_open: frozenset[str] = frozenset()

    def _opened(self, conn: sqlite3.Connection) -> None:
        super()._opened(conn)
        if not self._exclusive or self.schema_version < _RUNS_VERSION:
            return
        found = conn.execute(
            "UPDATE runs SET state = 'interrupted', updated_us = ?,"
            " document = json_set(document, '$.state', 'interrupted')"
            " WHERE state = 'running' RETURNING id",
            (to_us(now()),),
        ).fetchall()
        self._runs_interrupted_at_open = frozenset(row["id"] for row in found)
        if found:
            log.warning(
                "runs interrupted by a previous coordinator",
                run_ids=sorted(self._runs_interrupted_at_open),
            )

    # -- the journal -----------------------------------------------------------------------------

    def save_run_document(
        self, run_id: str, kind: str, cluster: str, state: str, document: str
    ) -> None:
        """Insert the run's record or replace it (same kind and cluster only)."""
        with self._tx(write=True) as conn:
            saved = conn.execute(
                "INSERT INTO runs (id, kind, cluster, state, updated_us, document)"
                " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET"
                " state = excluded.state, updated_us = excluded.updated_us,"
                " document = excluded.document"
                " WHERE runs.kind = excluded.kind AND runs.cluster = excluded.cluster"
                " RETURNING id",
                (run_id, kind, cluster, state, to_us(now()), document),
            ).fetchone()
        if saved is None:
            raise CatalogError(
                f"run id {run_id} is already used by a run of another kind or cluster; refused"
            )

    def find_run_document(self, run_id: str) -> str | None:
        with self._tx(write=False) as conn:
            row = conn.execute("SELECT document FROM runs WHERE id = ?", (run_id,)).fetchone()
        return None if row is None else str(row["document"])

    def interrupted_runs(self) -> list[str]:
        """Ids of the runs found running when this catalog was opened (and still interrupted)."""
        self._require_owner("interrupted runs")
        ids = sorted(self._runs_interrupted_at_open)
        if not ids:
            return []
        with self._tx(write=False) as conn:
            marks = ", ".join("?" * len(ids))
            rows = conn.execute(
                f"SELECT id FROM runs WHERE state = 'interrupted' AND id IN ({marks}) ORDER BY id",
                ids,
            ).fetchall()
        return [row["id"] for row in rows]

    # -- the resource ledger ---------------------------------------------------------------------

    def add_resource(self, resource: Resource, *, at: datetime | None = None) -> LedgerEntry:
        """Record a resource before it is made (its name may come later: `resource_made`)."""
        with self._tx(write=True) as conn:
            entry = insert_resource(conn, resource, utc(at) if at is not None else now())
        log.info("resource recorded", resource=resource.describe())
        return entry

    def resource_made(self, entry_id: int, name: str, volume_id: str = "") -> None:
        """The array answered: the resource's name (and id)."""
        if not name:
            raise CatalogError(f"ledger entry {entry_id}: a made resource needs its name")
        self._update(entry_id, "name = ?, volume_id = ?", (name, volume_id))

    def snapshot_made(self, entry_id: int, ref: SnapshotRef) -> None:
        """The array answered a snapshot call: its reference (deleted by it from now on)."""
        self._update(
            entry_id,
            "name = ?, ref = ?",
            (ref.snapshot_name, codec.encode_ref(ref)),
            "type = 'snapshot' AND array = ?",
            (ref.array,),
        )

    def resource_host(self, entry_id: int, host: str) -> None:
        """A mapping was made: the array's host object it names."""
        self._update(entry_id, "host = ?", (host,))

    def resource_failed(self, entry_id: int, error: str, *, at: datetime | None = None) -> None:
        moment = utc(at) if at is not None else now()
        self._update(
            entry_id,
            "attempts = attempts + 1, last_error = ?, last_attempt_us = ?",
            (error, to_us(moment)),
        )

    def resource_gone(self, entry_id: int) -> None:
        """Its undo was confirmed (deleted on the array, cleared on the node)."""
        with self._tx(write=True) as conn:
            row = conn.execute(
                "DELETE FROM resources WHERE id = ? RETURNING *", (entry_id,)
            ).fetchone()
        if row is None:
            raise CatalogError(f"no ledger entry {entry_id}")
        log.info("resource undone", resource=_entry(row).resource.describe())

    def resources(self, run_id: str | None = None) -> list[LedgerEntry]:
        """The ledger (of one run, if given), oldest first."""
        where, params = ("WHERE run_id = ?", (run_id,)) if run_id is not None else ("", ())
        with self._tx(write=False) as conn:
            rows = conn.execute(f"SELECT * FROM resources {where} ORDER BY id", params)
            return [_entry(row) for row in rows.fetchall()]

    def _update(
        self,
        entry_id: int,
        assignments: str,
        params: Sequence[object],
        where: str = "1",
        where_params: Sequence[object] = (),
    ) -> None:
        with self._tx(write=True) as conn:
            updated = conn.execute(
                f"UPDATE resources SET {assignments} WHERE id = ? AND {where}",
                (*params, entry_id, *where_params),
            ).rowcount
        if not updated:
            raise CatalogError(f"no ledger entry {entry_id} (of that type and array)")
