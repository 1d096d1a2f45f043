"""SSTable manifests: every SSTable of the live data directories or of one native snapshot.

Layout (Cassandra 4.x/5.0): `<data dir>/<keyspace>/<table>-<table id>/<version>-<generation>-<format>-<Component>`
(e.g. `nb-1-big-Data.db`, `oa-3gk0_0xyz_4gt0g2ks7idrbkqxqj-bti-Data.db`); secondary-index SSTables
in `.<index>` subdirectories; snapshots in `<table dir>/snapshots/<tag>/` (same layout inside);
incremental backups in `backups/` (never listed here).

An SSTable's components are the ones its `TOC.txt` lists. No TOC, or a listed component missing on
disk, makes the SSTable incomplete with the reason; it is reported, never silently included or
dropped. Sizes come from stat; the data checksum is the one Cassandra wrote to `Digest.crc32` —
data files are never read.

Speed: the floor is one lstat per component and one open+read+close each for TOC.txt and
Digest.crc32; the walk adds little to it: one scandir per directory, stats relative to a directory
fd (short names), grouping by name prefix, small reads with raw os calls, no per-file objects
beyond the result. Threads (`workers`) only pay off when reads wait on a device (cold caches on
real disks); with warm caches each short syscall hands the GIL back and forth and costs more than
it saves (bench/manifest.py measures both), so the default is one.

Cache: SSTables are immutable, so what was read of one (its component names, sizes and mtimes, and
its digest) is kept in memory, keyed by its directory, its name prefix and the inode, size and
mtime of its TOC.txt (`ManifestCache`). The next manifest then pays, per SSTable, one lstat of the
TOC and one of each component Cassandra may rewrite in place (Statistics.db, Summary.db: a rewrite
replaces the file but leaves the TOC alone), plus the directory listing that tells which SSTables
exist and that every cached component is still there. A directory that had not changed for a
couple of seconds when it was listed (a snapshot, a clone, a table nobody writes to) is also
remembered by its inode and mtime: while those stay the same nothing was added, removed or renamed
over in it (Cassandra rewrites a component by renaming a new file over it), so it is neither
listed nor stat'ed again. Only complete SSTables are cached; anything that does not match is read
again. The cache holds at most `max_sstables` entries (least recently
used out first) and lives only in the process: a crash or restart starts it empty, never wrong.
"""

from __future__ import annotations

import os
import re
import stat
import threading
import time
from array import array
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path
from typing import NamedTuple

from ringsnap.names import keyspace_name, snapshot_tag

DEFAULT_BATCH = 500
_IDENTIFIER = re.compile(r"[A-Za-z0-9_]{1,48}")
_TABLE_DIRECTORY = re.compile(r"([A-Za-z0-9_]{1,48})(?:-([0-9a-f]{32}))?")
_INDEX_DIRECTORY = re.compile(r"\.[A-Za-z0-9_]{1,48}")
#: `<version>-<generation>-<format>-`: nb/oa/da, an integer or a time-UUID-like id, big/bti.
_SSTABLE_PREFIX = re.compile(r"([a-z]{2})-([0-9a-z_]{1,64})-([a-z]{1,16})-")
_COMPONENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,254}")
_SKIPPED_IN_TABLE = frozenset(("snapshots", "backups"))
# TOC.txt and Digest.crc32 are a few hundred bytes: one small read (a large buffer costs more than
# the syscall), more only if needed.
_READ_SIZE = 4096
_READ_LIMIT = 1 << 16
DEFAULT_WORKERS = 1
#: About 1 KB an SSTable (bench/manifest.py: 125 MiB for 125,000 SSTables of 8 components): the
#: default holds a node of 1,200,000 component files in about 150 MB.
DEFAULT_CACHE_SSTABLES = 150_000
#: Components Cassandra may rewrite without touching TOC.txt: stat'ed even on a cache hit.
_REWRITTEN_IN_PLACE = frozenset(("Statistics.db", "Summary.db"))
#: A directory whose mtime is older than this when it is listed is trusted by its mtime next time.
_SETTLED_NS = 2_000_000_000


class Component(NamedTuple):
    """One component file: name as in TOC.txt, path relative to the data directory root."""

    name: str
    path: str
    size_bytes: int
    mtime_ns: int


