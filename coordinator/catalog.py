"""The backup catalog: an embedded SQLite database (WAL, foreign keys, versioned schema).

What it promises:
- it never claims a backup that is not complete: `complete_backup` refuses, naming what is
  missing, unless every included node has its manifest and every array of the plan its snapshot,
  covering every volume of those nodes; a backup with excluded nodes (each with its reason) is
  recorded as `partial`, never as `complete`;
- no snapshot is forgotten: a failed or deleted backup's snapshot references move, in the same
  transaction, to `pending_cleanups`, where they stay until the array confirms the deletion;
- backups found `running` when the catalog is opened are reported by `interrupted_backups()` so that
  the coordinator cleans them up and marks them failed;
- one coordinator at a time: opening takes an exclusive lock on `<catalog>.lock`.

Every method is synchronous, thread-safe (one connection behind a lock) and meant to be called from
asyncio through `asyncio.to_thread`. Timestamps are aware datetimes, stored as UTC microseconds.
"""

# S608: every query is assembled from constant fragments and "?" placeholders; values are bound.
# ruff: noqa: S608

from __future__ import annotations

import base64
import binascii
import contextlib
import fcntl
import json
import os
import sqlite3
import threading
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any

from ringsnap import names
from ringsnap.coordinator import catalog_codec as codec
from ringsnap.coordinator import catalog_schema as schema
from ringsnap.coordinator.model import (
    Backup,
    BackupNode,
    BackupState,
    BackupSummary,
    CleanupRequest,
    FreezeWindow,
    ManifestSummary,
    OperationKind,
    OperationRecord,
    OperationState,
    PendingCleanup,
    PhaseTiming,
    QuiesceMode,
    Verification,
)
from ringsnap.coordinator.ports import SSTable
from ringsnap.errors import RingsnapError
from ringsnap.logs import get_logger
from ringsnap.plugins.types import SnapshotRef

log = get_logger(__name__)

DEFAULT_PAGE_SIZE = 100
#: Larger requests are served this many at a time (as AIP-158 suggests), keeping answers small.
MAX_PAGE_SIZE = 1000

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


class CatalogError(RingsnapError):
    """The catalog cannot do what was asked; the message says why."""


class CatalogLockedError(CatalogError):
    exit_code = 75  # EX_TEMPFAIL


class CatalogSchemaError(CatalogError):
    """The file is not a ringsnap catalog, or was written by a newer ringsnap."""


class BackupNotFoundError(CatalogError):
    exit_code = 66  # EX_NOINPUT

    def __init__(self, backup_id: str) -> None:
        self.backup_id = backup_id
        super().__init__(f"no backup {backup_id!r} in the catalog; `ringsnap list` shows them")


class OperationNotFoundError(CatalogError):
    exit_code = 66

    def __init__(self, operation_id: str) -> None:
        self.operation_id = operation_id
        super().__init__(f"no operation {operation_id!r} in the catalog")


class BackupStateError(CatalogError):
    """The backup is not in a state that allows the change."""

    exit_code = 65  # EX_DATAERR


class IncompleteBackupError(BackupStateError):
    """`complete_backup` refused: `missing` lists every part the backup lacks."""

    def __init__(self, backup_id: str, missing: Sequence[str]) -> None:
        self.backup_id = backup_id
        self.missing = tuple(missing)
        super().__init__(
            f"backup {backup_id} is not complete, refusing to record it as such: "
            + "; ".join(self.missing)
        )


class InvalidPageTokenError(CatalogError, ValueError):
    exit_code = 64  # EX_USAGE


@dataclass(frozen=True)
class BackupPage:
    backups: tuple[Backup, ...]
    #: Pass to the next `list_backups` call; empty when this was the last page.
    next_page_token: str


def _utc(moment: datetime) -> datetime:
    if moment.tzinfo is None:
        raise ValueError(f"timestamp {moment.isoformat()} has no time zone; pass an aware datetime")
    return moment.astimezone(UTC)


def _us(moment: datetime) -> int:
    return (_utc(moment) - _EPOCH) // _MICROSECOND


def _dt(us: int | None) -> datetime | None:
    return None if us is None else _EPOCH + us * _MICROSECOND


def _now() -> datetime:
    return datetime.now(UTC)


_BACKUP_COLUMNS = (
    "pk, id, cluster, state, quiesce_mode, trigger, policy, started_us, finished_us, error,"
    " verification, verified_us, verification_detail, freeze_total, freeze_slowest,"
    " freeze_array_call, freeze_slowest_thaw, warnings"
)


def _summary(row: sqlite3.Row) -> BackupSummary:
    return BackupSummary(**_summary_fields(row))


