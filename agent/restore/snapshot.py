"""A native snapshot as the source of an in-place install (RestoreSnapshot).

A native snapshot is hard links in `<table dir>/snapshots/<tag>/` to the SSTables the table had when
it was taken (Cassandra writes the directory, with its manifest.json, for every table, an empty one
included). The install (`ringsnap.agent.restore.install`) moves every live file aside, then this
source hard-links every file of the snapshot (but Cassandra's own manifest.json and schema.cql)
into its table directory: links inside one table directory, one filesystem, no data copied. A
table directory without the snapshot was created after it: the install moves its live files aside
too, and links nothing there.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from ringsnap.agent.durable import fsync_directory
from ringsnap.agent.errors import Conflict, NotFound
from ringsnap.agent.restore import install
from ringsnap.agent.restore.install import TableLocation, ensure_directory, files, pairs
from ringsnap.agent.restore.install_record import InstallRecord, RestoredTable
from ringsnap.names import snapshot_tag

SNAPSHOTS = "snapshots"
#: Cassandra's description of a snapshot, in its directory: not part of the table's data.
SNAPSHOT_METADATA = frozenset(("manifest.json", "schema.cql"))


class NativeSnapshot:
    """The snapshot `tag` of the tables under `data_directories`."""

    def __init__(self, data_directories: Sequence[Path], tag: str) -> None:
        self.data_directories = list(data_directories)
        self.tag = snapshot_tag(tag)

    def tables(self) -> list[TableLocation]:
        return [
            TableLocation(str(root), keyspace, table)
            for root in self.data_directories
            for keyspace, table in install.table_directories(root)
            if os.path.isdir(root / keyspace / table / SNAPSHOTS / self.tag)
        ]

    def check(self, held: set[tuple[str, str]]) -> None:
        if not held:
            raise NotFound(
                f"no table of this node has a snapshot {self.tag!r} in"
                f" {', '.join(map(str, self.data_directories))}; nothing was changed"
            )

    def place(self, table: RestoredTable) -> int:
        return link_snapshot(table.path, table.path / SNAPSHOTS / self.tag)

    def finish(self, record: InstallRecord) -> None:
        """Nothing to clear: the snapshot stays (the backup owns it)."""


def plan(data_directories: Sequence[Path], tag: str) -> list[RestoredTable]:
    """What restoring snapshot `tag` would do to each table directory (`install.plan`)."""
    return install.plan(data_directories, NativeSnapshot(data_directories, tag))


def link_snapshot(table: Path, snapshot: Path) -> int:
    """Hard-link every file of `snapshot` (and of its index directories) into `table`; returns how
    many. A file already linked is the snapshot's own inode; anything else there is refused."""
    linked = 0
    for source, target in list(pairs(snapshot, table)):
        names = [n for n in files(source) if source != snapshot or n not in SNAPSHOT_METADATA]
        if not names:
            continue
        ensure_directory(target, table)
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
