"""The catalog file: its one-coordinator lock, its SQLite connection (WAL, foreign keys, FULL sync),
its migration on open, and transactions. The stores of each record kind build on `Database`."""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from ringsnap.coordinator.catalog import schema
from ringsnap.coordinator.catalog.errors import (
    CatalogError,
    CatalogLockedError,
    CatalogSchemaError,
)


class Database:
    """The SQLite file at `path` (created, with its directory, if missing), migrated to the latest
    schema. `exclusive=False` skips the one-coordinator lock, for tools that only read a catalog a
    running coordinator owns.

    A store that must look at the catalog as it was found extends `_opened`, calling `super()`.
    """

    def __init__(self, path: str | Path, *, exclusive: bool = True) -> None:
        self.path = Path(path)
        self._lock = threading.RLock()
        self._lock_file: IO[str] | None = None
        self._exclusive = exclusive
        self._conn: sqlite3.Connection | None = None
        #: Read transactions run on a connection of their own thread, so that a list or a status
        #: never waits behind a write's fsync (WAL: readers see the last commit, writers don't
        #: block them). By thread id; closed with the catalog.
        self._readers: dict[int, sqlite3.Connection] = {}
        self._readers_lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o750)
        if exclusive:
            self._lock_file = self._take_lock()
        try:
            self._conn = self._connect()
            self.schema_version = schema.migrate(self._conn, self.path, may_write=exclusive)
            with self._tx(write=exclusive) as conn:
                self._opened(conn)
        except BaseException:
            self.close()
            raise

    def _opened(self, conn: sqlite3.Connection) -> None:
        """Called once, in one transaction (a writing one when `exclusive`), right after opening."""

    # -- opening ---------------------------------------------------------------------------------

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

    def close(self) -> None:
        with self._readers_lock:
            readers, self._readers = list(self._readers.values()), {}
        for reader in readers:
            reader.close()
        with self._lock:
            conn = self._conn
            if conn is not None:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("PRAGMA optimize")
                conn.close()
                self._conn = None
            if self._lock_file is not None:
                self._lock_file.close()  # releases the flock
                self._lock_file = None

    # -- plumbing --------------------------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise CatalogError(f"catalog {self.path} is closed")
        return self._conn

    def _reader(self) -> sqlite3.Connection:
        """This thread's read-only connection (opened on first use)."""
        ident = threading.get_ident()
        conn = self._readers.get(ident)
        if conn is None:
            self._connection()  # refuses a closed catalog
            conn = self._connect()
            conn.execute("PRAGMA query_only = ON")
            with self._readers_lock:
                self._readers[ident] = conn
        return conn

    @contextlib.contextmanager
    def _tx(self, *, write: bool) -> Iterator[sqlite3.Connection]:
        """One transaction: a writer takes the database lock up front (no upgrade deadlocks) on
        the one writing connection; a reader reads the last commit on its thread's connection."""
        if write:
            with self._lock, _transaction(self._connection(), "BEGIN IMMEDIATE") as conn:
                yield conn
            return
        with _transaction(self._reader(), "BEGIN") as conn:
            yield conn

    def _require_owner(self, what: str) -> None:
        if not self._exclusive:
            raise CatalogError(f"{what} are known only to the coordinator owning the catalog")


@contextlib.contextmanager
def _transaction(conn: sqlite3.Connection, begin: str) -> Iterator[sqlite3.Connection]:
    """`begin` on `conn`, committed when the block ends, rolled back when it raises."""
    conn.execute(begin)
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
