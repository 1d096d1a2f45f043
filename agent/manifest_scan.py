"""One table directory read for its SSTables: its listing grouped by name prefix, each TOC.txt,
the components' sizes and mtimes, Digest.crc32; from the cache where it is still right (the walk
over the data directories is `ringsnap.agent.manifest`)."""

from __future__ import annotations

import os
import re
import stat
import time

from ringsnap.agent.manifest_cache import from_cache
from ringsnap.agent.sstables import Component, SSTable, SSTableDirectory, new_component, new_table

_INDEX_DIRECTORY = re.compile(r"\.[A-Za-z0-9_]{1,48}")
#: `<version>-<generation>-<format>-`: nb/oa/da, an integer or a time-UUID-like id, big/bti.
_SSTABLE_PREFIX = re.compile(r"([a-z]{2})-([0-9a-z_]{1,64})-([a-z]{1,16})-")
_COMPONENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,254}")
# TOC.txt and Digest.crc32 are a few hundred bytes: one small read (a large buffer costs more than
# the syscall), more only if needed.
_READ_SIZE = 4096
_READ_LIMIT = 1 << 16
#: A directory whose mtime is older than this when it is listed is trusted by its mtime next time.
_SETTLED_NS = 2_000_000_000


def read_small(
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


def scan(directory: SSTableDirectory) -> list[SSTable]:
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
        found += scan(
            SSTableDirectory(
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


def _scan_names(directory: SSTableDirectory, directory_fd: int) -> tuple[list[SSTable], list[str]]:
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
        table = new_table(directory, *match.groups())
        if cache is None:
            _fill(table, groups[key], key, prefix + key, directory_fd)
        elif not from_cache(
            cache, table, groups[key], key, directory=directory, directory_fd=directory_fd
        ):
            toc = _fill(table, groups[key], key, prefix + key, directory_fd)
            if toc is not None and table.complete:
                cache.put((directory.path, key), toc, table)
        found.append(table)
    return found, sorted(name for name in indexes if _INDEX_DIRECTORY.fullmatch(name))


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
            text = read_small(key + "TOC.txt", directory_fd, signature).decode(
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
            new_component(Component, (name, path_prefix + name, status.st_size, status.st_mtime_ns))
        )
    if missing:
        problems.append(f"component(s) listed in TOC.txt missing on disk: {', '.join(missing)}")
    if "Digest.crc32" in present and "Digest.crc32" in listed and "Digest.crc32" not in missing:
        try:
            value = (
                read_small(key + "Digest.crc32", directory_fd).decode("ascii", "replace").strip()
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
