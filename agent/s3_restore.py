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

import asyncio
import importlib
import json
import os
import shutil
import threading
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import asdict, dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from ringsnap import logs
from ringsnap.agent.clones import CLONES_DIRECTORY
from ringsnap.agent.config import AgentConfig
from ringsnap.agent.durable import fsync_directory, write_durably
from ringsnap.agent.errors import Conflict
from ringsnap.agent.node import NodeAgent
from ringsnap.agent.restore import VolumeRestorer, check_operation_id
from ringsnap.agent.s3.backup_manifest import Entry
from ringsnap.agent.s3.client import make_client
from ringsnap.agent.s3.download import DownloadCancelled, DownloadResult, download_node
from ringsnap.agent.s3.download_check import DownloadCheck, check_download
from ringsnap.agent.s3.layout import node_name
from ringsnap.agent.s3.progress import Progress
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.agent.snapshot_restore import (
    DONE,
    LINKING,
    MOVING,
    REPLACED_DIRECTORY,
    RestoredTable,
    SnapshotRecord,
    SnapshotRecords,
    move_aside,
)
from ringsnap.agent.table_import import TableImporter, restore_id
from ringsnap.api.v1 import agent_pb2
from ringsnap.errors import ValidationError
from ringsnap.names import backup_id as valid_backup_id
from ringsnap.names import keyspace_name, table_name

log = logs.get_logger(__name__)

STAGING_DIRECTORY = ".ringsnap-s3"
#: In the first staging directory: written once the whole download verified.
DOWNLOADED_MARKER = ".downloaded.json"
COMMITLOG_STAGING = ".commitlog"
NO_COMMITLOG = "no commit-log copy in the bucket"
_PARTIAL = ".ringsnap-partial"
#: How long a new download waits for a cancelled one of the same operation to stop.
CANCELLED_WIND_DOWN_SECONDS = 60.0


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


def _owner(path: Path) -> tuple[int, int]:
    stats = path.stat()
    return stats.st_uid, stats.st_gid


def _make_directory(path: Path, owner: tuple[int, int]) -> None:
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


def _names(path: Path, *, directories: bool) -> list[str]:
    try:
        with os.scandir(path) as entries:
            return sorted(e.name for e in entries if e.is_dir(follow_symlinks=False) == directories)
    except FileNotFoundError:
        return []


def _table_directories(root: Path) -> list[tuple[str, str]]:
    """(keyspace, table directory) below a data directory or a staging directory."""
    found: list[tuple[str, str]] = []
    for keyspace in _names(root, directories=True):
        if keyspace.startswith(".") or keyspace == "lost+found":
            continue  # ringsnap's own staging, and anything that is not a keyspace
        try:
            keyspace_name(keyspace)
        except ValidationError:
            continue
        for table in _names(root / keyspace, directories=True):
            if not table.startswith("."):
                found.append((keyspace, table))
    return found


def place_staged(staged: Path, table: Path, owner: tuple[int, int]) -> int:
    """Rename every file of `staged` (and of its `.<index>` directories) into `table`; returns how
    many were moved. A file already moved is no longer staged; anything in the way is refused."""
    moved = 0
    pairs = [(staged, table)] + [
        (staged / name, table / name)
        for name in _names(staged, directories=True)
        if name.startswith(".")
    ]
    for source, target in pairs:
        names = _names(source, directories=False)
        if not names:
            continue
        _make_directory(target, owner)
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


