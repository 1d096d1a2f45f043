"""A node's tables put back to one of Cassandra's own snapshots, in place (RestoreSnapshot).

A native snapshot is hard links in `<table dir>/snapshots/<tag>/` to the SSTables the table had when
it was taken. Restoring it, with Cassandra stopped: in every table directory of every data
directory whose table has that snapshot (in any data directory), every live file (SSTable
components, transaction logs; those of its `.<index>` directories too) moves into
`<table dir>/.ringsnap-replaced/<operation>/`, then every file of the snapshot (but Cassandra's own
manifest.json and schema.cql) is hard-linked into the table directory. Both are renames and links
inside one table directory: one filesystem, no data copied. A table without the snapshot (created
after it) is left untouched and reported.

Rules:
- what is moved aside is NEVER deleted: it is the node's data as it was before the restore, kept
  for a rollback (put the files back by hand). That is a decision, logged per table; removing
  `.ringsnap-replaced/<operation>/` is the operator's call once the restore is proven;
- the operation is recorded (fsynced, mode 0600) in `<records directory>/<operation>.json` before
  anything moves, again before the first link (phase `linking`) and at the end (`done`, with what
  was done per table). A repeat after a crash finishes the job: a file already moved is no longer
  in the table directory, a file already linked is the snapshot's own inode. A file that is
  neither is refused, never overwritten. A finished operation answers from its record and touches
  nothing; one operation restores one tag;
- the caller (`VolumeRestorer.restore_snapshot`) refuses while Cassandra runs, while a process
  holds a file under a data directory, and while volumes released by a restore are not attached.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from ringsnap import logs
from ringsnap.agent.durable import fsync_directory, write_durably
from ringsnap.agent.errors import Conflict, NotFound

log = logs.get_logger(__name__)

#: Where the live files of a table go, per operation: `<table dir>/.ringsnap-replaced/<operation>/`.
REPLACED_DIRECTORY = ".ringsnap-replaced"
SNAPSHOTS = "snapshots"
#: Cassandra's description of a snapshot, in its directory: not part of the table's data.
SNAPSHOT_METADATA = frozenset(("manifest.json", "schema.cql"))
MOVING = "moving"
LINKING = "linking"
DONE = "done"
_PHASES = (MOVING, LINKING, DONE)
_KEYSPACE = re.compile(r"[A-Za-z0-9_]{1,48}")
_TABLE_DIRECTORY = re.compile(r"[A-Za-z0-9_]{1,48}(?:-[0-9a-f]{32})?")
#: A secondary index's SSTables: `<table dir>/.<index>/` (and the same inside a snapshot).
_INDEX_DIRECTORY = re.compile(r"\.[A-Za-z0-9_]{1,48}")


@dataclass(frozen=True, slots=True)
class RestoredTable:
    """One table directory of one data directory: what was (or will be) done to it."""

    data_directory: str
    keyspace: str
    #: `<table>-<table id>`, as in the manifest.
    table_directory: str
    #: False: no snapshot of the tag; the table directory is left untouched.
    restored: bool
    files_moved: int = 0
    files_linked: int = 0
    #: Where its live files went ("" when untouched).
    replaced_directory: str = ""

    @property
    def path(self) -> Path:
        return Path(self.data_directory, self.keyspace, self.table_directory)


@dataclass(frozen=True, slots=True)
class SnapshotRecord:
    """`<records directory>/<operation>.json`: one operation's restore of one tag."""

    operation_id: str
    tag: str
    phase: str
    tables: tuple[RestoredTable, ...]


# -- the record -----------------------------------------------------------------------------------