def _summary_fields(row: sqlite3.Row) -> dict[str, Any]:
    window = None
    if row["freeze_total"] is not None:
        window = FreezeWindow(
            total=row["freeze_total"],
            slowest_freeze=row["freeze_slowest"],
            array_call=row["freeze_array_call"],
            slowest_thaw=row["freeze_slowest_thaw"],
        )
    started = _dt(row["started_us"])
    assert started is not None
    return {
        "id": row["id"],
        "cluster": row["cluster"],
        "state": BackupState(row["state"]),
        "quiesce_mode": QuiesceMode(row["quiesce_mode"]),
        "trigger": row["trigger"],
        "policy": row["policy"],
        "started_at": started,
        "finished_at": _dt(row["finished_us"]),
        "error": row["error"],
        "verification": Verification(row["verification"]),
        "verified_at": _dt(row["verified_us"]),
        "verification_detail": row["verification_detail"],
        "freeze_window": window,
        "warnings": _warnings(row["warnings"]),
    }


def _warnings(stored: object) -> tuple[str, ...]:
    """The backup's warnings column: a JSON list of sentences. A value edited by hand into
    something else is shown as it is rather than failing every read of the catalog."""
    if stored is None or stored == "":
        return ()
    try:
        decoded = json.loads(stored) if isinstance(stored, str | bytes) else stored
    except ValueError:
        decoded = None
    if isinstance(decoded, list) and all(isinstance(item, str) for item in decoded):
        return tuple(decoded)
    return (f"unreadable warnings in the catalog: {stored!r}",)


def _placeholders(count: int) -> str:
    return ",".join("?" * count)