def _remove_empty_tree(root: Path) -> None:
    """Remove the directories of an emptied staging tree; a file left in it keeps it (logged)."""
    for directory, _subdirectories, files in os.walk(root, topdown=False):
        if files:
            log.warning("staging directory not empty, kept", path=directory, files=len(files))
            continue
        try:
            os.rmdir(directory)
        except OSError as exc:
            log.warning("staging directory kept", path=directory, error=str(exc))


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
            _remove_empty_tree_but(root, keep={COMMITLOG_STAGING})
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
            found = set(_table_directories(data)) | set(_table_directories(root))
            tables.extend(
                RestoredTable(str(data), keyspace, table, restored=True)
                for keyspace, table in sorted(found)
            )
        return tables

    def _move(self, record: SnapshotRecord) -> tuple[RestoredTable, ...]:
        done: list[RestoredTable] = []
        for table in record.tables:
            owner = _owner(Path(table.data_directory))
            _make_directory(table.path, owner)
            replaced = table.path / REPLACED_DIRECTORY / record.operation_id
            moved = move_aside(table.path, replaced)
            if moved:
                log.warning(
                    "live files of the table moved aside and KEPT (never deleted: the data as it"
                    " was before the restore; remove them once the restore is proven)",
                    operation_id=record.operation_id,
                    table=str(table.path),
                    kept_in=str(replaced),
                    files=moved,
                )
            done.append(replace(table, files_moved=moved, replaced_directory=str(replaced)))
        return tuple(done)

    def _place(self, record: SnapshotRecord, roots: Sequence[Path]) -> tuple[RestoredTable, ...]:
        staging = {str(d): r for d, r in zip(self.data_directories, roots, strict=True)}
        done: list[RestoredTable] = []
        for table in record.tables:
            staged = staging[table.data_directory] / table.keyspace / table.table_directory
            owner = _owner(Path(table.data_directory))
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
        names = [n for n in _names(staged, directories=False) if n.startswith("CommitLog-")]
        if not names:
            detail = str(marker.get("commitlog") or f"{NO_COMMITLOG}: none staged")
            log.warning("no commit log installed", operation_id=operation_id, detail=detail)
            self._finish(root)
            return CommitlogInstalled(0, 0, detail)
        target = self.commitlog_directory
        owner = _owner(target)
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
        _remove_empty_tree(root)


def _remove_empty_tree_but(root: Path, keep: set[str]) -> None:
    """Remove the emptied table directories of a staging tree, but what `keep` names at its top."""
    for name in _names(root, directories=True):
        if name not in keep:
            _remove_empty_tree(root / name)


# -- RPCs ---------------------------------------------------------------------------------------


def progress_message(progress: Progress) -> agent_pb2.DownloadFromS3Response:
    eta = progress.eta_seconds
    return agent_pb2.DownloadFromS3Response(
        progress=agent_pb2.S3DownloadProgress(
            files_total=progress.files_total,
            bytes_total=progress.bytes_total,
            files_done=progress.files_done,
            bytes_done=progress.bytes_done,
            bytes_downloaded=progress.bytes_transferred,
            elapsed_seconds=progress.elapsed_seconds,
            rate_bytes_per_second=progress.rate_bytes_per_second,
            eta_seconds=-1.0 if eta is None else eta,
        )
    )


def result_message(staged: StagedDownload) -> agent_pb2.DownloadFromS3Response:
    result = staged.result
    return agent_pb2.DownloadFromS3Response(
        result=agent_pb2.S3DownloadResult(
            components=result.components,
            bytes_total=result.bytes_total,
            files_downloaded=result.files_downloaded,
            bytes_downloaded=result.bytes_downloaded,
            files_kept=result.files_kept,
            seconds=result.seconds,
            staging_directories=list(staged.staging_directories),
            commitlog=staged.commitlog,
        )
    )


