"""The one in-place install of a node's tables, from a native snapshot or from a copy staged from S3.

With Cassandra stopped, for an operation and a *source* (`ringsnap.agent.restore.snapshot`: the
node's own snapshot of a backup; `ringsnap.agent.restore.staged`: the node's copy downloaded from
S3 beside the data):

1. the plan: every table directory of every data directory, live or in the source; a table the
   source holds (in any data directory: a table spread over several goes back whole) is
   `restored`; one it does not hold was created after the backup (or is not a table, e.g.
   Cassandra's `system/_paxos_repair_state`);
2. `moving`: every live file (SSTable components, transaction logs; those of its `.<index>`
   directories too) of EVERY table directory moves into `<table dir>/.ringsnap-replaced/<operation>/`,
   whether the source holds the table or not. A restore brings the node back to the backup's
   point in time, as a revert of its volumes would: a table created after the backup held nothing
   then, so it holds nothing after. Its files are never deleted: they are moved into that named
   directory, and the move is logged per table;
3. `linking`: the source's files are put in place (hard links from the snapshot, renames from the
   staging: one filesystem, nothing copied), owned as the data directory is;
4. `done`: the record keeps what was done per table.

Rules:
- what is moved aside is NEVER deleted: it is the node's data as it was before the restore, kept
  for a rollback (put the files back by hand). Removing `.ringsnap-replaced/<operation>/` is the
  operator's call once the restore is proven;
- the record (`ringsnap.agent.restore.install_record`) is written before anything moves, again before the
  first file is placed, and at the end. A repeat after a crash finishes the job: a file already
  moved is no longer in the table directory, a file already placed is the source's own. A file
  that is neither is refused, never overwritten. A finished operation answers from its record and
  touches nothing; one operation installs one source;
- the caller (`VolumeRestorer.install`) refuses while Cassandra runs, while a process holds a file
  under a data directory, and while volumes released by a restore are not attached.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from ringsnap import logs
from ringsnap.agent.durable import fsync_directory
from ringsnap.agent.errors import Conflict
from ringsnap.agent.restore.install_record import (
    DONE,
    LINKING,
    MOVING,
    REPLACED_DIRECTORY,
    InstallRecord,
    InstallRecords,
    RestoredTable,
    source_name,
)
from ringsnap.agent.staging.files import make_directory, owner_of

log = logs.get_logger(__name__)

#: Cassandra's keyspace names; anything else under a data directory (lost+found, ringsnap's own
#: `.ringsnap-*` staging) is not a keyspace.
_KEYSPACE = re.compile(r"[A-Za-z0-9_]{1,48}")
#: `<table>-<table id>` (and the id-less directories of Cassandra's own state).
_TABLE_DIRECTORY = re.compile(r"[A-Za-z0-9_]{1,48}(?:-[0-9a-f]{1,32})?")
#: A secondary index's SSTables: `<table dir>/.<index>/` (and the same inside a snapshot).
_INDEX_DIRECTORY = re.compile(r"\.[A-Za-z0-9_]{1,48}")


@dataclass(frozen=True, slots=True)
class TableLocation:
    data_directory: str
    keyspace: str
    table_directory: str


class Source(Protocol):
    """Where an install takes the backup's files from."""

    #: What the record calls the source: a snapshot's tag, `s3:<backup id>`.
    @property
    def tag(self) -> str: ...

    def tables(self) -> list[TableLocation]:
        """The table directories the source holds files of (or, for a snapshot, a snapshot of)."""
        ...

    def check(self, held: set[tuple[str, str]]) -> None:
        """Refuse (raise) before anything moves; `held` is (keyspace, table directory)."""
        ...

    def place(self, table: RestoredTable) -> int:
        """Put the source's files of `table` in place; how many."""
        ...

    def finish(self, record: InstallRecord) -> None:
        """After the record says done (e.g. the emptied staging goes)."""
        ...


# -- the table directories ------------------------------------------------------------------------


def subdirectories(path: Path | str) -> list[str]:
    try:
        with os.scandir(path) as entries:
            return sorted(entry.name for entry in entries if entry.is_dir(follow_symlinks=False))
    except (FileNotFoundError, NotADirectoryError):
        return []


def files(path: Path) -> list[str]:
    """Names of everything in `path` that is not a directory (files, symbolic links)."""
    try:
        with os.scandir(path) as entries:
            return sorted(
                entry.name for entry in entries if not entry.is_dir(follow_symlinks=False)
            )
    except FileNotFoundError:
        return []


def table_directories(root: Path) -> list[tuple[str, str]]:
    """(keyspace, table directory) below a data directory or a staging directory."""
    return [
        (keyspace, table)
        for keyspace in subdirectories(root)
        if _KEYSPACE.fullmatch(keyspace)
        for table in subdirectories(root / keyspace)
        if _TABLE_DIRECTORY.fullmatch(table)
    ]


def plan(data_directories: Sequence[Path], source: Source) -> list[RestoredTable]:
    """Every table directory, live or in `source`, per data directory in name order; `restored`
    when the source holds its table (keyspace and table directory) in any data directory."""
    located = source.tables()
    held = {(t.keyspace, t.table_directory) for t in located}
    tables: list[RestoredTable] = []
    for root in data_directories:
        found = set(table_directories(root))
        found |= {(t.keyspace, t.table_directory) for t in located if t.data_directory == str(root)}
        tables.extend(
            RestoredTable(str(root), keyspace, table, restored=(keyspace, table) in held)
            for keyspace, table in sorted(found)
        )
    return tables


