"""A restore from S3's staging on this node, for the plan and for giving the restore up.

- `check_room` answers the plan as CheckS3Download does, but without reading the node's whole
  manifest object when it need not: on a first plan (nothing staged for the operation) with every
  data directory on one filesystem, the bytes to download are what the export recorded for the
  node (the coordinator sends them), and one HEAD tells that the manifest object is there. A
  resume with a complete download costs a HEAD too; a partial staging, several data filesystems or
  unknown bytes read the manifest object (`S3Restore.check`), which alone knows what is staged
  where.
- `discard` removes `<data dir>/.ringsnap-s3/<operation>/` of each configured data directory, and
  nothing else: never while the operation's download runs, never once its install began moving
  files into Cassandra's table directories (its install record exists from then on: the
  restore must be resumed, not given up).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from ringsnap import logs
from ringsnap.agent.errors import Conflict
from ringsnap.agent.node import NodeAgent
from ringsnap.agent.restore.model import check_operation_id
from ringsnap.agent.s3.client import make_client
from ringsnap.agent.s3.crypto.envelope import HEADER_SIZE
from ringsnap.agent.s3.crypto.recipients import Identity
from ringsnap.agent.s3.crypto.sealing import is_sealed, key_problem
from ringsnap.agent.s3.layout import Layout, node_name
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.agent.staging.s3 import S3Restore
from ringsnap.agent.staging.s3_check import (
    DownloadCheck,
    commitlog_size,
    object_missing,
    room_of,
)
from ringsnap.agent.staging.s3_keys import identities_of
from ringsnap.agent.staging.s3_paths import marker_backup
from ringsnap.api.v1 import agent_pb2
from ringsnap.errors import ValidationError
from ringsnap.names import backup_id as valid_backup_id

log = logs.get_logger(__name__)


@dataclass(frozen=True)
class Discarded:
    path: str
    files: int
    bytes: int


def _tree_size(root: Path) -> tuple[int, int]:
    """(files, bytes) below `root`, symbolic links counted as files and never followed."""
    files = size = 0
    for directory, _subdirectories, names in os.walk(root):
        for name in names:
            files += 1
            try:
                size += os.lstat(os.path.join(directory, name)).st_size
            except FileNotFoundError:
                continue
    return files, size


class S3Staging:
    """The plan's cheap check and the discard of one node (blocking methods: run them in
    threads). `downloading(run_id)` says whether that operation's download runs here."""

    def __init__(
        self,
        restores: S3Restore,
        downloading: Callable[[str], bool],
        *,
        client: Callable[[S3Settings], Any] = make_client,
    ) -> None:
        self.restores = restores
        self.downloading = downloading
        self.client = client

    # -- the plan --------------------------------------------------------------------------------

    def check_room(
        self,
        run_id: str,
        backup_id: str,
        node: str,
        expected_bytes: int,
        identities: Sequence[Identity] = (),
    ) -> DownloadCheck:
        valid_backup_id(backup_id)
        node_name(node)
        if expected_bytes < 0:
            raise ValidationError(f"expected_bytes: {expected_bytes} is negative")
        restores = self.restores
        roots = restores.staging(run_id)
        staged = any(os.path.lexists(root) for root in roots)
        complete = staged and marker_backup(roots[0]) == backup_id
        directories = restores.data_directories
        one_filesystem = len({os.stat(d).st_dev for d in directories}) <= 1
        if not complete and (staged or not expected_bytes or not one_filesystem):
            return restores.check(run_id, backup_id, node, identities)
        settings = restores.settings()
        client = self.client(settings)
        layout = Layout(settings.prefix)
        key = layout.manifest_key(backup_id, node)
        found, problem = True, ""
        try:
            client.head_object(Bucket=settings.bucket, Key=key)
        except Exception as exc:
            found = False
            problem = "no such object" if object_missing(exc) else f"it cannot be read: {exc}"
        if found and not complete and (identities or settings.encryption is not None):
            problem = sealed_problem(client, settings.bucket, layout, node, identities, key)
        commitlog_key = layout.commitlog_manifest_key(backup_id, node)
        commitlog_found, commitlog_bytes, commitlog_problem = commitlog_size(
            client,
            settings.bucket,
            layout,
            commitlog_key,
            backup_id=backup_id,
            node=node,
            identities=() if complete else identities,
        )
        if complete and commitlog_problem.startswith(f"{commitlog_key!r} is encrypted"):
            commitlog_problem = ""  # staged already: a resume's install needs no key
        # A complete download needs nothing more; a first one the whole copy and its commit log.
        needed = 0 if complete else expected_bytes + commitlog_bytes
        rooms = tuple(
            room_of(directory, needed if index == 0 else 0)
            for index, directory in enumerate(directories)
        )
        return DownloadCheck(
            manifest_key=key,
            manifest_found=found,
            commitlog_key=commitlog_key,
            commitlog_found=commitlog_found,
            commitlog_bytes=commitlog_bytes,
            rooms=rooms,
            problem=problem or commitlog_problem,
            download_complete=complete,
        )

    # -- giving the restore up -------------------------------------------------------------------

    def discard(self, run_id: str, backup_id: str) -> list[Discarded]:
        check_operation_id(run_id)
        valid_backup_id(backup_id)
        restores = self.restores
        if self.downloading(run_id):
            raise Conflict(
                f"the download of operation {run_id} is running on this node: stop the"
                " restore first (Ctrl-C, or wait for it to fail), then give it up again; nothing"
                " was removed"
            )
        record = restores.records.load(run_id)
        if record is not None:
            raise Conflict(
                f"operation {run_id} began installing on this node ({record.phase}: files"
                " were moved in Cassandra's table directories); it cannot be given up: resume the"
                f" restore (ringsnap restore --resume {run_id}); nothing was removed"
            )
        roots = restores.staging(run_id)
        marker = marker_backup(roots[0])
        if marker and marker != backup_id:
            raise Conflict(
                f"{roots[0]} holds a download of backup {marker}, not {backup_id}; nothing was"
                " removed: inspect it"
            )
        for root in roots:
            if root.is_symlink() or (root.exists() and not root.is_dir()):
                raise Conflict(
                    f"{root} is not a directory this agent made (a symbolic link or a file);"
                    " nothing was removed: inspect it"
                )
        removed: list[Discarded] = []
        for root in roots:
            if not root.exists():
                continue
            files, size = _tree_size(root)
            shutil.rmtree(root)
            removed.append(Discarded(str(root), files, size))
            log.warning(
                "staging of a restore from S3 removed: the restore is given up",
                run_id=run_id,
                backup_id=backup_id,
                path=str(root),
                files=files,
                bytes=size,
            )
            with contextlib.suppress(OSError):  # .ringsnap-s3 itself, once no other restore uses it
                root.parent.rmdir()
        return removed


