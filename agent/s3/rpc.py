"""The ExportToS3 RPC: one export of this node at a time, run in a worker thread, its progress
streamed to the caller.

Order of the bucket's writes: the commit-log segments and their list object, then the SSTable
components, then the SSTable manifest object (last: the node is exported once it exists).

A caller that goes away (a cut RPC, a cancelled coordinator) stops the export: the engine checks a
cancel event between files and while it waits for one, cancels the transfers in flight, gives them a
few seconds and closes every file they opened, so that the clones it read can be unmounted. An
UnmountClones of those clones, and the next export of the node, wait for the worker to be gone (a
bounded wait; the next export is refused meanwhile, naming the running backup).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator, Callable, Generator, Iterator, Sequence
from dataclasses import dataclass

from ringsnap.agent.clones import CloneMounter
from ringsnap.agent.config import AgentConfig
from ringsnap.agent.errors import Conflict
from ringsnap.agent.manifest import SSTable, manifest
from ringsnap.agent.metrics import AgentMetrics
from ringsnap.agent.s3.client import make_client
from ringsnap.agent.s3.commitlog import CommitlogExport, export_commitlog
from ringsnap.agent.s3.export import (
    CANCEL_GRACE_SECONDS,
    ExportCancelled,
    ExportResult,
    export_node,
)
from ringsnap.agent.s3.layout import node_name
from ringsnap.agent.s3.progress import Progress, Tracker
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.agent.s3.sources import ExportSource, clone_source, native_source
from ringsnap.api.v1 import agent_pb2
from ringsnap.errors import ValidationError
from ringsnap.logs import get_logger
from ringsnap.names import backup_id as valid_backup_id
from ringsnap.names import snapshot_tag

log = get_logger(__name__)


#: How long an unmount of the clones a cancelled export reads, or a new export, waits for its
#: worker to stop: the engine's grace for the transfers in flight, then their files are closed.
CANCELLED_WIND_DOWN_SECONDS = CANCEL_GRACE_SECONDS + 10.0
#: The longest the stream stays silent while the export works: the last progress is sent again.
#: The coordinator treats a far longer silence as a lost node (coordinator/export/workflow.py).
HEARTBEAT_SECONDS = 5.0


@dataclass(frozen=True)
class ExportRequest:
    backup_id: str
    node: str
    run_id: str = ""
    snapshot_tag: str = ""

    @classmethod
    def of(cls, request: agent_pb2.ExportToS3Request) -> ExportRequest:
        valid_backup_id(request.backup_id)
        node_name(request.node)
        if bool(request.run_id) == bool(request.snapshot_tag):
            raise ValidationError(
                "ExportToS3 needs exactly one of run_id (mounted clones) and snapshot_tag"
                " (a native snapshot)"
            )
        if request.snapshot_tag:
            snapshot_tag(request.snapshot_tag, "snapshot_tag")
        return cls(request.backup_id, request.node, request.run_id, request.snapshot_tag)


def copy_recipients(settings: S3Settings) -> list[str]:
    """Who an export of this node encrypts for (what its key objects name), or [] in plain text."""
    encryption = settings.encryption
    if encryption is None:
        return []
    return [f"age:{r}" for r in encryption.recipients] + [f"kms:{k}" for k in encryption.kms_keys]


def progress_message(phase: str, progress: Progress) -> agent_pb2.ExportToS3Response:
    return agent_pb2.ExportToS3Response(
        progress=agent_pb2.S3ExportProgress(
            phase=phase,
            files_uploaded=progress.files_transferred,
            bytes_uploaded=progress.bytes_transferred,
            **progress.message_fields(),
        )
    )


def result_message(
    sstables: ExportResult,
    commitlog: CommitlogExport,
    note: str,
    seconds: float,
    recipients: Sequence[str] = (),
) -> agent_pb2.ExportToS3Response:
    return agent_pb2.ExportToS3Response(
        result=agent_pb2.S3ExportResult(
            manifest_key=sstables.manifest_key,
            components=sstables.components,
            bytes_total=sstables.bytes_total,
            files_uploaded=sstables.files_uploaded,
            bytes_uploaded=sstables.bytes_uploaded,
            multipart_uploads_aborted=sstables.multipart_uploads_aborted,
            commitlog_key=commitlog.manifest_key,
            commitlog_segments=commitlog.segments,
            commitlog_bytes=commitlog.bytes_total,
            commitlog_segments_uploaded=commitlog.segments_uploaded,
            commitlog_bytes_uploaded=commitlog.bytes_uploaded,
            commitlog_note=note,
            seconds=seconds,
            recipients=list(recipients),
        )
    )


class S3Exports:
    """ExportToS3 of one agent."""

    def __init__(
        self,
        config: Callable[[], AgentConfig],
        clones: Callable[[], CloneMounter],
        metrics: Callable[[], AgentMetrics] | None = None,
    ) -> None:
        # Read on first use: a servicer is also built around agents that never export.
        self._config_of = config
        self._metrics_of = metrics or AgentMetrics
        self._clones = clones
        self._lock = threading.Lock()
        self._running: str | None = None
        #: Set while no export runs; a cancelled export's worker winds down before the next.
        self._idle = threading.Event()
        self._idle.set()
        self._cancelled: threading.Event | None = None
        #: The clones' purpose the running export reads ('' for a native snapshot).
        self._purpose = ""

    @property
    def _config(self) -> AgentConfig:
        return self._config_of()

    def _source(self, request: ExportRequest) -> ExportSource:
        cassandra = self._config.cassandra
        if request.snapshot_tag:
            return native_source(cassandra, request.snapshot_tag)
        mounter = self._clones()
        mounted = mounter.mounted(request.run_id)  # NotFound / Conflict when not all mounted
        record = mounter.records.load(request.run_id)
        return clone_source(
            cassandra,
            request.run_id,
            mounted,
            read_only=record is not None and record.read_only,
        )

    async def release_purpose(self, run_id: str) -> None:
        """Before the clones of `run_id` are unmounted: an export still reading them (its
        caller gone, its worker winding down) is stopped and waited for, so that the unmount
        does not find the clones busy."""
        with self._lock:
            cancelled = self._cancelled
            reading = self._running is not None and self._purpose == run_id
        if not reading:
            return
        if cancelled is not None:
            cancelled.set()
        log.warning("stopping the export that reads these clones", run_id=run_id)
        if not await asyncio.to_thread(self._idle.wait, CANCELLED_WIND_DOWN_SECONDS):
            log.error(
                "the export reading these clones did not stop in time; unmounting anyway (a busy"
                " clone stays mounted and the unmount fails)",
                run_id=run_id,
                seconds=CANCELLED_WIND_DOWN_SECONDS,
            )

    async def export(
        self, message: agent_pb2.ExportToS3Request
    ) -> AsyncGenerator[agent_pb2.ExportToS3Response, None]:
        request = ExportRequest.of(message)
        settings = self._config.s3
        if settings is None:
            raise Conflict(
                "this agent has no [s3] section in its configuration: it cannot export (see"
                " docs/s3.md)"
            )
        source = self._source(request)
        previous = self._cancelled
        if previous is not None and previous.is_set():
            # Its caller went away: the worker stops at its next check (seconds at most).
            await asyncio.to_thread(self._idle.wait, CANCELLED_WIND_DOWN_SECONDS)
        cancelled = threading.Event()
        with self._lock:
            if self._running is not None:
                raise Conflict(
                    f"an export of this node is running (backup {self._running}); wait for it to"
                    " finish, then ask again"
                )
            self._running = request.backup_id
            self._idle.clear()
            self._cancelled = cancelled
            self._purpose = request.run_id
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[agent_pb2.ExportToS3Response] = asyncio.Queue(maxsize=64)
        metrics = self._metrics_of()

        def send(item: agent_pb2.ExportToS3Response) -> None:
            def put() -> None:
                if not queue.full():  # progress may be dropped; the caller gets the next one
                    queue.put_nowait(item)

            loop.call_soon_threadsafe(put)

        def reporter(phase: str) -> Callable[[Progress], None]:
            def report(progress: Progress) -> None:
                # Called from the transfer threads: never raises (the engine sees the cancel).
                if not cancelled.is_set():
                    send(progress_message(phase, progress))

            return metrics.meter("upload", report)

        opened: list[Generator[list[SSTable], None, None]] = []

        def checked(batches: Iterator[list[SSTable]]) -> Generator[list[SSTable], None, None]:
            try:
                for batch in batches:
                    if cancelled.is_set():
                        raise ExportCancelled(
                            f"node {request.node}: export cancelled by its caller"
                        )
                    yield batch
            finally:
                close = getattr(batches, "close", None)
                if close is not None:
                    close()  # its directory descriptors: the clones must not stay busy

        def walk_manifest() -> Iterator[list[SSTable]]:
            walk = checked(manifest(roots, tag=source_tag))
            opened.append(walk)
            return walk

        roots = list(source.data_directories)
        source_tag = source.snapshot_tag

        def work() -> agent_pb2.ExportToS3Response:
            client = make_client(settings)
            started = loop.time()
            commitlog = export_commitlog(
                client,
                settings,
                backup_id=request.backup_id,
                node=request.node,
                directory=source.commitlog_directory,
                progress=reporter("commitlog"),
                cancel=cancelled,
            )
            try:
                sstables = export_node(
                    client,
                    settings,
                    backup_id=request.backup_id,
                    node=request.node,
                    data_directories=roots,
                    manifest=walk_manifest,
                    progress=reporter("sstables"),
                    cancel=cancelled,
                )
            finally:
                # An abandoned walk (a failure, a cut) would hold directories of the clones open
                # until garbage collected: the unmount that follows would find them busy.
                for walk in opened:
                    walk.close()
            return result_message(
                sstables,
                commitlog,
                source.commitlog_note,
                loop.time() - started,
                copy_recipients(settings),
            )

        def release(done: asyncio.Future[agent_pb2.ExportToS3Response]) -> None:
            with self._lock:
                self._running = None
                self._idle.set()
            # Retrieved here too: once its caller is gone, nobody else will ("never retrieved").
            error = None if done.cancelled() else done.exception()
            if error is not None and not cancelled.is_set():
                metrics.transfer_failed("upload")
            if isinstance(error, ExportCancelled):
                log.info("export to S3 stopped after its cancel", backup=request.backup_id)
            elif error is not None and cancelled.is_set():
                log.warning(
                    "export to S3 failed after its caller went away",
                    backup=request.backup_id,
                    error=str(error)[:500],
                )

        log.info(
            "export to S3 starts",
            backup=request.backup_id,
            node=request.node,
            run_id=request.run_id,
            snapshot_tag=request.snapshot_tag,
            commitlog=str(source.commitlog_directory or ""),
        )
        future = loop.run_in_executor(None, work)
        future.add_done_callback(release)
        # What the caller saw last, sent again when nothing moved for HEARTBEAT_SECONDS (a long
        # count, listing or commit-log segment): the caller's silence deadline then means "lost".
        last = progress_message("starting", Tracker(0, 0, None).snapshot())
        getter: asyncio.Future[agent_pb2.ExportToS3Response] | None = None
        try:
            while not future.done():
                getter = getter or asyncio.ensure_future(queue.get())
                await asyncio.wait(
                    {getter, future},
                    timeout=HEARTBEAT_SECONDS,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if getter.done():
                    last, getter = getter.result(), None
                    yield last
                elif not future.done():
                    yield last
            if getter is not None and getter.done():
                yield getter.result()
            while not queue.empty():
                yield queue.get_nowait()
            yield future.result()
        finally:
            if getter is not None and not getter.done():
                getter.cancel()  # not left pending on the agent's loop (a caller gone)
            if not future.done():
                cancelled.set()
                log.warning(
                    "export to S3 cancelled by its caller; stopping the uploads",
                    backup=request.backup_id,
                    node=request.node,
                )
