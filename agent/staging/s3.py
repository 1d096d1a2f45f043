"""Restore from S3 on one node, the staging side: download a backup's copy beside the data.

`download` (Cassandra keeps running, nothing live changes): the node's components of the backup go
to `<data dir>/.ringsnap-s3/<operation>/` of each data directory (`s3_paths`: the same filesystem
as the files they replace, so the install is renames), each verified by `download_node` (sizes,
the CRC32 of Data.db against Digest.crc32). The commit-log segments captured with the backup, when
the bucket holds them, are downloaded and verified into `<first staging>/.commitlog/`. A marker
written last says the download of that backup is complete; a rerun keeps every file that verifies.
The install in place (Cassandra stopped) is `ringsnap.agent.restore.staged`'s.

A table restore from S3 (`download_table`) fetches only that table's components, into the
table-restore staging that `ImportStagedTable` imports from.
"""

from __future__ import annotations

import importlib
import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ringsnap import logs
from ringsnap.agent.config import AgentConfig
from ringsnap.agent.durable import write_durably
from ringsnap.agent.errors import Conflict
from ringsnap.agent.fsfreeze import syncfs
from ringsnap.agent.restore.install_record import InstallRecords
from ringsnap.agent.restore.restorer import VolumeRestorer
from ringsnap.agent.s3.backup_manifest import Entry
from ringsnap.agent.s3.client import make_client
from ringsnap.agent.s3.crypto.recipients import Identity
from ringsnap.agent.s3.download import DownloadCancelled, DownloadResult, download_node
from ringsnap.agent.s3.layout import node_name
from ringsnap.agent.s3.progress import Progress
from ringsnap.agent.s3.settings import S3Encryption, S3Settings
from ringsnap.agent.staging.s3_check import DownloadCheck, check_download
from ringsnap.agent.staging.s3_paths import (
    COMMITLOG_STAGING,
    DOWNLOADED_MARKER,
    NO_COMMITLOG,
    read_marker,
    staging_roots,
)
from ringsnap.names import backup_id as valid_backup_id
from ringsnap.names import keyspace_name, table_name

log = logs.get_logger(__name__)


@dataclass(frozen=True)
class StagedDownload:
    result: DownloadResult
    staging_directories: tuple[str, ...]
    #: What the restore does with the commit log (segments staged, or why there are none).
    commitlog: str


class S3Restore:
    """Downloads of one node (blocking methods: run them in threads)."""

    def __init__(
        self,
        *,
        data_directories: Sequence[Path],
        commitlog_directory: Path,
        s3: S3Settings | None,
        records: InstallRecords,
    ) -> None:
        self.data_directories = list(data_directories)
        self.commitlog_directory = commitlog_directory
        self.s3 = s3
        #: The install records: a staging whose install began is never discarded.
        self.records = records

    @classmethod
    def of(cls, config: AgentConfig, restorer: VolumeRestorer) -> S3Restore:
        return cls(
            data_directories=[Path(d) for d in config.cassandra.data_directories],
            commitlog_directory=Path(config.cassandra.commitlog_directory),
            s3=getattr(config, "s3", None),
            records=restorer.installs,
        )

    def encryption(self) -> S3Encryption | None:
        """The agent's `[s3.encryption]` (where a KMS restore key's client connects)."""
        return self.s3.encryption if self.s3 is not None else None

    def settings(self) -> S3Settings:
        if self.s3 is None:
            raise Conflict(
                "this agent has no [s3] settings: add the [s3] table of the bucket the backup was"
                " exported to (docs/s3.md) and restart the agent; nothing was changed"
            )
        return self.s3

    def staging(self, run_id: str) -> list[Path]:
        return staging_roots(self.data_directories, run_id)

    # -- 0. the plan's check (read-only) ----------------------------------------------------------

    def check(
        self,
        run_id: str,
        backup_id: str,
        node: str,
        identities: Sequence[Identity] = (),
    ) -> DownloadCheck:
        """Whether the bucket holds this node's copy, the room its download needs, and whether
        `identities` (the restore's keys, for this call only) open it when it is encrypted."""
        settings = self.settings()
        found = check_download(
            make_client(settings),
            settings,
            backup_id=backup_id,
            node=node,
            data_directories=self.data_directories,
            staging=self.staging(run_id),
            identities=identities,
        )
        try:
            marker = self._marker(run_id)
        except Conflict:
            marker = None  # unreadable: not complete, the download writes it again
        complete = marker is not None and marker.get("backup_id") == backup_id
        return replace(found, download_complete=complete)

    # -- 1. download ----------------------------------------------------------------------------

    def download(
        self,
        run_id: str,
        backup_id: str,
        node: str,
        progress: Callable[[Progress], None] | None = None,
        cancel: threading.Event | None = None,
        *,
        identities: Sequence[Identity] = (),
    ) -> StagedDownload:
        """`identities`: the restore's keys of an encrypted copy, held for this call only."""
        settings = self.settings()
        valid_backup_id(backup_id)
        node_name(node)
        roots = self.staging(run_id)
        marker = roots[0] / DOWNLOADED_MARKER
        done = self._marker(run_id)
        if done is not None and done.get("backup_id") != backup_id:
            raise Conflict(
                f"operation {run_id} already downloaded backup {done.get('backup_id')} here;"
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
            identities=identities,
        )
        if cancel is not None and cancel.is_set():
            raise DownloadCancelled(
                f"backup {backup_id} node {node}: download cancelled by its caller before the"
                " commit log; the SSTables verified are kept for a rerun"
            )
        commitlog = self._download_commitlog(
            client, settings, backup_id, node, roots[0], identities
        )
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
            run_id=run_id,
            backup_id=backup_id,
            node=node,
            components=result.components,
            bytes=result.bytes_total,
            files_downloaded=result.files_downloaded,
            files_kept=result.files_kept,
            commitlog=commitlog,
        )
        return StagedDownload(result, tuple(map(str, roots)), commitlog)

    def _download_commitlog(  # noqa: PLR0917 - what one node's download hands on
        self,
        client: Any,
        settings: S3Settings,
        backup_id: str,
        node: str,
        root: Path,
        identities: Sequence[Identity],
    ) -> str:
        try:
            module: Any = importlib.import_module("ringsnap.agent.s3.commitlog")
        except ImportError:
            return f"{NO_COMMITLOG}: this agent cannot read commit-log copies"
        try:
            done = module.download_commitlog(
                client, settings, backup_id, node, root / COMMITLOG_STAGING, identities=identities
            )
        except module.CommitlogMissing as exc:
            log.warning("restoring without a commit log", backup_id=backup_id, reason=str(exc))
            return f"{NO_COMMITLOG}: {exc}"
        return f"{done.segments} commit-log segments ({done.bytes_total} bytes) staged"

    def _marker(self, run_id: str) -> dict[str, Any] | None:
        return read_marker(self.staging(run_id)[0])

    def download_table(
        self,
        run_id: str,
        backup_id: str,
        node: str,
        *,
        keyspace: str,
        table: str,
        staging: Path,
        progress: Callable[[Progress], None] | None = None,
        cancel: threading.Event | None = None,
        identities: Sequence[Identity] = (),
    ) -> StagedDownload:
        """Only `keyspace`.`table`'s components (not its indexes'), flat into `staging` (the
        table-restore staging directory of `run_id`); `identities` as `download`'s."""
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
            identities=identities,
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