def sealed_problem(  # noqa: PLR0917 - the object, where it is and the restore's keys
    client: Any, bucket: str, layout: Layout, node: str, identities: Sequence[Identity], key: str
) -> str:
    """With keys given (or an encrypting node): the manifest object's first bytes only (one small
    ranged GET), and whether the keys open it when it is encrypted."""
    try:
        body = client.get_object(Bucket=bucket, Key=key, Range=f"bytes=0-{HEADER_SIZE - 1}")["Body"]
        try:
            head = body.read(HEADER_SIZE)
        finally:
            body.close()
    except Exception as exc:
        return f"it cannot be read: {exc}"
    if not is_sealed(head):
        return ""
    return key_problem(client, bucket, layout, node, identities, key=key, head=head)


def check_response(done: DownloadCheck) -> agent_pb2.CheckS3DownloadResponse:
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


class S3StagingRpcs:
    """CheckS3Room and DiscardS3Download for the servicer (which maps errors to statuses)."""

    def __init__(self, agent: NodeAgent, downloading: Callable[[str], bool]) -> None:
        self._agent = agent
        self._downloading = downloading

    @cached_property
    def _staging(self) -> S3Staging:
        return S3Staging(S3Restore.of(self._agent.config, self._agent.restorer), self._downloading)

    async def check_room(
        self, request: agent_pb2.CheckS3RoomRequest
    ) -> agent_pb2.CheckS3DownloadResponse:
        check_operation_id(request.run_id)
        identities = identities_of(request.keys, self._staging.restores.encryption())
        done = await asyncio.to_thread(
            self._staging.check_room,
            request.run_id,
            request.backup_id,
            request.node,
            request.expected_bytes,
            identities,
        )
        return check_response(done)

    async def discard(
        self, request: agent_pb2.DiscardS3DownloadRequest
    ) -> agent_pb2.DiscardS3DownloadResponse:
        removed = await asyncio.to_thread(self._staging.discard, request.run_id, request.backup_id)
        return agent_pb2.DiscardS3DownloadResponse(
            removed=[
                agent_pb2.DiscardedStaging(path=d.path, files=d.files, bytes=d.bytes)
                for d in removed
            ]
        )
