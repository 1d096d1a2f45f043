"""Where an export reads a node's backup from: the agent's own directories, mapped onto the clones
a MountClones mounted read-only, or a native snapshot of the live directories.

Nothing here takes a path from a request: the data and commit-log directories come from the
agent's configuration, the clones' mount points from the agent's own clone record of the purpose.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePath

from ringsnap.agent.clones import MountedClone
from ringsnap.agent.config import CassandraSection
from ringsnap.agent.errors import Conflict


@dataclass(frozen=True)
class ExportSource:
    #: The roots of the SSTable manifest, in the order of the node's data directories.
    data_directories: tuple[Path, ...]
    #: The snapshot's commit-log directory; None when the backup holds none.
    commitlog_directory: Path | None
    #: The native snapshot tag to read below the data directories ('' for clones).
    snapshot_tag: str = ""
    #: Why no commit-log segment is exported ('' when they are).
    commitlog_note: str = ""


def native_source(cassandra: CassandraSection, tag: str) -> ExportSource:
    """A native snapshot holds hard links of the SSTables only: no commit log was captured."""
    return ExportSource(
        tuple(cassandra.data_directories),
        None,
        snapshot_tag=tag,
        commitlog_note=f"native snapshot {tag}: Cassandra's snapshots hold no commit log",
    )


def clone_source(
    cassandra: CassandraSection, run_id: str, clones: list[MountedClone], *, read_only: bool
) -> ExportSource:
    """Each configured directory on the clone of the volume it lives on (longest mount point)."""
    if not read_only:
        raise Conflict(
            f"the clones of {run_id!r} are mounted read-write; an export reads read-only"
            " clones only (UnmountClones, then MountClones with read_only)"
        )
    data = []
    for directory in cassandra.data_directories:
        mapped = _on_clone(directory, clones)
        if mapped is None:
            raise Conflict(
                f"data directory {directory} lies on none of the clones of {run_id!r}"
                f" ({', '.join(c.source_mount_point for c in clones)}); mount the clones of all"
                " of this node's volumes of the backup"
            )
        data.append(mapped)
    commitlog = _on_clone(cassandra.commitlog_directory, clones)
    note = ""
    if commitlog is None:
        note = (
            f"commit-log directory {cassandra.commitlog_directory} lies on none of the clones:"
            " the backup's snapshot holds no commit log of this node"
        )
    elif not commitlog.is_dir():
        note = f"the clone holds no commit-log directory at {commitlog}"
        commitlog = None
    return ExportSource(tuple(data), commitlog, commitlog_note=note)


def _on_clone(directory: Path, clones: list[MountedClone]) -> Path | None:
    best: tuple[int, Path] | None = None
    for clone in clones:
        if not clone.source_mount_point:
            continue
        source = PurePath(clone.source_mount_point)
        if directory != source and source not in directory.parents:
            continue
        depth = len(source.parts)
        if best is None or depth > best[0]:
            best = (depth, Path(clone.mount_point, directory.relative_to(source)))
    return None if best is None else best[1]