# NamedTuple's generated __new__ is Python code; tuple.__new__ builds the same object in C (one
# call per component file: a million in the benchmark).
_new_component = tuple.__new__


@dataclass(slots=True)
class SSTable:
    data_directory: str
    keyspace: str
    table: str
    #: Directory name with the table id suffix; `<table dir>/.<index>` for index SSTables.
    table_directory: str
    generation: str
    format: str
    version: str
    components: list[Component]
    data_digest_crc32: str
    complete: bool
    problem: str
    snapshot_tag: str


#: One SSTable: (TOC's inode, size, mtime), digest, component names, (size, mtime_ns) of each name
#: packed as int64s. Only plain tuples of strings, numbers and bytes (not NamedTuples, not arrays):
#: the garbage collector stops tracking exact tuples of atoms, and a cache of a hundred thousand tracked entries made every full collection
#: during a manifest walk (a million new objects) cost more than the cache saved.
_Cached = tuple[tuple[int, int, int], str, tuple[str, ...], bytes]


class ManifestCache:
    """What was read per SSTable, for the next manifest (see the module docstring). Thread-safe."""

    def __init__(self, max_sstables: int = DEFAULT_CACHE_SSTABLES) -> None:
        self.max_sstables = max_sstables
        self._entries: OrderedDict[tuple[str, str], _Cached] = OrderedDict()
        self._names: dict[tuple[str, ...], tuple[str, ...]] = {}
        self._directories: OrderedDict[str, _RememberedDirectory] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._names.clear()
            self._directories.clear()

    def get(self, key: tuple[str, str]) -> _Cached | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry

    def directory(
        self, path: str, signature: tuple[int, int]
    ) -> Callable[[_Directory], tuple[list[SSTable], list[str]]] | None:
        """A settled directory whose inode and mtime are as remembered: nothing in it was added,
        removed or renamed over (Cassandra rewrites a component by renaming a new file over it),
        so no file in it need be listed or stat'ed. Returns the builder of its SSTables, or None."""
        with self._lock:
            remembered = self._directories.get(path)
            if remembered is None or remembered[0] != signature:
                return None
            entries = []
            for key, *_ in remembered[1]:
                entry = self._entries.get((path, key))
                if entry is None:  # evicted: read the directory again
                    del self._directories[path]
                    return None
                self._entries.move_to_end((path, key))
                entries.append(entry)
            self.hits += len(entries)

        def build(directory: _Directory) -> tuple[list[SSTable], list[str]]:
            found = []
            for (key, version, generation, sstable_format), entry in zip(
                remembered[1], entries, strict=True
            ):
                table = _new_table(directory, version, generation, sstable_format)
                table.components = _components_of(entry, f"{directory.relative}/{key}")
                table.data_digest_crc32 = entry[1]
                found.append(table)
            return found, list(remembered[2])

        return build

    def remember_directory(
        self, path: str, signature: tuple[int, int], tables: list[SSTable], indexes: list[str]
    ) -> None:
        """Remember a settled directory whose SSTables are all complete and cached."""
        if not all(table.complete for table in tables):
            return
        sstables = tuple(
            (f"{t.version}-{t.generation}-{t.format}-", t.version, t.generation, t.format)
            for t in tables
        )
        with self._lock:
            if all((path, key) in self._entries for key, *_ in sstables):
                self._directories[path] = (signature, sstables, tuple(indexes))
                self._directories.move_to_end(path)
                while len(self._directories) > self.max_sstables:
                    self._directories.popitem(last=False)

    def put(self, key: tuple[str, str], toc: tuple[int, int, int], table: SSTable) -> None:
        names = tuple(component.name for component in table.components)
        packed = array("q")
        for component in table.components:
            packed.append(component.size_bytes)
            packed.append(component.mtime_ns)
        numbers = packed.tobytes()
        with self._lock:
            # Most SSTables share one of a few component lists: keep one copy of each.
            names = self._names.setdefault(names, names)
            self._entries[key] = (toc, table.data_digest_crc32, names, numbers)
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_sstables:
                self._entries.popitem(last=False)
            if len(self._names) > 4096:  # pathological variety: start the sharing over
                self._names.clear()