class S3RestoreRpcs:
    """DownloadFromS3 and InstallS3Download for the servicer (which maps errors to statuses)."""

    def __init__(self, agent: NodeAgent) -> None:
        self._agent = agent
        #: Per operation: the cancel event and the thread of its download still running. A rerun
        #: waits for a cancelled one to stop (two threads must never write one staging).
        self._running: dict[str, tuple[threading.Event, asyncio.Future[StagedDownload]]] = {}

    async def _wait_for_previous(self, operation_id: str) -> None:
        """Returns once no download of `operation_id` runs (the caller registers its own before
        its next await); a running one that was not cancelled is refused."""
        while (previous := self._running.get(operation_id)) is not None:
            cancel, work = previous
            if not cancel.is_set():
                raise Conflict(
                    f"a download for operation {operation_id} is already running on this node;"
                    " wait for it to end (or cancel it), then ask again"
                )
            done, _ = await asyncio.wait({work}, timeout=CANCELLED_WIND_DOWN_SECONDS)
            if not done:
                raise Conflict(
                    f"the cancelled download for operation {operation_id} has not stopped within"
                    f" {CANCELLED_WIND_DOWN_SECONDS:g} s; ask again in a minute"
                )
            self._forget(operation_id, work)  # its done callback may not have run yet

    @cached_property
    def _restores(self) -> S3Restore:
        return S3Restore.of(self._agent.config, self._agent.restorer)

    def _table_staging(self, operation_id: str, keyspace: str, table: str) -> Path:
        config = self._agent.config
        importer = TableImporter(
            config.cassandra, config.volumes.state_directory / CLONES_DIRECTORY
        )
        return importer.table_directory(operation_id, keyspace, table)

    async def download(
        self, request: agent_pb2.DownloadFromS3Request
    ) -> AsyncGenerator[agent_pb2.DownloadFromS3Response, None]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Progress] = asyncio.Queue()

        def report(progress: Progress) -> None:  # from the transfer threads
            loop.call_soon_threadsafe(queue.put_nowait, progress)

        if bool(request.keyspace) != bool(request.table):
            raise ValidationError("a table download from S3 needs both keyspace and table")
        check_operation_id(request.operation_id)
        await self._wait_for_previous(request.operation_id)
        cancel = threading.Event()
        if request.keyspace:
            try:
                restore_id(request.operation_id)
            except ValidationError as exc:
                # The table restore's id rule speaks of a "restore id": name the field.
                raise ValidationError(f"operation_id: {exc}") from None
            staging = self._table_staging(
                request.operation_id,
                request.target_keyspace or request.keyspace,
                request.target_table or request.table,
            )
            work = asyncio.ensure_future(
                asyncio.to_thread(
                    lambda: self._restores.download_table(
                        request.operation_id,
                        request.backup_id,
                        request.node,
                        keyspace=request.keyspace,
                        table=request.table,
                        staging=staging,
                        progress=report,
                        cancel=cancel,
                    )
                )
            )
        else:
            work = asyncio.ensure_future(
                asyncio.to_thread(
                    self._restores.download,
                    request.operation_id,
                    request.backup_id,
                    request.node,
                    report,
                    cancel,
                )
            )
        self._running[request.operation_id] = (cancel, work)
        work.add_done_callback(lambda _: self._forget(request.operation_id, work))
        try:
            while not work.done():
                getter = asyncio.ensure_future(queue.get())
                await asyncio.wait({work, getter}, return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    yield progress_message(getter.result())
                else:
                    getter.cancel()
            while not queue.empty():  # reported just before the end
                yield progress_message(queue.get_nowait())
            yield result_message(work.result())
        finally:
            if not work.done():
                # The caller went away (a cancelled restore, a stopping coordinator): the thread
                # stops at its next file or part; what verified stays for a rerun.
                cancel.set()
                log.warning(
                    "download from S3 cancelled by its caller; stopping it",
                    operation_id=request.operation_id,
                    backup_id=request.backup_id,
                    node=request.node,
                )

    def _forget(self, operation_id: str, work: asyncio.Future[StagedDownload]) -> None:
        if self._running.get(operation_id, (None, None))[1] is work:
            del self._running[operation_id]

    async def check(
        self, request: agent_pb2.CheckS3DownloadRequest
    ) -> agent_pb2.CheckS3DownloadResponse:
        check_operation_id(request.operation_id)
        done = await asyncio.to_thread(
            self._restores.check, request.operation_id, request.backup_id, request.node
        )
        return agent_pb2.CheckS3DownloadResponse(
            manifest_key=done.manifest_key,
            manifest_found=done.manifest_found,
            commitlog_key=done.commitlog_key,
            commitlog_found=done.commitlog_found,
            commitlog_bytes=done.commitlog_bytes,
            problem=done.problem,
            download_complete=done.download_complete,
            rooms=[
                agent_pb2.S3DownloadRoom(
                    data_directory=r.data_directory,
                    bytes_needed=r.bytes_needed,
                    free_bytes=r.free_bytes,
                    filesystem=r.filesystem,
                )
                for r in done.rooms
            ],
        )

    async def install(
        self, request: agent_pb2.InstallS3DownloadRequest
    ) -> agent_pb2.InstallS3DownloadResponse:
        restores, restorer = self._restores, self._agent.restorer
        if request.commitlog:
            done = await restorer.while_stopped(
                "install the commit log from S3",
                lambda: restores.install_commitlog(request.operation_id, request.backup_id),
            )
            return agent_pb2.InstallS3DownloadResponse(
                commitlog_segments=done.segments, commitlog_bytes=done.bytes, commitlog=done.detail
            )
        tables = await restorer.while_stopped(
            f"install backup {request.backup_id} from S3",
            lambda: restores.install(request.operation_id, request.backup_id),
        )
        return agent_pb2.InstallS3DownloadResponse(
            tables=[
                agent_pb2.RestoredTable(
                    data_directory=t.data_directory,
                    keyspace=t.keyspace,
                    table_directory=t.table_directory,
                    restored=t.restored,
                    files_moved=t.files_moved,
                    files_linked=t.files_linked,
                    replaced_directory=t.replaced_directory,
                )
                for t in tables
            ]
        )