class SnapshotRecords:
    """The records of snapshot restores, one file per operation, in `directory`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, operation_id: str) -> Path:
        return self.directory / f"{operation_id}.json"

    def load(self, operation_id: str) -> SnapshotRecord | None:
        path = self.path(operation_id)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise Conflict(
                f"snapshot restore record {path} cannot be read: {exc.strerror}"
            ) from None
        try:
            return _decode(data)
        except (ValueError, KeyError, TypeError) as exc:
            raise Conflict(
                f"snapshot restore record {path} is unreadable ({exc}); inspect it and the"
                f" {REPLACED_DIRECTORY}/{operation_id} directories of the tables, then remove it"
            ) from None

    def save(self, record: SnapshotRecord) -> None:
        document = {
            "operation_id": record.operation_id,
            "tag": record.tag,
            "phase": record.phase,
            "tables": [asdict(table) for table in record.tables],
        }
        write_durably(self.path(record.operation_id), json.dumps(document, indent=1).encode())


def _decode(data: bytes) -> SnapshotRecord:
    document = json.loads(data)
    if not isinstance(document, dict) or not isinstance(document.get("tables"), list):
        raise ValueError("not a snapshot restore record (no list of tables)")
    types = {"restored": bool, "files_moved": int, "files_linked": int}
    known = {field.name for field in fields(RestoredTable)}
    tables: list[RestoredTable] = []
    for item in document["tables"]:
        if not isinstance(item, dict):
            raise TypeError("a table entry is not an object")
        values: dict[str, Any] = {}
        for name, value in item.items():
            if name not in known:
                continue  # written by a newer agent: ignored
            wanted = types.get(name, str)
            if not isinstance(value, wanted) or (wanted is int and isinstance(value, bool)):
                raise TypeError(f"{name} is not a {wanted.__name__}")
            values[name] = value
        tables.append(RestoredTable(**values))
    phase, tag, operation_id = document["phase"], document["tag"], document["operation_id"]
    if phase not in _PHASES:
        raise ValueError(f"unknown phase {phase!r}")
    if not isinstance(tag, str) or not isinstance(operation_id, str):
        raise TypeError("tag and operation_id must be strings")
    return SnapshotRecord(operation_id, tag, phase, tuple(tables))


# -- the plan -------------------------------------------------------------------------------------


def _subdirectories(path: Path | str) -> list[str]:
    try:
        with os.scandir(path) as entries:
            return sorted(entry.name for entry in entries if entry.is_dir(follow_symlinks=False))
    except (FileNotFoundError, NotADirectoryError):
        return []


def _files(path: Path) -> list[str]:
    """Names of everything in `path` that is not a directory (files, symbolic links)."""
    try:
        with os.scandir(path) as entries:
            return sorted(
                entry.name for entry in entries if not entry.is_dir(follow_symlinks=False)
            )
    except FileNotFoundError:
        return []


def plan(data_directories: Sequence[Path], tag: str) -> list[RestoredTable]:
    """Every table directory of every data directory, `restored` when its table (keyspace and
    table directory) has `snapshots/<tag>/` in any of them: a table spread over several data
    directories goes back as a whole, also where the snapshot holds none of its files."""
    found: list[tuple[str, str, str]] = []
    for root in data_directories:
        for keyspace in _subdirectories(root):
            if not _KEYSPACE.fullmatch(keyspace):
                continue  # lost+found and anything else that is not a keyspace
            for table in _subdirectories(root / keyspace):
                if _TABLE_DIRECTORY.fullmatch(table):
                    found.append((str(root), keyspace, table))
    snapshotted = {
        (keyspace, table)
        for root, keyspace, table in found
        if os.path.isdir(Path(root, keyspace, table, SNAPSHOTS, tag))
    }
    return [
        RestoredTable(root, keyspace, table, restored=(keyspace, table) in snapshotted)
        for root, keyspace, table in found
    ]


# -- moving aside and linking ---------------------------------------------------------------------


def _ensure_directory(path: Path, like: Path) -> None:
    """Create `path` if missing, owned as `like` is (Cassandra must be able to use an index
    directory created here)."""
    if path.is_dir():
        return
    path.mkdir(mode=stat.S_IMODE(like.stat().st_mode))
    owner = like.stat()
    os.chown(path, owner.st_uid, owner.st_gid)


def _pairs(source: Path, target: Path) -> Iterator[tuple[Path, Path]]:
    """`source` and each of its index directories, with where their files go below `target`."""
    yield source, target
    for name in _subdirectories(source):
        if _INDEX_DIRECTORY.fullmatch(name):
            yield source / name, target / name


def move_aside(table: Path, replaced: Path) -> int:
    """Move every live file of `table` (and of its index directories) into `replaced`; returns how
    many files `replaced` holds. A file moved by an earlier attempt is not in `table` any more."""
    _ensure_directory(replaced.parent, table)
    _ensure_directory(replaced, table)
    for source, target in list(_pairs(table, replaced)):
        names = _files(source)
        if not names:
            continue
        _ensure_directory(target, source)
        for name in names:
            if os.path.lexists(target / name):
                raise Conflict(
                    f"{source / name} cannot be moved aside: {target / name} exists already (the"
                    " table changed since this restore began moving it); inspect both"
                )
            os.rename(source / name, target / name)
        fsync_directory(source)
        fsync_directory(target)
    return sum(len(_files(directory)) for directory, _ in _pairs(replaced, replaced))


def table_moved_aside(table: RestoredTable, operation_id: str) -> RestoredTable:
    """`table` once its live files are moved aside into `REPLACED_DIRECTORY/<operation_id>` (the
    move is logged when it moved any: those files are kept, never deleted)."""
    replaced = table.path / REPLACED_DIRECTORY / operation_id
    moved = move_aside(table.path, replaced)
    if moved:
        log.warning(
            "live files of the table moved aside and KEPT (never deleted: the data as it was"
            " before the restore, for a rollback; remove them once the restore is proven)",
            operation_id=operation_id,
            table=str(table.path),
            kept_in=str(replaced),
            files=moved,
        )
    return replace(table, files_moved=moved, replaced_directory=str(replaced))


def link_snapshot(table: Path, snapshot: Path) -> int:
    """Hard-link every file of `snapshot` (and of its index directories) into `table`; returns how
    many. A file already linked is the snapshot's own inode; anything else there is refused."""
    linked = 0
    for source, target in list(_pairs(snapshot, table)):
        names = [n for n in _files(source) if source != snapshot or n not in SNAPSHOT_METADATA]
        if not names:
            continue
        _ensure_directory(target, table)
        for name in names:
            try:
                os.link(source / name, target / name, follow_symlinks=False)
            except FileExistsError:
                if not _same_file(source / name, target / name):
                    raise Conflict(
                        f"{target / name} is in the way of the snapshot's {source / name}: not"
                        " the snapshot's file, and not moved aside; inspect it"
                    ) from None
            linked += 1
        fsync_directory(target)
    return linked


