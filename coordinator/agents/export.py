"""`ExportNodePort` over gRPC with mutual TLS: a node's agent for exports."""

from __future__ import annotations

from collections.abc import Callable

from ringsnap.api.v1 import agent_pb2
from ringsnap.coordinator.agents.clones import CloneMountingConnection
from ringsnap.coordinator.agents.connection import GrpcNodeAgent
from ringsnap.coordinator.export.ports import NodeUpload, UploadProgress
from ringsnap.coordinator.ports import AgentError

#: An upload of a whole node may take hours: its stream has no overall deadline but one on silence
#: (the workflow's PROGRESS_SILENCE_SECONDS; the agent repeats its last progress while it works),
#: and the coordinator cancels it when it stops.


def upload_progress(message: agent_pb2.S3ExportProgress) -> UploadProgress:
    return UploadProgress(
        phase=message.phase,
        files_total=message.files_total,
        bytes_total=message.bytes_total,
        files_done=message.files_done,
        bytes_done=message.bytes_done,
        bytes_uploaded=message.bytes_uploaded,
        rate_bytes_per_second=message.rate_bytes_per_second,
        eta_seconds=None if message.eta_seconds < 0 else message.eta_seconds,
    )


def node_upload(message: agent_pb2.S3ExportResult) -> NodeUpload:
    return NodeUpload(
        manifest_key=message.manifest_key,
        components=message.components,
        bytes_total=message.bytes_total,
        files_uploaded=message.files_uploaded,
        bytes_uploaded=message.bytes_uploaded,
        commitlog_segments=message.commitlog_segments,
        commitlog_bytes=message.commitlog_bytes,
        commitlog_note=message.commitlog_note,
        seconds=message.seconds,
        recipients=tuple(message.recipients),
    )


class GrpcExportNode(GrpcNodeAgent, CloneMountingConnection):
    """One node's agent at `address`, for exports (volume state, clones, ExportToS3)."""

    async def export_to_s3(
        self,
        backup_id: str,
        *,
        run_id: str = "",
        snapshot_tag: str = "",
        progress: Callable[[UploadProgress], None] | None = None,
    ) -> NodeUpload:
        request = agent_pb2.ExportToS3Request(
            backup_id=backup_id, node=self.node, run_id=run_id, snapshot_tag=snapshot_tag
        )
        result: NodeUpload | None = None
        with self._calling("ExportToS3"):
            async for message in self._stub.ExportToS3(request):
                if message.HasField("progress"):
                    if progress is not None:
                        progress(upload_progress(message.progress))
                elif message.HasField("result"):
                    result = node_upload(message.result)
        if result is None:
            raise AgentError(
                f"node {self.node} ({self.address}): ExportToS3 ended without a result; run the"
                " export again"
            )
        return result
