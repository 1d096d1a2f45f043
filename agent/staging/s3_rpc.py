"""DownloadFromS3, CheckS3Download and InstallS3Download on the node: the download in a worker
thread with its progress streamed, one download per operation at a time (a rerun waits for a
cancelled one to stop); the install is the node's (`NodeAgent.install_s3_download`), translated."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator
from functools import cached_property
from pathlib import Path

from ringsnap import logs
from ringsnap.agent.clones import CLONES_DIRECTORY
from ringsnap.agent.errors import Conflict
from ringsnap.agent.metrics import AgentMetrics
from ringsnap.agent.node import NodeAgent
from ringsnap.agent.restore.messages import restored_table_messages
from ringsnap.agent.restore.model import check_operation_id
from ringsnap.agent.s3.progress import Progress
from ringsnap.agent.staging.s3 import S3Restore, StagedDownload
from ringsnap.agent.staging.s3_keys import identities_of
from ringsnap.agent.staging.s3_room import check_response
from ringsnap.agent.staging.table import TableImporter, restore_id
from ringsnap.api.v1 import agent_pb2
from ringsnap.errors import ValidationError

log = logs.get_logger(__name__)

#: How long a new download waits for a cancelled one of the same operation to stop.
CANCELLED_WIND_DOWN_SECONDS = 60.0


def progress_message(progress: Progress) -> agent_pb2.DownloadFromS3Response:
    return agent_pb2.DownloadFromS3Response(
        progress=agent_pb2.S3DownloadProgress(
            bytes_downloaded=progress.bytes_transferred, **progress.message_fields()
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

    async def _wait_for_previous(self, run_id: str) -> None:
        """Returns once no download of `run_id` runs (the caller registers its own before
        its next await); a running one that was not cancelled is refused."""
        while (previous := self._running.get(run_id)) is not None:
            cancel, work = previous
            if not cancel.is_set():
                raise Conflict(
                    f"a download for operation {run_id} is already running on this node;"
                    " wait for it to end (or cancel it), then ask again"
                )
            done, _ = await asyncio.wait({work}, timeout=CANCELLED_WIND_DOWN_SECONDS)
            if not done:
                raise Conflict(
                    f"the cancelled download for operation {run_id} has not stopped within"
                    f" {CANCELLED_WIND_DOWN_SECONDS:g} s; ask again in a minute"
                )
            self._forget(run_id, work)  # its done callback may not have run yet

    @cached_property
    def _metrics(self) -> AgentMetrics:
        # Unit tests drive these calls without a whole agent: a registry nobody serves then.
        found = getattr(self._agent, "metrics", None)
        return found if isinstance(found, AgentMetrics) else AgentMetrics()

    @cached_property
    def _restores(self) -> S3Restore:
        return S3Restore.of(self._agent.config, self._agent.restorer)

    def _table_staging(self, run_id: str, keyspace: str, table: str) -> Path:
        config = self._agent.config
        importer = TableImporter(
            config.cassandra, config.volumes.state_directory / CLONES_DIRECTORY
        )
        return importer.table_directory(run_id, keyspace, table)

    async def download(
        self, request: agent_pb2.DownloadFromS3Request
    ) -> AsyncGenerator[agent_pb2.DownloadFromS3Response, None]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Progress] = asyncio.Queue()

        def forward(progress: Progress) -> None:  # from the transfer threads
            loop.call_soon_threadsafe(queue.put_nowait, progress)

        metrics = self._metrics
        report = metrics.meter("download", forward)

        if bool(request.keyspace) != bool(request.table):
            raise ValidationError("a table download from S3 needs both keyspace and table")
        check_operation_id(request.run_id)
        identities = identities_of(request.keys, self._restores.encryption())
        await self._wait_for_previous(request.run_id)
        cancel = threading.Event()
        if request.keyspace:
            try:
                restore_id(request.run_id)
            except ValidationError as exc:
                # The table restore's id rule speaks of a "restore id": name the field.
                raise ValidationError(f"run_id: {exc}") from None
            staging = self._table_staging(
                request.run_id,
                request.target_keyspace or request.keyspace,
                request.target_table or request.table,
            )
            work = asyncio.ensure_future(
                asyncio.to_thread(
                    lambda: self._restores.download_table(
                        request.run_id,
                        request.backup_id,
                        request.node,
                        keyspace=request.keyspace,
                        table=request.table,
                        staging=staging,
                        progress=report,
                        cancel=cancel,
                        identities=identities,
                    )
                )
            )
        else:
            work = asyncio.ensure_future(
                asyncio.to_thread(
                    lambda: self._restores.download(
                        request.run_id,
                        request.backup_id,
                        request.node,
                        report,
                        cancel,
                        identities=identities,
                    )
                )
            )
        self._running[request.run_id] = (cancel, work)
        work.add_done_callback(lambda _: self._forget(request.run_id, work))

        def count_failure(done: asyncio.Future[StagedDownload]) -> None:
            if not done.cancelled() and done.exception() is not None and not cancel.is_set():
                metrics.transfer_failed("download")

        work.add_done_callback(count_failure)
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
                    run_id=request.run_id,
                    backup_id=request.backup_id,
                    node=request.node,
                )

    def downloading(self, run_id: str) -> bool:
        """Whether a download of `run_id` runs here (its staging is never discarded then)."""
        return run_id in self._running

    def _forget(self, run_id: str, work: asyncio.Future[StagedDownload]) -> None:
        if self._running.get(run_id, (None, None))[1] is work:
            del self._running[run_id]

    async def check(
        self, request: agent_pb2.CheckS3DownloadRequest
    ) -> agent_pb2.CheckS3DownloadResponse:
        check_operation_id(request.run_id)
        done = await asyncio.to_thread(
            self._restores.check,
            request.run_id,
            request.backup_id,
            request.node,
            identities_of(request.keys, self._restores.encryption()),
        )
        return check_response(done)

    async def install(
        self, request: agent_pb2.InstallS3DownloadRequest
    ) -> agent_pb2.InstallS3DownloadResponse:
        async with self._metrics.restore_step("install_s3"):
            return await self._install(request)

    async def _install(
        self, request: agent_pb2.InstallS3DownloadRequest
    ) -> agent_pb2.InstallS3DownloadResponse:
        if request.commitlog:
            done = await self._agent.install_s3_commitlog(request.run_id, request.backup_id)
            return agent_pb2.InstallS3DownloadResponse(
                commitlog_segments=done.segments, commitlog_bytes=done.bytes, commitlog=done.detail
            )
        tables = await self._agent.install_s3_download(request.run_id, request.backup_id)
        return agent_pb2.InstallS3DownloadResponse(tables=restored_table_messages(tables))