def _same_file(one: Path, other: Path) -> bool:
    a, b = os.lstat(one), os.lstat(other)
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


# -- the restore ----------------------------------------------------------------------------------


class SnapshotRestorer:
    """Restores native snapshots of the tables under `data_directories` (blocking: run it in a
    thread, one call at a time)."""

    def __init__(self, data_directories: Sequence[Path], records_directory: Path) -> None:
        self.data_directories = list(data_directories)
        self.records = SnapshotRecords(records_directory)

    def phase(self, operation_id: str) -> str:
        """How far `operation_id` got ("" when it restored no snapshot here)."""
        record = self.records.load(operation_id)
        return record.phase if record is not None else ""

    def restore(self, operation_id: str, tag: str) -> tuple[RestoredTable, ...]:
        record = self.records.load(operation_id)
        if record is not None and record.tag != tag:
            raise Conflict(
                f"operation {operation_id!r} restores snapshot {record.tag} on this node, not"
                f" {tag}; one operation restores one snapshot"
            )
        if record is not None and record.phase == DONE:
            log.info("snapshot already restored", operation_id=operation_id, tag=tag)
            return record.tables
        if record is None:
            tables = plan(self.data_directories, tag)
            if not any(table.restored for table in tables):
                raise NotFound(
                    f"no table of this node has a snapshot {tag!r} in"
                    f" {', '.join(map(str, self.data_directories))}; nothing was changed"
                )
            record = SnapshotRecord(operation_id, tag, MOVING, tuple(tables))
            self.records.save(record)  # before anything moves: a resume knows what was planned
        log.warning(
            "restoring a native snapshot in place",
            operation_id=operation_id,
            tag=tag,
            phase=record.phase,
            tables=sum(table.restored for table in record.tables),
        )
        if record.phase == MOVING:
            record = replace(record, phase=LINKING, tables=self._move(record))
            self.records.save(record)  # before the first link: from now on, links are ours
        record = replace(record, phase=DONE, tables=self._link(record))
        self.records.save(record)
        self._report(record)
        return record.tables

    def _move(self, record: SnapshotRecord) -> tuple[RestoredTable, ...]:
        done: list[RestoredTable] = []
        for table in record.tables:
            if not table.restored:
                done.append(table)
                continue
            done.append(table_moved_aside(table, record.operation_id))
        return tuple(done)

    def _link(self, record: SnapshotRecord) -> tuple[RestoredTable, ...]:
        done: list[RestoredTable] = []
        for table in record.tables:
            if not table.restored:
                done.append(table)
                continue
            linked = link_snapshot(table.path, table.path / SNAPSHOTS / record.tag)
            done.append(replace(table, files_linked=linked))
        return tuple(done)

    def _report(self, record: SnapshotRecord) -> None:
        untouched = [str(t.path) for t in record.tables if not t.restored]
        if untouched:
            log.warning(
                "directories without the snapshot left untouched (a table created after it, or"
                " not a table: e.g. system/_paxos_repair_state)",
                operation_id=record.operation_id,
                tag=record.tag,
                tables=untouched,
            )
        log.warning(
            "native snapshot restored",
            operation_id=record.operation_id,
            tag=record.tag,
            tables=sum(t.restored for t in record.tables),
            untouched=len(untouched),
            files_linked=sum(t.files_linked for t in record.tables),
            files_moved=sum(t.files_moved for t in record.tables),
        )
