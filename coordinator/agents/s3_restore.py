"""`S3RestorePort` over the agent's mutual-TLS channel: the port's values to v1 messages and back."""

from __future__ import annotations

from collections.abc import Callable

from ringsnap.api.v1 import agent_pb2
from ringsnap.coordinator.agents.connection import AgentConnection, ClientTls
from ringsnap.coordinator.restore.s3_keys import NO_KEYS, RestoreKeys
from ringsnap.coordinator.restore.s3_ports import (
    DiscardedStaging,
    DownloadProgress,
    InstalledCopy,
    S3Download,
    S3DownloadCheck,
    S3Room,
    StagedCopy,
)

#: A download moves the node's whole copy; the install renames files; the commit log is small.
DOWNLOAD_TIMEOUT_SECONDS = 6 * 3600.0
INSTALL_TIMEOUT_SECONDS = 1800.0
#: The plan's check reads the node's manifest object (a few MiB for a large node).
CHECK_TIMEOUT_SECONDS = 300.0


class GrpcS3Restore(AgentConnection):
    """`S3RestorePort` over the agent's mutual-TLS channel."""

    def __init__(self, node: str, address: str, tls: ClientTls, *, call_timeout: float = 60.0):
        super().__init__(f"node {node}", address, tls, call_timeout=call_timeout)

    async def download_from_s3(
        self, download: S3Download, progress: Callable[[DownloadProgress], None]
    ) -> StagedCopy:
        target = download.target
        request = agent_pb2.DownloadFromS3Request(
            run_id=download.operation_id,
            backup_id=download.backup_id,
            node=download.node,
            keyspace=download.keyspace,
            table=download.table,
            target_keyspace=target[0] if target else "",
            target_table=target[1] if target else "",
            keys=key_messages(download.keys),
        )
        result: agent_pb2.S3DownloadResult | None = None
        with self._calling("DownloadFromS3"):
            async for message in self._stub.DownloadFromS3(
                request, timeout=DOWNLOAD_TIMEOUT_SECONDS
            ):
                if message.HasField("progress"):
                    p = message.progress
                    progress(
                        DownloadProgress(
                            files_total=p.files_total,
                            bytes_total=p.bytes_total,
                            files_done=p.files_done,
                            bytes_done=p.bytes_done,
                            bytes_downloaded=p.bytes_downloaded,
                            rate_bytes_per_second=p.rate_bytes_per_second,
                            eta_seconds=None if p.eta_seconds < 0 else p.eta_seconds,
                        )
                    )
                elif message.HasField("result"):
                    result = message.result
        if result is None:
            raise ConnectionError(
                f"node {download.node}: DownloadFromS3 ended without a result; run the restore"
                " again"
            )
        return StagedCopy(
            components=result.components,
            bytes_total=result.bytes_total,
            files_downloaded=result.files_downloaded,
            bytes_downloaded=result.bytes_downloaded,
            files_kept=result.files_kept,
            seconds=result.seconds,
            staging_directories=tuple(result.staging_directories),
            commitlog=result.commitlog,
        )

    async def check_s3_download(
        self, run_id: str, backup_id: str, node: str, keys: RestoreKeys = NO_KEYS
    ) -> S3DownloadCheck:
        request = agent_pb2.CheckS3DownloadRequest(
            run_id=run_id, backup_id=backup_id, node=node, keys=key_messages(keys)
        )
        with self._calling("CheckS3Download"):
            reply = await self._stub.CheckS3Download(request, timeout=CHECK_TIMEOUT_SECONDS)
        return check_of(reply)

    async def check_s3_room(
        self,
        run_id: str,
        backup_id: str,
        node: str,
        expected_bytes: int,
        keys: RestoreKeys = NO_KEYS,
    ) -> S3DownloadCheck:
        request = agent_pb2.CheckS3RoomRequest(
            run_id=run_id,
            backup_id=backup_id,
            node=node,
            expected_bytes=expected_bytes,
            keys=key_messages(keys),
        )
        with self._calling("CheckS3Room"):
            reply = await self._stub.CheckS3Room(request, timeout=CHECK_TIMEOUT_SECONDS)
        return check_of(reply)

    async def discard_s3_download(
        self, run_id: str, backup_id: str
    ) -> tuple[DiscardedStaging, ...]:
        request = agent_pb2.DiscardS3DownloadRequest(run_id=run_id, backup_id=backup_id)
        with self._calling("DiscardS3Download"):
            reply = await self._stub.DiscardS3Download(request, timeout=INSTALL_TIMEOUT_SECONDS)
        return tuple(DiscardedStaging(d.path, d.files, d.bytes) for d in reply.removed)

    async def install_s3_download(self, run_id: str, backup_id: str) -> InstalledCopy:
        request = agent_pb2.InstallS3DownloadRequest(run_id=run_id, backup_id=backup_id)
        with self._calling("InstallS3Download"):
            reply = await self._stub.InstallS3Download(request, timeout=INSTALL_TIMEOUT_SECONDS)
        return InstalledCopy(
            tables=len(reply.tables),
            files_placed=sum(t.files_linked for t in reply.tables),
            files_kept_aside=sum(t.files_moved for t in reply.tables),
        )

    async def install_s3_commitlog(self, run_id: str, backup_id: str, node: str) -> str:
        request = agent_pb2.InstallS3DownloadRequest(
            run_id=run_id, backup_id=backup_id, node=node, commitlog=True
        )
        with self._calling("InstallS3Download"):
            reply = await self._stub.InstallS3Download(request, timeout=INSTALL_TIMEOUT_SECONDS)
        return reply.commitlog


def key_messages(keys: RestoreKeys) -> list[agent_pb2.RestoreKey]:
    """The restore's keys as a request carries them (the channel is the agent's mutual TLS)."""
    return [agent_pb2.RestoreKey(kind="age", secret=secret) for secret in keys.age] + [
        agent_pb2.RestoreKey(kind="kms", secret=line) for line in keys.kms
    ]


def check_of(reply: agent_pb2.CheckS3DownloadResponse) -> S3DownloadCheck:
    """The agent's answer to CheckS3Download or CheckS3Room."""
    return S3DownloadCheck(
        manifest_key=reply.manifest_key,
        manifest_found=reply.manifest_found,
        commitlog_key=reply.commitlog_key,
        commitlog_found=reply.commitlog_found,
        commitlog_bytes=reply.commitlog_bytes,
        rooms=tuple(
            S3Room(r.data_directory, r.bytes_needed, r.free_bytes, r.filesystem)
            for r in reply.rooms
        ),
        problem=reply.problem,
        download_complete=reply.download_complete,
    )
