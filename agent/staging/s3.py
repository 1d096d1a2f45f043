"""Restore from S3 on one node: download a backup's copy beside the data, then install it in place.

1. `download` (Cassandra keeps running, nothing live changes): the node's components of the backup
   go to `<data dir>/.ringsnap-s3/<operation>/` of each data directory (the same filesystem as the
   files they replace, so the install is renames), each verified by `download_node` (sizes, the
   CRC32 of Data.db against Digest.crc32). The commit-log segments captured with the backup, when
   the bucket holds them, are downloaded and verified into `<first staging>/.commitlog/`. A
   marker written last says the download of that backup is complete; a rerun keeps every file
   that verifies.
2. `install` (Cassandra stopped; `VolumeRestorer.while_stopped` refuses otherwise): refused unless
   the marker says the download of the same backup completed. Like a native snapshot restore, and
   recorded the same way (so that DiscardReplayState accepts the operation): every live file of
   every table directory moves into `<table dir>/.ringsnap-replaced/<operation>/` (KEPT, never
   deleted: the operator removes it once the restore is proven), then every staged file is
   renamed into its table directory and owned as the data directory is. A repeat finishes the job.
3. `install_commitlog` (after DiscardReplayState emptied the commit-log directory): the staged
   segments are copied into it, each to a temporary name then renamed.

A table restore from S3 (`download` with a keyspace and table) fetches only that table's
components, into the table-restore staging that `ImportStagedTable` imports from.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ringsnap import logs
from ringsnap.agent.config import AgentConfig
from ringsnap.agent.durable import fsync_directory, write_durably
from ringsnap.agent.errors import Conflict
from ringsnap.agent.fsfreeze import syncfs
from ringsnap.agent.restore.model import check_operation_id
from ringsnap.agent.restore.restorer import VolumeRestorer
from ringsnap.agent.restore.snapshot import (
    DONE,
    LINKING,
    MOVING,
    REPLACED_DIRECTORY,
    RestoredTable,
    SnapshotRecord,
    SnapshotRecords,
    table_moved_aside,
)
from ringsnap.agent.s3.backup_manifest import Entry
from ringsnap.agent.s3.client import make_client
from ringsnap.agent.s3.download import DownloadCancelled, DownloadResult, download_node
from ringsnap.agent.s3.layout import node_name
from ringsnap.agent.s3.progress import Progress
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.agent.staging.files import (
    entry_names,
    make_directory,
    owner_of,
    place_staged,
    remove_empty_tree,
    remove_empty_tree_but,
    table_directories,
)
from ringsnap.agent.staging.s3_check import DownloadCheck, check_download
from ringsnap.names import backup_id as valid_backup_id
from ringsnap.names import keyspace_name, table_name

log = logs.get_logger(__name__)

STAGING_DIRECTORY = ".ringsnap-s3"
#: In the first staging directory: written once the whole download verified.
DOWNLOADED_MARKER = ".downloaded.json"
COMMITLOG_STAGING = ".commitlog"
NO_COMMITLOG = "no commit-log copy in the bucket"
_PARTIAL = ".ringsnap-partial"


def tag_of(backup_id: str) -> str:
    """The install's tag in the snapshot-restore records (one operation installs one backup)."""
    return f"s3:{backup_id}"


@dataclass(frozen=True)
class StagedDownload:
    result: DownloadResult
    staging_directories: tuple[str, ...]
    #: What the restore does with the commit log (segments staged, or why there are none).
    commitlog: str


@dataclass(frozen=True)
class CommitlogInstalled:
    segments: int
    bytes: int
    detail: str


