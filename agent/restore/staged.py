"""A backup's copy downloaded from S3 beside the data, as the source of an in-place install
(InstallS3Download), and the commit-log segments staged with it.

The download (`ringsnap.agent.staging.s3`) leaves the node's files in
`<data dir>/.ringsnap-s3/<operation>/<keyspace>/<table dir>/` of each data directory and writes its
marker last. The install (`ringsnap.agent.restore.install`) is refused unless the marker says the
download of the same backup completed; it moves every live file aside, then this source renames
each staged file into its table directory (one filesystem), owned as the data directory is, and
removes the emptied staging. A table directory with no staged file was created after the backup
(or was empty then): its live files are moved aside and nothing is put in their place.

After DiscardReplayState emptied the commit-log directory, `install_commitlog` copies the staged
segments into it, each to a temporary name then renamed, and removes the staging.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ringsnap import logs
from ringsnap.agent.durable import fsync_directory
from ringsnap.agent.errors import Conflict
from ringsnap.agent.restore import install
from ringsnap.agent.restore.install import TableLocation
from ringsnap.agent.restore.install_record import (
    DONE,
    S3_TAG_PREFIX,
    InstallRecord,
    InstallRecords,
    RestoredTable,
)
from ringsnap.agent.staging.files import (
    entry_names,
    owner_of,
    place_staged,
    remove_empty_tree,
    remove_empty_tree_but,
)
from ringsnap.agent.staging.s3_paths import (
    COMMITLOG_STAGING,
    DOWNLOADED_MARKER,
    NO_COMMITLOG,
    read_marker,
    staging_roots,
)
from ringsnap.names import backup_id as valid_backup_id

log = logs.get_logger(__name__)

_PARTIAL = ".ringsnap-partial"


def tag_of(backup_id: str) -> str:
    """The install's tag in the records (one operation installs one backup)."""
    return f"{S3_TAG_PREFIX}{backup_id}"


@dataclass(frozen=True)
class CommitlogInstalled:
    segments: int
    bytes: int
    detail: str


class StagedCopy:
    """The copy of backup `backup_id` that operation `run_id` downloaded here."""

    def __init__(self, data_directories: Sequence[Path], run_id: str, backup_id: str) -> None:
        self.data_directories = list(data_directories)
        self.run_id = run_id
        self.backup_id = valid_backup_id(backup_id)
        self.roots = staging_roots(self.data_directories, run_id)
        self.tag = tag_of(backup_id)

    def tables(self) -> list[TableLocation]:
        return [
            TableLocation(str(data), keyspace, table)
            for data, root in zip(self.data_directories, self.roots, strict=True)
            for keyspace, table in install.table_directories(root)
        ]

    def check(self, held: set[tuple[str, str]]) -> None:
        done = read_marker(self.roots[0])
        if done is None or done.get("backup_id") != self.backup_id:
            raise Conflict(
                f"the download of backup {self.backup_id} for operation {self.run_id} is"
                " not complete on this node: run DownloadFromS3 first; nothing was changed"
            )

    def place(self, table: RestoredTable) -> int:
        staging = {str(d): r for d, r in zip(self.data_directories, self.roots, strict=True)}
        staged = staging[table.data_directory] / table.keyspace / table.table_directory
        return place_staged(staged, table.path, owner_of(Path(table.data_directory)))

    def finish(self, record: InstallRecord) -> None:
        for root in self.roots:
            remove_empty_tree_but(root, keep={COMMITLOG_STAGING})

    # -- the commit log (after DiscardReplayState) -------------------------------------------

    def install_commitlog(
        self, records: InstallRecords, commitlog_directory: Path
    ) -> CommitlogInstalled:
        record = records.load(self.run_id)
        if record is None or record.tag != self.tag or record.phase != DONE:
            raise Conflict(
                f"operation {self.run_id} has not installed backup {self.backup_id} on this"
                " node: InstallS3Download first"
            )
        root = self.roots[0]
        marker = read_marker(root) or {}
        staged = root / COMMITLOG_STAGING
        # Segments only: a partial file a killed download left is not one.
        names = [n for n in entry_names(staged, directories=False) if n.startswith("CommitLog-")]
        if not names:
            detail = str(marker.get("commitlog") or f"{NO_COMMITLOG}: none staged")
            log.warning("no commit log installed", run_id=self.run_id, detail=detail)
            _finish(root)
            return CommitlogInstalled(0, 0, detail)
        owner = owner_of(commitlog_directory)
        size = 0
        for name in names:
            partial = commitlog_directory / f".{name}{_PARTIAL}"
            shutil.copyfile(staged / name, partial)
            os.chown(partial, *owner)
            os.replace(partial, commitlog_directory / name)
            size += (commitlog_directory / name).stat().st_size
        fsync_directory(commitlog_directory)
        detail = (
            f"{len(names)} commit-log segments of the backup installed in {commitlog_directory}"
        )
        log.warning(detail, run_id=self.run_id, bytes=size)
        _finish(root)
        return CommitlogInstalled(len(names), size, detail)


def _finish(root: Path) -> None:
    """The staging of an installed restore is no longer needed (its files were moved)."""
    shutil.rmtree(root / COMMITLOG_STAGING, ignore_errors=True)
    (root / DOWNLOADED_MARKER).unlink(missing_ok=True)
    remove_empty_tree(root)
