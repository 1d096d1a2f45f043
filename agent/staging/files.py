"""Staged files into table directories: the renames of a staged table's files into its live
directory (owned as the data directory is, in the way refused), directories made owned as the data
directory is, and the removal of an emptied staging tree."""

from __future__ import annotations

import os
from pathlib import Path

from ringsnap import logs
from ringsnap.agent.durable import fsync_directory
from ringsnap.agent.errors import Conflict

log = logs.get_logger(__name__)


def owner_of(path: Path) -> tuple[int, int]:
    stats = path.stat()
    return stats.st_uid, stats.st_gid


def make_directory(path: Path, owner: tuple[int, int]) -> None:
    """Create `path` and its missing parents, owned as the data directory is (Cassandra writes
    there once it starts)."""
    missing: list[Path] = []
    current = path
    while not current.exists():
        missing.append(current)
        current = current.parent
    for directory in reversed(missing):
        directory.mkdir(mode=0o755)
        os.chown(directory, *owner)


def entry_names(path: Path, *, directories: bool) -> list[str]:
    try:
        with os.scandir(path) as entries:
            return sorted(e.name for e in entries if e.is_dir(follow_symlinks=False) == directories)
    except FileNotFoundError:
        return []


def place_staged(staged: Path, table: Path, owner: tuple[int, int]) -> int:
    """Rename every file of `staged` (and of its `.<index>` directories) into `table`; returns how
    many were moved. A file already moved is no longer staged; anything in the way is refused."""
    moved = 0
    pairs = [(staged, table)] + [
        (staged / name, table / name)
        for name in entry_names(staged, directories=True)
        if name.startswith(".")
    ]
    for source, target in pairs:
        names = entry_names(source, directories=False)
        if not names:
            continue
        make_directory(target, owner)
        for name in names:
            if os.path.lexists(target / name):
                raise Conflict(
                    f"{target / name} is in the way of the downloaded {source / name}: it was not"
                    " moved aside; inspect both"
                )
            os.rename(source / name, target / name)
            os.chown(target / name, *owner, follow_symlinks=False)
            moved += 1
        fsync_directory(target)
    return moved


def remove_empty_tree(root: Path) -> None:
    """Remove the directories of an emptied staging tree; a file left in it keeps it (logged)."""
    for directory, _subdirectories, files in os.walk(root, topdown=False):
        if files:
            log.warning("staging directory not empty, kept", path=directory, files=len(files))
            continue
        try:
            os.rmdir(directory)
        except OSError as exc:
            log.warning("staging directory kept", path=directory, error=str(exc))


def remove_empty_tree_but(root: Path, keep: set[str]) -> None:
    """Remove the emptied table directories of a staging tree, but what `keep` names at its top."""
    for name in entry_names(root, directories=True):
        if name not in keep:
            remove_empty_tree(root / name)
