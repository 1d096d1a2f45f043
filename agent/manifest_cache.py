"""What was read per SSTable, kept in memory for the next manifest (`ringsnap.agent.manifest`'s
docstring, "Cache", says what is trusted and why)."""

from __future__ import annotations

import os
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable
from itertools import repeat

from ringsnap.agent.sstables import Component, SSTable, SSTableDirectory, new_component, new_table

#: About 1 KB an SSTable (bench/manifest.py: 125 MiB for 125,000 SSTables of 8 components): the
#: default holds a node of 1,200,000 component files in about 150 MB.
DEFAULT_CACHE_SSTABLES = 150_000
#: Components Cassandra may rewrite without touching TOC.txt: stat'ed even on a cache hit.
REWRITTEN_IN_PLACE = frozenset(("Statistics.db", "Summary.db"))


#: One SSTable: (TOC's inode, size, mtime), digest, component names, (size, mtime_ns) of each name
#: packed as int64s. Only plain tuples of strings, numbers and bytes (not NamedTuples, not arrays):
#: the garbage collector stops tracking exact tuples of atoms, and a cache of a hundred thousand tracked entries made every full collection
#: during a manifest walk (a million new objects) cost more than the cache saved.
CachedSSTable = tuple[tuple[int, int, int], str, tuple[str, ...], bytes]


class ManifestCache:
    """What was read per SSTable, for the next manifest (see the module docstring). Thread-safe."""

    def __init__(self, max_sstables: int = DEFAULT_CACHE_SSTABLES) -> None:
        self.max_sstables = max_sstables
        self._entries: OrderedDict[tuple[str, str], CachedSSTable] = OrderedDict()
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

    def get(self, key: tuple[str, str]) -> CachedSSTable | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry

    def directory(
        self, path: str, signature: tuple[int, int]
    ) -> Callable[[SSTableDirectory], tuple[list[SSTable], list[str]]] | None:
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

        def build(directory: SSTableDirectory) -> tuple[list[SSTable], list[str]]:
            found = []
            for (key, version, generation, sstable_format), entry in zip(
                remembered[1], entries, strict=True
            ):
                table = new_table(directory, version, generation, sstable_format)
                table.components = components_of(entry, f"{directory.relative}/{key}")
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
#: in order, its index subdirectories. A plain tuple, as `CachedSSTable`.
_RememberedDirectory = tuple[
    tuple[int, int], tuple[tuple[str, str, str, str], ...], tuple[str, ...]
]


#: The process's cache: every manifest uses it unless told otherwise.
DEFAULT_CACHE = ManifestCache()


def from_cache(
    cache: ManifestCache,
    table: SSTable,
    present: set[str],
    key: str,
    *,
    directory: SSTableDirectory,
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
        if name in REWRITTEN_IN_PLACE:
            try:
                status = os.lstat(key + name, dir_fd=directory_fd)
            except FileNotFoundError:
                return False
            if (status.st_size, status.st_mtime_ns) != (numbers[2 * index], numbers[2 * index + 1]):
                cache.misses += 1
                return False
    table.components = components_of(entry, f"{directory.relative}/{key}")
    table.data_digest_crc32 = entry[1]
    cache.hits += 1
    return True


def components_of(entry: CachedSSTable, path_prefix: str) -> list[Component]:
    # map/zip run in C: no bytecode per component (a million of them on a big node).
    names, numbers = entry[2], memoryview(entry[3]).cast("q")
    return list(
        map(
            new_component,
            repeat(Component),
            zip(names, map(path_prefix.__add__, names), numbers[0::2], numbers[1::2], strict=True),
        )
    )