#: A directory: its (inode, mtime), the (name prefix, version, generation, format) of each SSTable
#: in order, its index subdirectories. A plain tuple, as `_Cached`.
_RememberedDirectory = tuple[
    tuple[int, int], tuple[tuple[str, str, str, str], ...], tuple[str, ...]
]


#: The process's cache: every manifest uses it unless told otherwise.
DEFAULT_CACHE = ManifestCache()


def manifest(
    data_directories: Sequence[Path | str],
    *,
    tag: str = "",
    keyspaces: Iterable[str] = (),
    batch_size: int = DEFAULT_BATCH,
    workers: int = DEFAULT_WORKERS,
    cache: ManifestCache | None = DEFAULT_CACHE,
) -> Iterator[list[SSTable]]:
    """Yield the manifest in batches of at most `batch_size` SSTables, in a stable order.

    `tag` (validated) selects a native snapshot; `keyspaces` (validated) restricts the keyspaces.
    `workers` > 1 scans directories in parallel threads (see the module docstring); memory stays
    bounded by a small window of directories ahead of the consumer. `cache`: what earlier
    manifests read (None: read everything).
    """
    if tag:
        snapshot_tag(tag)
    wanted = frozenset(keyspace_name(name) for name in keyspaces)
    directories = (
        directory
        for root in data_directories
        for directory in _directories(str(root), tag, wanted, cache)
    )
    batch: list[SSTable] = []
    for tables in _ordered_map(_scan, directories, workers):
        for table in tables:
            batch.append(table)
            if len(batch) >= batch_size:
                yield batch
                batch = []
    if batch:
        yield batch


@dataclass(frozen=True, slots=True)
class _Directory:
    """A directory that holds SSTables, and what every SSTable in it shares."""

    path: str
    relative: str
    table_directory: str
    root: str
    keyspace: str
    table: str
    tag: str
    cache: ManifestCache | None


def _ordered_map(
    function: Callable[[_Directory], list[SSTable]], items: Iterator[_Directory], workers: int
) -> Iterator[list[SSTable]]:
    if workers <= 1:
        yield from map(function, items)
        return
    window: deque[Future[list[SSTable]]] = deque()
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ringsnap-manifest") as pool:
        try:
            for item in items:
                window.append(pool.submit(function, item))
                if len(window) >= 4 * workers:
                    yield window.popleft().result()
            while window:
                yield window.popleft().result()
        finally:
            for future in window:
                future.cancel()


def _subdirectories(path: str) -> list[str]:
    try:
        with os.scandir(path) as entries:
            return sorted(entry.name for entry in entries if entry.is_dir(follow_symlinks=False))
    except (FileNotFoundError, NotADirectoryError):
        return []


def _directories(
    root: str, tag: str, wanted: frozenset[str], cache: ManifestCache | None
) -> Iterator[_Directory]:
    for keyspace in _subdirectories(root):
        if not _IDENTIFIER.fullmatch(keyspace) or (wanted and keyspace not in wanted):
            continue  # lost+found and anything else that is not a keyspace
        keyspace_path = f"{root}/{keyspace}"
        for table_directory in _subdirectories(keyspace_path):
            match = _TABLE_DIRECTORY.fullmatch(table_directory)
            if match is None:
                continue
            relative = f"{keyspace}/{table_directory}"
            if tag:
                relative = f"{relative}/snapshots/{tag}"
            yield _Directory(
                path=f"{root}/{relative}",
                relative=relative,
                table_directory=table_directory,
                root=root,
                keyspace=keyspace,
                table=match.group(1),
                tag=tag,
                cache=cache,
            )


def _read_small(
    name: str, directory_fd: int, signature: list[tuple[int, int, int]] | None = None
) -> bytes:
    """The file's first bytes (up to the limit). `signature` receives its inode, size and mtime,
    taken before the read: a change during the read then shows as a changed key next time."""
    # O_NONBLOCK: a FIFO under a component's name must not hang the walk (it reads as empty).
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    fd = os.open(name, flags, dir_fd=directory_fd)
    try:
        if signature is not None:
            status = os.fstat(fd)
            signature.append((status.st_ino, status.st_size, status.st_mtime_ns))
        data = os.read(fd, _READ_SIZE)
        if len(data) == _READ_SIZE:  # rare: read the rest, up to the limit
            while len(data) < _READ_LIMIT and (more := os.read(fd, _READ_SIZE)):
                data += more
        return data
    finally:
        os.close(fd)