# -- moving aside ---------------------------------------------------------------------------------


def ensure_directory(path: Path, like: Path) -> None:
    """Create `path` if missing, with the mode and owner of `like` (Cassandra must be able to use
    a directory created here)."""
    if path.is_dir():
        return
    path.mkdir(mode=stat.S_IMODE(like.stat().st_mode))
    owner = like.stat()
    os.chown(path, owner.st_uid, owner.st_gid)


def pairs(source: Path, target: Path) -> Iterator[tuple[Path, Path]]:
    """`source` and each of its index directories, with where their files go below `target`."""
    yield source, target
    for name in subdirectories(source):
        if _INDEX_DIRECTORY.fullmatch(name):
            yield source / name, target / name


def move_aside(table: Path, replaced: Path) -> int:
    """Move every live file of `table` (and of its index directories) into `replaced`; returns how
    many files `replaced` holds. A file moved by an earlier attempt is not in `table` any more."""
    ensure_directory(replaced.parent, table)
    ensure_directory(replaced, table)
    for source, target in list(pairs(table, replaced)):
        names = files(source)
        if not names:
            continue
        ensure_directory(target, source)
        for name in names:
            if os.path.lexists(target / name):
                raise Conflict(
                    f"{source / name} cannot be moved aside: {target / name} exists already (the"
                    " table changed since this restore began moving it); inspect both"
                )
            os.rename(source / name, target / name)
        fsync_directory(source)
        fsync_directory(target)
    return sum(len(files(directory)) for directory, _ in pairs(replaced, replaced))


def table_moved_aside(table: RestoredTable, run_id: str) -> RestoredTable:
    """`table` once its live files are moved aside into `REPLACED_DIRECTORY/<run_id>` (the
    table directory made first, owned as its data directory, when only the source has it). The
    move is logged when it moved any: those files are kept, never deleted."""
    if not table.path.is_dir():
        make_directory(table.path, owner_of(Path(table.data_directory)))
    replaced = table.path / REPLACED_DIRECTORY / run_id
    moved = move_aside(table.path, replaced)
    if moved:
        log.warning(
            "live files of the table moved aside and KEPT (never deleted: the data as it was"
            " before the restore, for a rollback; remove them once the restore is proven)",
            run_id=run_id,
            table=str(table.path),
            in_backup=table.restored,
            kept_in=str(replaced),
            files=moved,
        )
    return replace(table, files_moved=moved, replaced_directory=str(replaced))


# -- the install ----------------------------------------------------------------------------------


class Installer:
    """Installs sources in place under `data_directories` (blocking: run it in a thread, one call
    at a time)."""

    def __init__(self, data_directories: Sequence[Path], records: InstallRecords) -> None:
        self.data_directories = list(data_directories)
        self.records = records

    def install(self, run_id: str, source: Source) -> tuple[RestoredTable, ...]:
        record = self.records.load(run_id)
        if record is not None and record.tag != source.tag:
            raise Conflict(
                f"operation {run_id!r} restores {source_name(record.tag)} on this node, not"
                f" {source.tag}; one operation restores one backup"
            )
        if record is not None and record.phase == DONE:
            log.info("already installed", run_id=run_id, source=source.tag)
            return record.tables
        if record is None:
            tables = plan(self.data_directories, source)
            source.check({(t.keyspace, t.table_directory) for t in tables if t.restored})
            record = InstallRecord(run_id, source.tag, MOVING, tuple(tables))
            self.records.save(record)  # before anything moves: a resume knows what was planned
        log.warning(
            f"restoring {source_name(source.tag)} in place",
            run_id=run_id,
            phase=record.phase,
            tables=sum(table.restored for table in record.tables),
            not_in_backup=sum(not table.restored for table in record.tables),
        )
        if record.phase == MOVING:
            moved = tuple(table_moved_aside(table, run_id) for table in record.tables)
            record = replace(record, phase=LINKING, tables=moved)
            self.records.save(record)  # before the first file is placed: from now on, ours
        placed = tuple(
            replace(table, files_linked=source.place(table)) if table.restored else table
            for table in record.tables
        )
        record = replace(record, phase=DONE, tables=placed)
        self.records.save(record)
        source.finish(record)
        _report(record)
        return record.tables


def _report(record: InstallRecord) -> None:
    absent = [str(t.path) for t in record.tables if not t.restored]
    if absent:
        log.warning(
            "table directories the backup does not hold (a table created after it, or not a"
            " table: e.g. system/_paxos_repair_state): their live files moved aside and KEPT,"
            " nothing put in their place",
            run_id=record.run_id,
            source=record.tag,
            tables=absent,
            kept_in=f"<table dir>/{REPLACED_DIRECTORY}/{record.run_id}",
        )
    log.warning(
        f"{source_name(record.tag)} restored in place; the replaced files are KEPT in each"
        f" table's {REPLACED_DIRECTORY}/{record.run_id}/ (remove them once the restore is"
        " proven)",
        run_id=record.run_id,
        tables=sum(t.restored for t in record.tables),
        not_in_backup=len(absent),
        files_placed=sum(t.files_linked for t in record.tables),
        files_kept_aside=sum(t.files_moved for t in record.tables),
    )