class S3Restore:
    """Downloads and installs of one node (blocking methods: run them in threads)."""

    def __init__(
        self,
        *,
        data_directories: Sequence[Path],
        commitlog_directory: Path,
        s3: S3Settings | None,
        records: SnapshotRecords,
    ) -> None:
        self.data_directories = list(data_directories)
        self.commitlog_directory = commitlog_directory
        self.s3 = s3
        #: The native snapshot restores' records: DiscardReplayState accepts an install's.
        self.records = records

    @classmethod
    def of(cls, config: AgentConfig, restorer: VolumeRestorer) -> S3Restore:
        return cls(
            data_directories=[Path(d) for d in config.cassandra.data_directories],
            commitlog_directory=Path(config.cassandra.commitlog_directory),
            s3=getattr(config, "s3", None),
            records=restorer.snapshots.records,
        )

    def settings(self) -> S3Settings:
        if self.s3 is None:
            raise Conflict(
                "this agent has no [s3] settings: add the [s3] table of the bucket the backup was"
                " exported to (docs/s3.md) and restart the agent; nothing was changed"
            )
        return self.s3

    def staging(self, operation_id: str) -> list[Path]:
        check_operation_id(operation_id)
        return [d / STAGING_DIRECTORY / operation_id for d in self.data_directories]

    # -- 0. the plan's check (read-only) ----------------------------------------------------------

    def check(self, operation_id: str, backup_id: str, node: str) -> DownloadCheck:
        """Whether the bucket holds this node's copy, and the room its download needs."""
        settings = self.settings()
        found = check_download(
            make_client(settings),
            settings,
            backup_id=backup_id,
            node=node,
            data_directories=self.data_directories,
            staging=self.staging(operation_id),
        )
        try:
            marker = self._marker(operation_id)
        except Conflict:
            marker = None  # unreadable: not complete, the download writes it again
        complete = marker is not None and marker.get("backup_id") == backup_id
        return replace(found, download_complete=complete)

    # -- 1. download ----------------------------------------------------------------------------

    def download(
        self,
        operation_id: str,
        backup_id: str,
        node: str,
        progress: Callable[[Progress], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> StagedDownload:
        settings = self.settings()
        valid_backup_id(backup_id)
        node_name(node)
        roots = self.staging(operation_id)
        marker = roots[0] / DOWNLOADED_MARKER
        done = self._marker(operation_id)
        if done is not None and done.get("backup_id") != backup_id:
            raise Conflict(
                f"operation {operation_id} already downloaded backup {done.get('backup_id')} here;"
                " one operation restores one backup"
            )
        for root in roots:
            root.mkdir(parents=True, exist_ok=True, mode=0o700)
        client = make_client(settings)
        result = download_node(
            client,
            settings,
            backup_id=backup_id,
            node=node,
            destinations=roots,
            progress=progress,
            cancel=cancel,
        )
        if cancel is not None and cancel.is_set():
            raise DownloadCancelled(
                f"backup {backup_id} node {node}: download cancelled by its caller before the"
                " commit log; the SSTables verified are kept for a rerun"
            )
        commitlog = self._download_commitlog(client, settings, backup_id, node, roots[0])
        # The files are written without fsync; the marker lets the install go on after a crash,
        # so they are on disk first (one syncfs per data filesystem, not an fsync per file).
        for root in roots:
            syncfs(str(root))
        write_durably(
            marker,
            json.dumps(
                {"backup_id": backup_id, "node": node, "commitlog": commitlog, **asdict(result)}
            ).encode(),
        )
        log.info(
            "backup downloaded from S3 and verified",
            operation_id=operation_id,
            backup_id=backup_id,
            node=node,
            components=result.components,
            bytes=result.bytes_total,
            files_downloaded=result.files_downloaded,
            files_kept=result.files_kept,
            commitlog=commitlog,
        )
        return StagedDownload(result, tuple(map(str, roots)), commitlog)

    def _download_commitlog(
        self, client: Any, settings: S3Settings, backup_id: str, node: str, root: Path
    ) -> str:
        try:
            module: Any = importlib.import_module("ringsnap.agent.s3.commitlog")
        except ImportError:
            return f"{NO_COMMITLOG}: this agent cannot read commit-log copies"
        try:
            done = module.download_commitlog(
                client, settings, backup_id, node, root / COMMITLOG_STAGING
            )
        except module.CommitlogMissing as exc:
            log.warning("restoring without a commit log", backup_id=backup_id, reason=str(exc))
            return f"{NO_COMMITLOG}: {exc}"
        return f"{done.segments} commit-log segments ({done.bytes_total} bytes) staged"

    def _marker(self, operation_id: str) -> dict[str, Any] | None:
        path = self.staging(operation_id)[0] / DOWNLOADED_MARKER
        try:
            document = json.loads(path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise Conflict(f"{path} cannot be read ({exc}); run DownloadFromS3 again") from None
        if not isinstance(document, dict):
            raise Conflict(f"{path} is not a download marker; run DownloadFromS3 again")
        return document

    def download_table(
        self,
        operation_id: str,
        backup_id: str,
        node: str,
        *,
        keyspace: str,
        table: str,
        staging: Path,
        progress: Callable[[Progress], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> StagedDownload:
        """Only `keyspace`.`table`'s components (not its indexes'), flat into `staging` (the
        table-restore staging directory of `operation_id`)."""
        settings = self.settings()
        valid_backup_id(backup_id)
        node_name(node)
        keyspace_name(keyspace)
        table_name(table)

        def place(entry: Entry) -> Path | None:
            parsed = entry.parsed
            directory = parsed.table_directory
            if parsed.keyspace != keyspace or "/" in directory:
                return None
            return staging / parsed.file_name if directory.partition("-")[0] == table else None

        staging.mkdir(parents=True, exist_ok=True)
        result = download_node(
            make_client(settings),
            settings,
            backup_id=backup_id,
            node=node,
            destinations=self.data_directories,
            progress=progress,
            place=place,
            cancel=cancel,
        )
        if not result.components:
            raise Conflict(
                f"backup {backup_id} node {node}: the bucket's copy holds no SSTable of"
                f" {keyspace}.{table}; nothing was staged"
            )
        # Once answered, the table restore records the node staged and a resume imports the files
        # without downloading them again: they are on disk first.
        syncfs(str(staging))
        return StagedDownload(result, (str(staging),), "")

    # -- 2. install (Cassandra stopped) ---------------------------------------------------------

    def install(self, operation_id: str, backup_id: str) -> tuple[RestoredTable, ...]:
        valid_backup_id(backup_id)
        roots = self.staging(operation_id)
        records = self.records
        record = records.load(operation_id)
        tag = tag_of(backup_id)
        if record is not None and record.tag != tag:
            raise Conflict(
                f"operation {operation_id} restores {record.tag} on this node, not {tag}; one"
                " operation restores one backup"
            )
        if record is not None and record.phase == DONE:
            log.info("S3 download already installed", operation_id=operation_id, tag=tag)
            return record.tables
        if record is None:
            done = self._marker(operation_id)
            if done is None or done.get("backup_id") != backup_id:
                raise Conflict(
                    f"the download of backup {backup_id} for operation {operation_id} is not"
                    " complete on this node: run DownloadFromS3 first; nothing was changed"
                )
            record = SnapshotRecord(operation_id, tag, MOVING, tuple(self._plan(roots)))
            records.save(record)  # before anything moves: a repeat knows what was planned
        log.warning(
            "installing a backup downloaded from S3 in place",
            operation_id=operation_id,
            backup_id=backup_id,
            phase=record.phase,
            tables=len(record.tables),
        )
        if record.phase == MOVING:
            record = replace(record, phase=LINKING, tables=self._move(record))
            records.save(record)  # from now on, every file in a table directory is ours
        record = replace(record, phase=DONE, tables=self._place(record, roots))
        records.save(record)
        for root in roots:
            remove_empty_tree_but(root, keep={COMMITLOG_STAGING})
        log.warning(
            "backup from S3 installed; the replaced files are KEPT in each table's"
            f" {REPLACED_DIRECTORY}/{operation_id}/ (remove them once the restore is proven)",
            operation_id=operation_id,
            backup_id=backup_id,
            tables=len(record.tables),
            files_placed=sum(t.files_linked for t in record.tables),
            files_kept_aside=sum(t.files_moved for t in record.tables),
        )
        return record.tables

    def _plan(self, roots: Sequence[Path]) -> list[RestoredTable]:
        """Every table directory that is live or staged, per data directory: the live files of
        every table go aside (as a revert of the volume would replace them), also of a table the
        backup holds no file of (created after it, or empty then)."""
        tables: list[RestoredTable] = []
        for data, root in zip(self.data_directories, roots, strict=True):
            found = set(table_directories(data)) | set(table_directories(root))
            tables.extend(
                RestoredTable(str(data), keyspace, table, restored=True)
                for keyspace, table in sorted(found)
            )
        return tables

    def _move(self, record: SnapshotRecord) -> tuple[RestoredTable, ...]:
        done: list[RestoredTable] = []
        for table in record.tables:
            owner = owner_of(Path(table.data_directory))
            make_directory(table.path, owner)
            done.append(table_moved_aside(table, record.operation_id))
        return tuple(done)

    def _place(self, record: SnapshotRecord, roots: Sequence[Path]) -> tuple[RestoredTable, ...]:
        staging = {str(d): r for d, r in zip(self.data_directories, roots, strict=True)}
        done: list[RestoredTable] = []
        for table in record.tables:
            staged = staging[table.data_directory] / table.keyspace / table.table_directory
            owner = owner_of(Path(table.data_directory))
            placed = place_staged(staged, table.path, owner)
            done.append(replace(table, files_linked=table.files_linked + placed))
        return tuple(done)

    # -- 3. the commit log (after DiscardReplayState) -------------------------------------------

    def install_commitlog(self, operation_id: str, backup_id: str) -> CommitlogInstalled:
        record = self.records.load(operation_id)
        if record is None or record.tag != tag_of(backup_id) or record.phase != DONE:
            raise Conflict(
                f"operation {operation_id} has not installed backup {backup_id} on this node:"
                " InstallS3Download first"
            )
        root = self.staging(operation_id)[0]
        marker = self._marker(operation_id) or {}
        staged = root / COMMITLOG_STAGING
        # Segments only: a partial file a killed download left is not one.
        names = [n for n in entry_names(staged, directories=False) if n.startswith("CommitLog-")]
        if not names:
            detail = str(marker.get("commitlog") or f"{NO_COMMITLOG}: none staged")
            log.warning("no commit log installed", operation_id=operation_id, detail=detail)
            self._finish(root)
            return CommitlogInstalled(0, 0, detail)
        target = self.commitlog_directory
        owner = owner_of(target)
        size = 0
        for name in names:
            partial = target / f".{name}{_PARTIAL}"
            shutil.copyfile(staged / name, partial)
            os.chown(partial, *owner)
            os.replace(partial, target / name)
            size += (target / name).stat().st_size
        fsync_directory(target)
        detail = f"{len(names)} commit-log segments of the backup installed in {target}"
        log.warning(detail, operation_id=operation_id, bytes=size)
        self._finish(root)
        return CommitlogInstalled(len(names), size, detail)

    def _finish(self, root: Path) -> None:
        """The staging of an installed restore is no longer needed (its files were moved)."""
        shutil.rmtree(root / COMMITLOG_STAGING, ignore_errors=True)
        (root / DOWNLOADED_MARKER).unlink(missing_ok=True)
        remove_empty_tree(root)