def _is_directory(name: str, directory_fd: int) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(name, dir_fd=directory_fd).st_mode)
    except OSError:
        return False


def _scan(directory: _Directory) -> list[SSTable]:
    """Every SSTable in `directory`, then those of its secondary-index subdirectories."""
    try:
        directory_fd = os.open(directory.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return []  # e.g. a table without this snapshot
    cache = directory.cache
    try:
        settled = None
        if cache is not None:
            status = os.fstat(directory_fd)
            signature = (status.st_ino, status.st_mtime_ns)
            remembered = cache.directory(directory.path, signature)
            if remembered is not None:
                found, indexes = remembered(directory)
            else:
                found, indexes = _scan_names(directory, directory_fd)
                # Racy-git rule: only a directory unchanged for a while before this listing can be
                # trusted by its mtime alone (timestamps are coarser than the changes).
                if time.time_ns() - status.st_mtime_ns > _SETTLED_NS:
                    settled = signature
        else:
            found, indexes = _scan_names(directory, directory_fd)
    finally:
        os.close(directory_fd)
    if settled is not None and cache is not None:
        cache.remember_directory(directory.path, settled, found, indexes)
    for index in indexes:
        found += _scan(
            _Directory(
                path=f"{directory.path}/{index}",
                relative=f"{directory.relative}/{index}",
                table_directory=f"{directory.table_directory}/{index}",
                root=directory.root,
                keyspace=directory.keyspace,
                table=directory.table,
                tag=directory.tag,
                cache=directory.cache,
            )
        )
    return found


def _new_table(
    directory: _Directory, version: str, generation: str, sstable_format: str
) -> SSTable:
    return SSTable(
        data_directory=directory.root,
        keyspace=directory.keyspace,
        table=directory.table,
        table_directory=directory.table_directory,
        generation=generation,
        format=sstable_format,
        version=version,
        components=[],
        data_digest_crc32="",
        complete=True,
        problem="",
        snapshot_tag=directory.tag,
    )


def _scan_names(directory: _Directory, directory_fd: int) -> tuple[list[SSTable], list[str]]:
    """The SSTables of one directory from its listing, and its index subdirectories."""
    found: list[SSTable] = []
    indexes: list[str] = []
    # `<version>-<generation>-<format>-` -> the component names present on disk. Plain names
    # (listdir) rather than DirEntry objects: a million of them add up.
    groups: dict[str, set[str]] = {}
    for name in os.listdir(directory_fd):
        parts = name.split("-", 3)
        if len(parts) == 4 and parts[3]:
            key = name[: -len(parts[3])]
            group = groups.get(key)
            if group is None:
                group = groups[key] = set()
            group.add(parts[3])
        elif name[:1] == "." and _is_directory(name, directory_fd):
            indexes.append(name)
    prefix = f"{directory.relative}/"
    cache = directory.cache
    for key in sorted(groups):
        match = _SSTABLE_PREFIX.fullmatch(key)
        if match is None:
            continue  # not an SSTable (e.g. a transaction log whose uuid has dashes)
        table = _new_table(directory, *match.groups())
        if cache is None:
            _fill(table, groups[key], key, prefix + key, directory_fd)
        elif not _from_cache(
            cache, table, groups[key], key, directory=directory, directory_fd=directory_fd
        ):
            toc = _fill(table, groups[key], key, prefix + key, directory_fd)
            if toc is not None and table.complete:
                cache.put((directory.path, key), toc, table)
        found.append(table)
    return found, sorted(name for name in indexes if _INDEX_DIRECTORY.fullmatch(name))


def _from_cache(
    cache: ManifestCache,
    table: SSTable,
    present: set[str],
    key: str,
    *,
    directory: _Directory,
    directory_fd: int,
) -> bool:
    """Fill `table` from the cache if its TOC.txt, its components on disk and its rewritable
    components are as cached; False (table untouched) otherwise."""
    if "TOC.txt" not in present:
        return False
    entry = cache.get((directory.path, key))
    if entry is None:
        cache.misses += 1
        return False
    try:
        status = os.lstat(key + "TOC.txt", dir_fd=directory_fd)
    except FileNotFoundError:
        return False
    names, numbers = entry[2], memoryview(entry[3]).cast("q")
    if entry[0] != (status.st_ino, status.st_size, status.st_mtime_ns) or not present.issuperset(
        names
    ):
        cache.misses += 1
        return False
    for index, name in enumerate(names):
        if name in _REWRITTEN_IN_PLACE:
            try:
                status = os.lstat(key + name, dir_fd=directory_fd)
            except FileNotFoundError:
                return False
            if (status.st_size, status.st_mtime_ns) != (numbers[2 * index], numbers[2 * index + 1]):
                cache.misses += 1
                return False
    table.components = _components_of(entry, f"{directory.relative}/{key}")
    table.data_digest_crc32 = entry[1]
    cache.hits += 1
    return True


def _components_of(entry: _Cached, path_prefix: str) -> list[Component]:
    # map/zip run in C: no bytecode per component (a million of them on a big node).
    names, numbers = entry[2], memoryview(entry[3]).cast("q")
    return list(
        map(
            _new_component,
            repeat(Component),
            zip(names, map(path_prefix.__add__, names), numbers[0::2], numbers[1::2], strict=True),
        )
    )


def _fill(
    table: SSTable, present: set[str], key: str, path_prefix: str, directory_fd: int
) -> tuple[int, int, int] | None:
    """Components (from TOC.txt), sizes and the data digest of one SSTable; problems if any.

    `present`: component names found on disk; `key`: the file name prefix; names are stat'ed
    relative to `directory_fd` without following symlinks. Returns the inode, size and mtime of
    the TOC.txt that was read (None without one): the key under which the result may be cached.
    """
    problems: list[str] = []
    signature: list[tuple[int, int, int]] = []
    if "TOC.txt" in present:
        try:
            text = _read_small(key + "TOC.txt", directory_fd, signature).decode(
                "utf-8", errors="replace"
            )
        except OSError as exc:
            text = ""
            problems.append(f"TOC.txt unreadable: {os.strerror(exc.errno or 0)}")
        listed = [
            name for name in dict.fromkeys(line.strip() for line in text.splitlines()) if name
        ]
        if "TOC.txt" not in listed:
            listed.append("TOC.txt")
    else:
        listed = sorted(present)
        problems.append("TOC.txt is missing")
    components = table.components
    missing: list[str] = []
    lstat = os.lstat
    for name in listed:
        if name not in present:
            # Only a name found on disk is known to be a plain file name; anything else is checked
            # before it goes into a message.
            if _COMPONENT.fullmatch(name):
                missing.append(name)
            else:
                problems.append(f"TOC.txt lists an invalid component name {name[:80]!r}")
            continue
        try:
            status = lstat(key + name, dir_fd=directory_fd)
        except FileNotFoundError:
            missing.append(name)  # removed between the listing and now (compaction)
            continue
        if not stat.S_ISREG(status.st_mode):
            # Cassandra writes plain files only: a symlink (maybe out of the data directory), a
            # directory or a FIFO is not a component a snapshot can vouch for.
            problems.append(f"component {name} is not a regular file")
            continue
        components.append(
            _new_component(
                Component, (name, path_prefix + name, status.st_size, status.st_mtime_ns)
            )
        )
    if missing:
        problems.append(f"component(s) listed in TOC.txt missing on disk: {', '.join(missing)}")
    if "Digest.crc32" in present and "Digest.crc32" in listed and "Digest.crc32" not in missing:
        try:
            value = (
                _read_small(key + "Digest.crc32", directory_fd).decode("ascii", "replace").strip()
            )
        except OSError as exc:
            value = ""
            problems.append(f"Digest.crc32 unreadable: {os.strerror(exc.errno or 0)}")
        if value.isdigit():
            table.data_digest_crc32 = value
        elif value:
            problems.append(f"Digest.crc32 is not a decimal number: {value[:40]!r}")
    if problems:
        table.complete = False
        table.problem = "; ".join(problems)
    return signature[0] if signature else None
