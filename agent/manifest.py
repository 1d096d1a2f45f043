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
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from ringsnap.agent.manifest_cache import DEFAULT_CACHE, DEFAULT_CACHE_SSTABLES, ManifestCache
from ringsnap.agent.manifest_scan import scan
from ringsnap.agent.sstables import Component, SSTable, SSTableDirectory
from ringsnap.names import keyspace_name, snapshot_tag

DEFAULT_BATCH = 500
DEFAULT_WORKERS = 1
_IDENTIFIER = re.compile(r"[A-Za-z0-9_]{1,48}")
_TABLE_DIRECTORY = re.compile(r"([A-Za-z0-9_]{1,48})(?:-([0-9a-f]{32}))?")


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
    for tables in _ordered_map(scan, directories, workers):
        for table in tables:
            batch.append(table)
            if len(batch) >= batch_size:
                yield batch
                batch = []
    if batch:
        yield batch


def _ordered_map(
    function: Callable[[SSTableDirectory], list[SSTable]],
    items: Iterator[SSTableDirectory],
    workers: int,
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
) -> Iterator[SSTableDirectory]:
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
            yield SSTableDirectory(
                path=f"{root}/{relative}",
                relative=relative,
                table_directory=table_directory,
                root=root,
                keyspace=keyspace,
                table=match.group(1),
                tag=tag,
                cache=cache,
            )


__all__ = [
    "DEFAULT_BATCH",
    "DEFAULT_CACHE",
    "DEFAULT_CACHE_SSTABLES",
    "DEFAULT_WORKERS",
    "Component",
    "ManifestCache",
    "SSTable",
    "manifest",
]