class Catalog:
    """The backup catalog in the SQLite file at `path` (created, with its directory, if missing).

    `exclusive=False` skips the one-coordinator lock, for tools that only read a catalog a running
    coordinator owns; such a catalog reports no interrupted backups.
    """

    def __init__(self, path: str | Path, *, exclusive: bool = True) -> None:
        self.path = Path(path)
        self._lock = threading.RLock()
        self._lock_file: IO[str] | None = None
        self._exclusive = exclusive
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o750)
        if exclusive:
            self._lock_file = self._take_lock()
        try:
            self._conn: sqlite3.Connection | None = self._connect()
            self.schema_version = self._migrate()
            with self._tx(write=False) as conn:
                self._running_at_open = frozenset(
                    row["pk"]
                    for row in conn.execute("SELECT pk FROM backups WHERE state = ?", ("running",))
                )
        except BaseException:
            self.close()
            raise

    # -- opening -----------------------------------------------------------------------------------

    def _take_lock(self) -> IO[str]:
        lock_path = self.path.with_name(self.path.name + ".lock")
        handle = open(lock_path, "a+", encoding="utf-8")  # noqa: SIM115 - held until close()
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise CatalogLockedError(
                f"catalog {self.path} is in use by another coordinator (pid {holder});"
                " stop it first, only one coordinator may own a catalog"
            ) from None
        handle.truncate(0)
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        return handle

    def _connect(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=10.0
            )
        except sqlite3.Error as exc:
            raise CatalogError(f"cannot open catalog {self.path}: {exc}") from None
        conn.row_factory = sqlite3.Row
        try:
            conn.execute("PRAGMA foreign_keys = ON")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise CatalogError(f"catalog {self.path}: cannot switch to WAL mode (got {mode})")
            # FULL: a backup recorded as complete survives a power cut, or the snapshot would be an
            # orphan the catalog does not know about. Commits are rare; the fsync is cheap here.
            conn.execute("PRAGMA synchronous = FULL")
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise CatalogSchemaError(
                f"{self.path} is not a usable SQLite database ({exc}); is this the right path?"
            ) from None
        except BaseException:
            conn.close()
            raise
        return conn

    def _migrate(self) -> int:
        migrations = schema.MIGRATIONS
        latest = len(migrations)
        conn = self._connection()
        application_id = conn.execute("PRAGMA application_id").fetchone()[0]
        tables = {
            row[0] for row in conn.execute("SELECT name FROM sqlite_schema WHERE type = 'table'")
        }
        if application_id != schema.APPLICATION_ID and tables:
            raise CatalogSchemaError(
                f"{self.path} is an SQLite database but not a ringsnap catalog; refusing to touch it"
            )
        current = 0
        if "schema_version" in tables:
            current = conn.execute("SELECT max(version) FROM schema_version").fetchone()[0] or 0
        if current > latest:
            raise CatalogSchemaError(
                f"catalog {self.path} has schema version {current}, written by a newer ringsnap;"
                f" this version understands up to {latest}. Upgrade ringsnap (a catalog is never"
                " downgraded)"
            )
        if current < latest and not self._exclusive:
            raise CatalogSchemaError(
                f"catalog {self.path} is at schema version {current} and needs {latest}; only the"
                " coordinator that owns it migrates it (start ringsnap-coordinator)"
            )
        for migration in migrations[current:]:
            if migration.version != migrations.index(migration) + 1:
                raise CatalogSchemaError(f"migration list out of order at {migration.version}")
            log.info(
                "migrating catalog",
                path=str(self.path),
                version=migration.version,
                description=migration.description,
            )
            script = (
                "BEGIN IMMEDIATE;\n"
                f"{migration.sql}\n"
                f"PRAGMA application_id = {schema.APPLICATION_ID};\n"
                "INSERT INTO schema_version (version, description, applied_us)"
                f" VALUES ({migration.version}, {_sql_text(migration.description)}, {_us(_now())});\n"
                "COMMIT;"
            )
            try:
                conn.executescript(script)
            except sqlite3.Error as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise CatalogSchemaError(
                    f"catalog {self.path}: migration to version {migration.version} failed ({exc});"
                    " the catalog was left at the previous version"
                ) from None
        return latest

    def close(self) -> None:
        with self._lock:
            conn = getattr(self, "_conn", None)
            if conn is not None:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("PRAGMA optimize")
                conn.close()
                self._conn = None
            if self._lock_file is not None:
                self._lock_file.close()  # releases the flock
                self._lock_file = None

    def __enter__(self) -> Catalog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing ----------------------------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise CatalogError(f"catalog {self.path} is closed")
        return self._conn

    @contextlib.contextmanager
    def _tx(self, *, write: bool) -> Iterator[sqlite3.Connection]:
        """One transaction; a writer takes the database lock up front (no upgrade deadlocks)."""
        with self._lock:
            conn = self._connection()
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    @staticmethod
    def _find(conn: sqlite3.Connection, backup_id: str) -> tuple[int, BackupState]:
        row = conn.execute("SELECT pk, state FROM backups WHERE id = ?", (backup_id,)).fetchone()
        if row is None:
            raise BackupNotFoundError(backup_id)
        return row["pk"], BackupState(row["state"])

    def _find_running(self, conn: sqlite3.Connection, backup_id: str, doing: str) -> int:
        pk, state = self._find(conn, backup_id)
        if state is not BackupState.RUNNING:
            raise BackupStateError(f"cannot {doing}: backup {backup_id} is {state}, not running")
        return pk

    @staticmethod
    def _load(conn: sqlite3.Connection, rows: Sequence[sqlite3.Row]) -> list[Backup]:
        """Full backups for `rows` of `backups`, with a fixed number of queries whatever their count."""
        if not rows:
            return []
        pks = [row["pk"] for row in rows]
        marks = _placeholders(len(pks))
        nodes: dict[int, list[BackupNode]] = {pk: [] for pk in pks}
        for row in conn.execute(
            "SELECT backup, name, host_id, volumes, canary_id, excluded_reason, sstable_count, bytes"
            f" FROM backup_nodes WHERE backup IN ({marks}) ORDER BY backup, name",
            pks,
        ):
            nodes[row["backup"]].append(
                BackupNode(
                    name=row["name"],
                    host_id=row["host_id"],
                    volumes=codec.decode_volumes(row["volumes"]),
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
            snapshots[row["backup"]].append(codec.decode_ref(row["ref"]))
        timings: dict[int, list[PhaseTiming]] = {pk: [] for pk in pks}
        for row in conn.execute(
            "SELECT backup, phase, seconds FROM phase_timings"
            f" WHERE backup IN ({marks}) ORDER BY backup, ord",
            pks,
        ):
            timings[row["backup"]].append(PhaseTiming(phase=row["phase"], seconds=row["seconds"]))
        return [
            Backup(
                **_summary_fields(row),
                nodes=tuple(nodes[row["pk"]]),
                snapshots=tuple(snapshots[row["pk"]]),
                timings=tuple(timings[row["pk"]]),
            )
            for row in rows
        ]

    def _get(self, conn: sqlite3.Connection, backup_id: str) -> Backup:
        row = conn.execute(
            f"SELECT {_BACKUP_COLUMNS} FROM backups WHERE id = ?", (backup_id,)
        ).fetchone()
        if row is None:
            raise BackupNotFoundError(backup_id)
        return self._load(conn, [row])[0]

    @staticmethod
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
                (
                    pk,
                    n.name,
                    n.host_id,
                    codec.encode_volumes(n.volumes),
                    n.canary_id,
                    n.excluded_reason,
                )
                for n in nodes
            ],
        )

    @staticmethod
    def _write_timings(
        conn: sqlite3.Connection,
        pk: int,
        timings: Mapping[str, float] | Iterable[PhaseTiming] | None,
        window: FreezeWindow | None,
    ) -> None:
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

    @staticmethod
    def _insert_cleanup(
        conn: sqlite3.Connection, backup_id: str, request: CleanupRequest, now: datetime
    ) -> int:
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
                _us(now),
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

    @staticmethod
    def _cleanups(
        conn: sqlite3.Connection, where: str, params: Sequence[Any]
    ) -> list[PendingCleanup]:
        return [
            PendingCleanup(
                id=row["id"],
                backup_id=row["backup_id"],
                array=row["array"],
                reason=row["reason"],
                ref=codec.decode_ref(row["ref"]) if row["ref"] is not None else None,
                snapshot_name=row["snapshot_name"],
                created_at=_dt(row["created_us"]) or _EPOCH,
                attempts=row["attempts"],
                last_error=row["last_error"],
                last_attempt_at=_dt(row["last_attempt_us"]),
            )
            for row in conn.execute(
                "SELECT id, backup_id, array, snapshot_name, ref, reason, created_us, attempts,"
                f" last_error, last_attempt_us FROM pending_cleanups {where} ORDER BY id",
                params,
            )
        ]

    # -- the life of a backup ----------------------------------------------------------------------

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
    ) -> Backup:
        """Record a new backup as running. `nodes` may come now or later (`record_nodes`)."""
        names.backup_id(backup_id)
        if not cluster:
            raise ValueError("a backup needs its cluster's name")
        if not trigger:
            raise ValueError("a backup needs a trigger (who or what asked for it)")
        started = _utc(started_at) if started_at is not None else _now()
        with self._tx(write=True) as conn:
            # Snapshots are named after their backup: reusing the id of a backup whose snapshot
            # still waits for deletion would let that cleanup delete the new backup's snapshot.
            pending = conn.execute(
                "SELECT array FROM pending_cleanups WHERE snapshot_name = ? OR backup_id = ?",
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
                    " started_us) VALUES (?, ?, 'running', ?, ?, ?, ?) RETURNING pk",
                    (
                        backup_id,
                        cluster,
                        QuiesceMode(quiesce_mode).value,
                        trigger,
                        policy,
                        _us(started),
                    ),
                ).fetchone()[0]
            except sqlite3.IntegrityError:
                raise BackupStateError(
                    f"backup {backup_id} already exists in the catalog"
                ) from None
            self._upsert_nodes(conn, pk, nodes)
            backup = self._get(conn, backup_id)
        log.info("backup begun", backup_id=backup_id, cluster=cluster, trigger=trigger)
        return backup

    def record_nodes(self, backup_id: str, nodes: Sequence[BackupNode]) -> None:
        """Add or update nodes of a running backup (plan, host ids, canary ids, exclusions).

        `sstable_count` and `bytes` are ignored here: they come from the recorded manifest.
        """
        with self._tx(write=True) as conn:
            pk = self._find_running(conn, backup_id, "record nodes")
            self._upsert_nodes(conn, pk, nodes)

    def record_snapshot(self, backup_id: str, ref: SnapshotRef) -> None:
        """Record the group snapshot taken on `ref.array` for a running backup.

        The array must hold volumes of the backup's included nodes. A second, different snapshot of
        the same array is refused: it would be an orphan (record it as a cleanup instead).
        """
        encoded = codec.encode_ref(ref)
        with self._tx(write=True) as conn:
            pk = self._find_running(conn, backup_id, "record a snapshot")
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

    def record_manifest(
        self, backup_id: str, node: str, sstables: Iterable[SSTable]
    ) -> ManifestSummary:
        """Record (or replace) an included node's manifest; sets the node's SSTable count and bytes."""
        chunks, totals = codec.encode_manifest(sstables)  # the CPU-heavy part, outside the lock
        with self._tx(write=True) as conn:
            pk = self._find_running(conn, backup_id, "record a manifest")
            row = conn.execute(
                "SELECT excluded_reason FROM backup_nodes WHERE backup = ? AND name = ?", (pk, node)
            ).fetchone()
            if row is None:
                raise BackupStateError(
                    f"backup {backup_id} has no node {node!r}; record the nodes first"
                )
            if row["excluded_reason"]:
                raise BackupStateError(
                    f"backup {backup_id}: node {node} is excluded ({row['excluded_reason']})"
                )
            conn.execute("DELETE FROM manifests WHERE backup = ? AND node = ?", (pk, node))
            conn.execute(
                "INSERT INTO manifests (backup, node, encoding, sstables, components, bytes,"
                " incomplete, chunks, recorded_us) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    pk,
                    node,
                    codec.MANIFEST_ENCODING,
                    totals.sstables,
                    totals.components,
                    totals.bytes,
                    totals.incomplete,
                    len(chunks),
                    _us(_now()),
                ),
            )
            conn.executemany(
                "INSERT INTO manifest_chunks (backup, node, seq, body) VALUES (?, ?, ?, ?)",
                [(pk, node, seq, body) for seq, body in enumerate(chunks)],
            )
            conn.execute(
                "UPDATE backup_nodes SET sstable_count = ?, bytes = ? WHERE backup = ? AND name = ?",
                (totals.sstables, totals.bytes, pk, node),
            )
        return ManifestSummary(
            node=node,
            sstables=totals.sstables,
            components=totals.components,
            bytes=totals.bytes,
            incomplete_sstables=totals.incomplete,
        )

    def record_timings(
        self,
        backup_id: str,
        timings: Mapping[str, float] | Iterable[PhaseTiming],
        freeze_window: FreezeWindow | None = None,
    ) -> None:
        """Replace the phase timings (in run order) and set the freeze window of a running backup."""
        with self._tx(write=True) as conn:
            pk = self._find_running(conn, backup_id, "record timings")
            self._write_timings(conn, pk, timings, freeze_window)

    def _missing_parts(self, conn: sqlite3.Connection, pk: int) -> tuple[list[str], bool]:
        """What keeps a running backup from being complete, and whether any node is excluded."""
        backup_rows = conn.execute(f"SELECT {_BACKUP_COLUMNS} FROM backups WHERE pk = ?", (pk,))
        backup = self._load(conn, backup_rows.fetchall())[0]
        manifests = {
            row["node"]
            for row in conn.execute("SELECT node FROM manifests WHERE backup = ?", (pk,))
        }
        refs = {ref.array: ref for ref in backup.snapshots}
        missing: list[str] = []
        included = [node for node in backup.nodes if node.included]
        if not backup.nodes:
            missing.append("no nodes recorded")
        elif not included:
            missing.append("every node is excluded, nothing was backed up")
        for node in included:
            if node.name not in manifests:
                missing.append(f"node {node.name}: no manifest")
            if not node.volumes:
                missing.append(f"node {node.name}: no volumes")
            for volume in node.volumes:
                ref = refs.get(volume.array)
                if ref is None:
                    continue  # reported once per array below
                covered = any(
                    m.volume.name == volume.volume
                    or (volume.volume_id and m.volume.id == volume.volume_id)
                    for m in ref.members
                )
                if not covered:
                    missing.append(
                        f"node {node.name}: volume {volume.volume} ({volume.role}) is not in the"
                        f" snapshot of array {volume.array}"
                    )
        missing.extend(
            f"array {array}: no snapshot" for array in backup.arrays if array not in refs
        )
        return missing, len(included) < len(backup.nodes)

    def complete_backup(
        self,
        backup_id: str,
        *,
        finished_at: datetime | None = None,
        timings: Mapping[str, float] | Iterable[PhaseTiming] | None = None,
        freeze_window: FreezeWindow | None = None,
        warnings: Sequence[str] = (),
    ) -> Backup:
        """Mark a running backup complete (or partial, if nodes were excluded with a reason).

        Raises IncompleteBackupError, listing everything missing, unless every included node has a
        manifest and volumes, and every array of the plan a snapshot that covers those volumes.
        """
        finished = _utc(finished_at) if finished_at is not None else _now()
        with self._tx(write=True) as conn:
            pk = self._find_running(conn, backup_id, "complete it")
            self._write_timings(conn, pk, timings, freeze_window)
            missing, partial = self._missing_parts(conn, pk)
            if missing:
                raise IncompleteBackupError(backup_id, missing)
            state = BackupState.PARTIAL if partial else BackupState.COMPLETE
            conn.execute(
                "UPDATE backups SET state = ?, finished_us = ?, warnings = ? WHERE pk = ?",
                (state.value, _us(finished), json.dumps(list(warnings)), pk),
            )
            backup = self._get(conn, backup_id)
        log.info("backup recorded", backup_id=backup_id, state=state.value)
        return backup

    def fail_backup(
        self,
        backup_id: str,
        error: str,
        *,
        cleanups: Sequence[CleanupRequest] = (),
        finished_at: datetime | None = None,
        timings: Mapping[str, float] | Iterable[PhaseTiming] | None = None,
        freeze_window: FreezeWindow | None = None,
        warnings: Sequence[str] = (),
    ) -> Backup:
        """Mark a running backup failed with `error`.

        In the same transaction, every snapshot recorded for it moves to the pending cleanups, with
        `cleanups` (snapshots the run made but could not delete, or only knows by name).
        """
        if not error:
            raise ValueError("a failed backup needs its error")
        finished = _utc(finished_at) if finished_at is not None else _now()
        with self._tx(write=True) as conn:
            pk = self._find_running(conn, backup_id, "fail it")
            self._write_timings(conn, pk, timings, freeze_window)
            reason = f"backup {backup_id} failed: {error}"
            moved = [
                CleanupRequest(array=row["array"], reason=reason, ref=codec.decode_ref(row["ref"]))
                for row in conn.execute("SELECT array, ref FROM snapshots WHERE backup = ?", (pk,))
            ]
            for request in [*moved, *cleanups]:
                self._insert_cleanup(conn, backup_id, request, finished)
            conn.execute("DELETE FROM snapshots WHERE backup = ?", (pk,))
            conn.execute(
                "UPDATE backups SET state = 'failed', finished_us = ?, error = ?, warnings = ?"
                " WHERE pk = ?",
                (_us(finished), error, json.dumps(list(warnings)), pk),
            )
            backup = self._get(conn, backup_id)
        log.error("backup failed", backup_id=backup_id, error=error)
        return backup

    def interrupted_backups(self) -> list[Backup]:
        """Backups that were running when this catalog was opened and still are: their runs died
        with a previous coordinator. Clean up what they left, then `fail_backup` each."""
        if not self._exclusive:
            raise CatalogError(
                "interrupted backups are known only to the coordinator owning the catalog"
            )
        if not self._running_at_open:
            return []
        pks = sorted(self._running_at_open)
        with self._tx(write=False) as conn:
            rows = conn.execute(
                f"SELECT {_BACKUP_COLUMNS} FROM backups"
                f" WHERE pk IN ({_placeholders(len(pks))}) AND state = 'running'"
                " ORDER BY started_us, id",
                pks,
            ).fetchall()
            return self._load(conn, rows)

    def delete_backup(self, backup_id: str, *, reason: str) -> list[PendingCleanup]:
        """Remove a finished backup from the catalog.

        Its snapshots move to the pending cleanups in the same transaction and are returned: the
        caller deletes them from the arrays and calls `cleanup_done` (a crash in between leaves them
        pending, never forgotten).
        """
        if not reason:
            raise ValueError("say why the backup is deleted (e.g. 'retention: beyond all buckets')")
        now = _now()
        with self._tx(write=True) as conn:
            pk, state = self._find(conn, backup_id)
            if state is BackupState.RUNNING:
                raise BackupStateError(f"backup {backup_id} is still running; it cannot be deleted")
            ids = [
                self._insert_cleanup(
                    conn,
                    backup_id,
                    CleanupRequest(
                        array=row["array"],
                        reason=f"backup {backup_id} deleted: {reason}",
                        ref=codec.decode_ref(row["ref"]),
                    ),
                    now,
                )
                for row in conn.execute("SELECT array, ref FROM snapshots WHERE backup = ?", (pk,))
            ]
            conn.execute("DELETE FROM backups WHERE pk = ?", (pk,))
            cleanups = (
                self._cleanups(conn, f"WHERE id IN ({_placeholders(len(ids))})", ids) if ids else []
            )
        log.info(
            "backup deleted from catalog", backup_id=backup_id, reason=reason, snapshots=len(ids)
        )
        return cleanups

    def mark_verified(
        self,
        backup_id: str,
        result: Verification,
        *,
        detail: str = "",
        at: datetime | None = None,
    ) -> Backup:
        """Record what a restore or drill proved about a complete or partial backup."""
        moment = _utc(at) if at is not None else _now()
        with self._tx(write=True) as conn:
            pk, state = self._find(conn, backup_id)
            if not state.usable:
                raise BackupStateError(
                    f"backup {backup_id} is {state}; only finished backups are verified"
                )
            conn.execute(
                "UPDATE backups SET verification = ?, verified_us = ?, verification_detail = ?"
                " WHERE pk = ?",
                (Verification(result).value, _us(moment), detail, pk),
            )
            return self._get(conn, backup_id)

    # -- reading -----------------------------------------------------------------------------------

    def get_backup(self, backup_id: str) -> Backup:
        with self._tx(write=False) as conn:
            return self._get(conn, backup_id)

    def list_backups(
        self,
        cluster: str | None = None,
        *,
        page_size: int = DEFAULT_PAGE_SIZE,
        page_token: str = "",
        states: Collection[BackupState] | None = None,
    ) -> BackupPage:
        """One page of backups, newest first, of `cluster` (or all), optionally of some states.

        Keyset pagination: each page is one index range scan, whatever the catalog holds, and a
        page token stays valid while backups are added or deleted. `page_size` <= 0 means the
        default; above MAX_PAGE_SIZE it is lowered to it.
        """
        size = DEFAULT_PAGE_SIZE if page_size <= 0 else min(page_size, MAX_PAGE_SIZE)
        state_values = sorted(BackupState(s).value for s in states) if states else []
        where: list[str] = []
        params: list[Any] = []
        if cluster:
            where.append("cluster = ?")
            params.append(cluster)
        if state_values:
            where.append(f"state IN ({_placeholders(len(state_values))})")
            params.extend(state_values)
        if page_token:
            started_us, last_id = _decode_token(page_token, cluster or "", state_values)
            where.append("started_us <= ? AND (started_us < ? OR id < ?)")
            params.extend([started_us, started_us, last_id])
        query = (
            f"SELECT {_BACKUP_COLUMNS} FROM backups"
            + (f" WHERE {' AND '.join(where)}" if where else "")
            + " ORDER BY started_us DESC, id DESC LIMIT ?"
        )
        params.append(size + 1)
        with self._tx(write=False) as conn:
            rows = conn.execute(query, params).fetchall()
            more = len(rows) > size
            rows = rows[:size]
            backups = self._load(conn, rows)
        token = ""
        if more:
            token = _encode_token(
                cluster or "", state_values, rows[-1]["started_us"], rows[-1]["id"]
            )
        return BackupPage(tuple(backups), token)

    def backup_summaries(self, cluster: str, *, policy: str | None = None) -> list[BackupSummary]:
        """Every backup of `cluster` (of one policy, if given), newest first, without details:
        what retention works on."""
        query = f"SELECT {_BACKUP_COLUMNS} FROM backups WHERE cluster = ?"
        params: list[Any] = [cluster]
        if policy is not None:
            query += " AND policy = ?"
            params.append(policy)
        with self._tx(write=False) as conn:
            rows = conn.execute(query + " ORDER BY started_us DESC, id DESC", params).fetchall()
        return [_summary(row) for row in rows]

    def latest_backup(
        self,
        cluster: str,
        *,
        trigger: str | None = None,
        policy: str | None = None,
        states: Collection[BackupState] | None = None,
    ) -> BackupSummary | None:
        """The newest backup of `cluster` matching the filters, or None."""
        query = f"SELECT {_BACKUP_COLUMNS} FROM backups WHERE cluster = ?"
        params: list[Any] = [cluster]
        if trigger is not None:
            query += " AND trigger = ?"
            params.append(trigger)
        if policy is not None:
            query += " AND policy = ?"
            params.append(policy)
        if states:
            values = sorted(BackupState(s).value for s in states)
            query += f" AND state IN ({_placeholders(len(values))})"
            params.extend(values)
        with self._tx(write=False) as conn:
            row = conn.execute(
                query + " ORDER BY started_us DESC, id DESC LIMIT 1", params
            ).fetchone()
        return None if row is None else _summary(row)

    def manifest_summaries(self, backup_id: str) -> list[ManifestSummary]:
        with self._tx(write=False) as conn:
            pk, _ = self._find(conn, backup_id)
            return [
                ManifestSummary(
                    node=row["node"],
                    sstables=row["sstables"],
                    components=row["components"],
                    bytes=row["bytes"],
                    incomplete_sstables=row["incomplete"],
                )
                for row in conn.execute(
                    "SELECT node, sstables, components, bytes, incomplete FROM manifests"
                    " WHERE backup = ? ORDER BY node",
                    (pk,),
                )
            ]

    def iter_manifest(self, backup_id: str, node: str) -> Iterator[SSTable]:
        """A node's manifest, streamed a chunk at a time (memory bounded by one chunk).

        A missing backup or manifest raises here, not at the first item.
        """
        with self._tx(write=False) as conn:
            pk, _ = self._find(conn, backup_id)
            row = conn.execute(
                "SELECT encoding, chunks, recorded_us FROM manifests WHERE backup = ? AND node = ?",
                (pk, node),
            ).fetchone()
        if row is None:
            raise CatalogError(f"backup {backup_id} has no manifest for node {node!r}")
        return self._stream_manifest(
            backup_id,
            node,
            pk=pk,
            encoding=row["encoding"],
            chunks=row["chunks"],
            recorded_us=row["recorded_us"],
        )

    def _stream_manifest(
        self, backup_id: str, node: str, *, pk: int, encoding: str, chunks: int, recorded_us: int
    ) -> Iterator[SSTable]:
        for seq in range(chunks):
            # One short transaction per chunk: other callers are not held up by a slow reader.
            with self._tx(write=False) as conn:
                chunk = conn.execute(
                    "SELECT c.body, m.recorded_us FROM manifest_chunks AS c"
                    " JOIN manifests AS m ON m.backup = c.backup AND m.node = c.node"
                    " WHERE c.backup = ? AND c.node = ? AND c.seq = ?",
                    (pk, node, seq),
                ).fetchone()
            if chunk is None or chunk["recorded_us"] != recorded_us:
                raise CatalogError(
                    f"backup {backup_id}: the manifest of node {node} was replaced or deleted while"
                    " it was read; read it again"
                )
            yield from codec.decode_manifest_chunk(chunk["body"], encoding)

    def load_manifest(self, backup_id: str, node: str) -> list[SSTable]:
        """A node's whole manifest in memory (prefer `iter_manifest` for large ones)."""
        with codec.gc_paused():  # the list only grows: collections in between find nothing
            return list(self.iter_manifest(backup_id, node))

    # -- cleanups ----------------------------------------------------------------------------------

    def add_cleanups(
        self, backup_id: str, requests: Sequence[CleanupRequest]
    ) -> list[PendingCleanup]:
        """Record snapshots that must still be deleted (the backup's row need not exist)."""
        now = _now()
        with self._tx(write=True) as conn:
            ids = [self._insert_cleanup(conn, backup_id, request, now) for request in requests]
            if not ids:
                return []
            return self._cleanups(conn, f"WHERE id IN ({_placeholders(len(ids))})", ids)

    def pending_cleanups(self, array: str | None = None) -> list[PendingCleanup]:
        """Snapshots still to delete, oldest first (of one array, if given)."""
        with self._tx(write=False) as conn:
            if array is None:
                return self._cleanups(conn, "", ())
            return self._cleanups(conn, "WHERE array = ?", (array,))

    def cleanup_failed(self, cleanup_id: int, error: str, *, at: datetime | None = None) -> None:
        moment = _utc(at) if at is not None else _now()
        with self._tx(write=True) as conn:
            updated = conn.execute(
                "UPDATE pending_cleanups SET attempts = attempts + 1, last_error = ?,"
                " last_attempt_us = ? WHERE id = ?",
                (error, _us(moment), cleanup_id),
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

    # -- operations --------------------------------------------------------------------------------

    def save_operation(self, record: OperationRecord) -> None:
        """Insert or update an operation record."""
        with self._tx(write=True) as conn:
            conn.execute(
                "INSERT INTO operations (id, kind, state, backup_id, cluster, trigger, phase,"
                " message, steps_done, steps_total, errors, started_us, finished_us)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (id) DO UPDATE SET kind = excluded.kind, state = excluded.state,"
                " backup_id = excluded.backup_id, cluster = excluded.cluster,"
                " trigger = excluded.trigger, phase = excluded.phase, message = excluded.message,"
                " steps_done = excluded.steps_done, steps_total = excluded.steps_total,"
                " errors = excluded.errors, started_us = excluded.started_us,"
                " finished_us = excluded.finished_us",
                (
                    record.id,
                    OperationKind(record.kind).value,
                    OperationState(record.state).value,
                    record.backup_id,
                    record.cluster,
                    record.trigger,
                    record.phase,
                    record.message,
                    record.steps_done,
                    record.steps_total,
                    json.dumps(list(record.errors)),
                    _us(record.started_at),
                    _us(record.finished_at) if record.finished_at is not None else None,
                ),
            )

    _OPERATION_COLUMNS = (
        "id, kind, state, backup_id, cluster, trigger, phase, message, steps_done, steps_total,"
        " errors, started_us, finished_us"
    )

    @staticmethod
    def _operation(row: sqlite3.Row) -> OperationRecord:
        return OperationRecord(
            id=row["id"],
            kind=OperationKind(row["kind"]),
            state=OperationState(row["state"]),
            started_at=_dt(row["started_us"]) or _EPOCH,
            finished_at=_dt(row["finished_us"]),
            backup_id=row["backup_id"],
            cluster=row["cluster"],
            trigger=row["trigger"],
            phase=row["phase"],
            message=row["message"],
            steps_done=row["steps_done"],
            steps_total=row["steps_total"],
            errors=tuple(json.loads(row["errors"])),
        )

    def get_operation(self, operation_id: str) -> OperationRecord:
        with self._tx(write=False) as conn:
            row = conn.execute(
                f"SELECT {self._OPERATION_COLUMNS} FROM operations WHERE id = ?", (operation_id,)
            ).fetchone()
        if row is None:
            raise OperationNotFoundError(operation_id)
        return self._operation(row)

    def recent_operations(
        self, limit: int = 50, *, kind: OperationKind | None = None
    ) -> list[OperationRecord]:
        query = f"SELECT {self._OPERATION_COLUMNS} FROM operations"
        params: list[Any] = []
        if kind is not None:
            query += " WHERE kind = ?"
            params.append(OperationKind(kind).value)
        params.append(max(1, min(limit, MAX_PAGE_SIZE)))
        with self._tx(write=False) as conn:
            rows = conn.execute(
                query + " ORDER BY started_us DESC, id DESC LIMIT ?", params
            ).fetchall()
        return [self._operation(row) for row in rows]

    def unfinished_operations(self) -> list[OperationRecord]:
        """Operations never recorded as finished (after a restart: interrupted ones)."""
        with self._tx(write=False) as conn:
            rows = conn.execute(
                f"SELECT {self._OPERATION_COLUMNS} FROM operations WHERE finished_us IS NULL"
                " ORDER BY started_us, id"
            ).fetchall()
        return [self._operation(row) for row in rows]


def _sql_text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _encode_token(cluster: str, states: list[str], started_us: int, backup_id: str) -> str:
    raw = json.dumps(
        {"c": cluster, "s": states, "k": [started_us, backup_id]}, separators=(",", ":")
    )
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _decode_token(token: str, cluster: str, states: list[str]) -> tuple[int, str]:
    try:
        padded = token + "=" * (-len(token) % 4)
        raw = json.loads(base64.urlsafe_b64decode(padded.encode()))
        started_us, backup_id = raw["k"]
        token_cluster, token_states = raw["c"], raw["s"]
        if not isinstance(started_us, int) or not isinstance(backup_id, str):
            raise TypeError("bad key")
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise InvalidPageTokenError(
            "invalid page token; pass the next_page_token of the previous page unchanged"
        ) from None
    if token_cluster != cluster or token_states != states:
        raise InvalidPageTokenError(
            "the page token belongs to a listing with other filters; keep the filters while paging"
        )
    return started_us, backup_id
