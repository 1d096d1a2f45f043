"""The gRPC servicer: messages to domain calls and back, and domain errors to status codes (once).

Nothing here decides anything; `NodeAgent` does. A request that fails validation is answered with
INVALID_ARGUMENT before anything on the node changes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator
from functools import partial
from pathlib import Path

import grpc
import grpc.aio

from ringsnap import logs
from ringsnap.agent import errors as agent_errors
from ringsnap.agent import manifest
from ringsnap.agent.clones import CloneMounter, CloneVolume
from ringsnap.agent.drill.host import DrillHost, TooManyDrills
from ringsnap.agent.initiators import read_initiators
from ringsnap.agent.messages import (
    drill_request,
    drill_status_message,
    freeze_message,
    manifest_batch_message,
    mounted_clones_message,
    node_info_message,
    thaw_message,
)
from ringsnap.agent.node import NodeAgent
from ringsnap.agent.pitr.node_side import PitrNode
from ringsnap.agent.restore.messages import (
    discarded_message,
    node_volume_message,
    restored_message,
    volume_state_message,
)
from ringsnap.agent.rpc_delegation import Delegated, DelegatedStream, Request, Response
from ringsnap.agent.s3.download import DownloadCancelled, DownloadRefused
from ringsnap.agent.s3.export import ExportFailed
from ringsnap.agent.s3.purge import PurgeFailed
from ringsnap.agent.s3.rpc import S3Exports
from ringsnap.agent.staging.s3_room import S3StagingRpcs
from ringsnap.agent.staging.s3_rpc import S3RestoreRpcs
from ringsnap.agent.staging.table_rpc import TableImportRpcs
from ringsnap.api.v1 import agent_pb2, agent_pb2_grpc
from ringsnap.errors import ValidationError
from ringsnap.rpcerrors import Context, ErrorStatuses
from ringsnap.wire import duration, seconds_of, unix_timestamp

log = logs.get_logger(__name__)

#: The one place where domain errors become status codes (most specific class first).
STATUS_FOR_ERROR: tuple[tuple[type[Exception], grpc.StatusCode], ...] = (
    (ValidationError, grpc.StatusCode.INVALID_ARGUMENT),
    (agent_errors.NotFound, grpc.StatusCode.NOT_FOUND),
    (TooManyDrills, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (agent_errors.AlreadyExists, grpc.StatusCode.ALREADY_EXISTS),
    (agent_errors.Conflict, grpc.StatusCode.FAILED_PRECONDITION),
    (agent_errors.CommandTimeout, grpc.StatusCode.DEADLINE_EXCEEDED),
    (agent_errors.CommandFailed, grpc.StatusCode.UNAVAILABLE),
    (agent_errors.FreezeFailed, grpc.StatusCode.INTERNAL),
    # S3 copies (their RPCs come with the coordinator's orchestration of exports).
    (ExportFailed, grpc.StatusCode.FAILED_PRECONDITION),
    (DownloadRefused, grpc.StatusCode.DATA_LOSS),
    (DownloadCancelled, grpc.StatusCode.CANCELLED),
    (PurgeFailed, grpc.StatusCode.FAILED_PRECONDITION),
)

STATUSES = ErrorStatuses(
    STATUS_FOR_ERROR, internal="internal error in the agent; see its log", log=log
)
status_for = STATUSES.code_for
unary = STATUSES.unary


def delegated(
    component: Callable[[AgentServicer], Callable[[Request], Awaitable[Response]]],
) -> Delegated[AgentServicer, Request, Response]:
    return Delegated(component, STATUSES)


def delegated_stream(
    component: Callable[[AgentServicer], Callable[[Request], AsyncGenerator[Response, None]]],
) -> DelegatedStream[AgentServicer, Request, Response]:
    return DelegatedStream(component, STATUSES)


# -- the servicer ----------------------------------------------------------------------------------


class AgentServicer(agent_pb2_grpc.AgentServiceServicer):
    #: Where the host's initiator files are read (`agent.initiators`); tests point it elsewhere.
    initiators_root = Path("/")

    def __init__(
        self,
        agent: NodeAgent,
        clones: CloneMounter | None = None,
        drills: DrillHost | None = None,
        pitr: PitrNode | None = None,
    ) -> None:
        self._agent = agent
        self._pitr_made = pitr
        self._table_imports = TableImportRpcs(agent)
        self._s3_restores = S3RestoreRpcs(agent)
        # Staging is never discarded under its own download (its running ones, by operation id).
        self._s3_staging = S3StagingRpcs(agent, self._s3_restores.downloading)
        self._s3_exports = S3Exports(
            lambda: agent.config, lambda: self._clones, lambda: agent.metrics
        )
        self._clones_made = clones
        self._drills_made = drills

    @property
    def _clones(self) -> CloneMounter:
        # Made on first use: `AgentServer` passes its own (it recovers them at start).
        if self._clones_made is None:
            volumes = self._agent.config.volumes
            self._clones_made = CloneMounter(volumes, volumes.state_directory)
        return self._clones_made

    @property
    def _drills(self) -> DrillHost:
        if self._drills_made is None:
            config = self._agent.config
            self._drills_made = DrillHost(
                config.drill, self._clones, config.volumes.state_directory
            )
        return self._drills_made

    @unary
    async def GetNodeInfo(
        self, request: agent_pb2.GetNodeInfoRequest, context: Context
    ) -> agent_pb2.NodeInfo:
        return node_info_message(await self._agent.node_info())

    @unary
    async def FlushMemtables(
        self, request: agent_pb2.FlushMemtablesRequest, context: Context
    ) -> agent_pb2.FlushMemtablesResponse:
        seconds = await self._agent.flush(request.keyspace, list(request.tables))
        return agent_pb2.FlushMemtablesResponse(duration=duration(seconds))

    @unary
    async def FreezeFilesystems(
        self, request: agent_pb2.FreezeFilesystemsRequest, context: Context
    ) -> agent_pb2.FreezeFilesystemsResponse:
        lease = seconds_of(request.lease, "lease") if request.HasField("lease") else None
        result = await self._agent.freeze(
            request.run_id,
            list(request.mount_points),
            lease_seconds=lease,
            sync_first=request.sync_first,
        )
        return freeze_message(result)

    @unary
    async def RenewLease(
        self, request: agent_pb2.RenewLeaseRequest, context: Context
    ) -> agent_pb2.RenewLeaseResponse:
        lease = seconds_of(request.lease, "lease") if request.HasField("lease") else None
        expires = await self._agent.renew(request.run_id, lease)
        return agent_pb2.RenewLeaseResponse(lease_expires_at=unix_timestamp(expires))

    @unary
    async def ThawFilesystems(
        self, request: agent_pb2.ThawFilesystemsRequest, context: Context
    ) -> agent_pb2.ThawFilesystemsResponse:
        return thaw_message(await self._agent.thaw(request.run_id))

    async def GetManifest(
        self, request: agent_pb2.GetManifestRequest, context: Context
    ) -> AsyncIterator[agent_pb2.GetManifestResponse]:
        batches = partial(self._agent.manifest, request.snapshot_tag, list(request.keyspaces))
        async for message in _stream_manifest(batches, context, "GetManifest"):
            yield message

    @unary
    async def CreateSnapshot(
        self, request: agent_pb2.CreateSnapshotRequest, context: Context
    ) -> agent_pb2.CreateSnapshotResponse:
        seconds = await self._agent.create_snapshot(request.tag, list(request.keyspaces))
        return agent_pb2.CreateSnapshotResponse(duration=duration(seconds))

    @unary
    async def ClearSnapshot(
        self, request: agent_pb2.ClearSnapshotRequest, context: Context
    ) -> agent_pb2.ClearSnapshotResponse:
        await self._agent.clear_snapshot(request.tag)
        return agent_pb2.ClearSnapshotResponse()

    @unary
    async def StopCassandra(
        self, request: agent_pb2.StopCassandraRequest, context: Context
    ) -> agent_pb2.StopCassandraResponse:
        stopped = await self._agent.stop_cassandra(drain=request.drain)
        # A restore stops Cassandra to revert or empty its commit log: what it synced goes to
        # the bucket whole first (only `AgentServer`'s PitrNode has a shipper to seal).
        if self._pitr_made is not None:
            await self._pitr_made.seal()
        return agent_pb2.StopCassandraResponse(
            duration=duration(stopped.seconds), drained=stopped.drained
        )

    @unary
    async def StartCassandra(
        self, request: agent_pb2.StartCassandraRequest, context: Context
    ) -> agent_pb2.StartCassandraResponse:
        wait = seconds_of(request.wait, "wait") if request.HasField("wait") else 0.0
        seconds = await self._agent.start_cassandra(
            wait_seconds=wait, until_gossip=request.until_gossip
        )
        return agent_pb2.StartCassandraResponse(duration=duration(seconds))

    @unary
    async def GetVolumeState(
        self, request: agent_pb2.GetVolumeStateRequest, context: Context
    ) -> agent_pb2.VolumeState:
        initiators = await asyncio.to_thread(read_initiators, self.initiators_root)
        return volume_state_message(await self._agent.volume_state(), initiators)

    @unary
    async def ReleaseVolumes(
        self, request: agent_pb2.ReleaseVolumesRequest, context: Context
    ) -> agent_pb2.ReleaseVolumesResponse:
        released = await self._agent.release_volumes(request.run_id, list(request.mount_points))
        return agent_pb2.ReleaseVolumesResponse(
            volumes=[node_volume_message(volume) for volume in released]
        )

    @unary
    async def AttachVolumes(
        self, request: agent_pb2.AttachVolumesRequest, context: Context
    ) -> agent_pb2.AttachVolumesResponse:
        attached = await self._agent.attach_volumes(
            request.run_id,
            [(volume.mount_point, volume.volume_name) for volume in request.volumes],
            {volume.mount_point: volume.identity for volume in request.volumes},
        )
        return agent_pb2.AttachVolumesResponse(
            volumes=[node_volume_message(volume) for volume in attached]
        )

    async def _running(self) -> bool:
        return (await self._agent.cassandra_status()).running

    @property
    def _pitr(self) -> PitrNode:
        # Made on first use (no shipper: `AgentServer` passes its own, which ships).
        if self._pitr_made is None:
            self._pitr_made = PitrNode(self._agent.config, self._running)
        return self._pitr_made

    @unary
    async def PlacePointInTime(
        self, request: agent_pb2.PlacePointInTimeRequest, context: Context
    ) -> agent_pb2.PlacePointInTimeResponse:
        placed = await self._pitr.place(request.target_ms, dry_run=request.dry_run)
        return agent_pb2.PlacePointInTimeResponse(
            base_segment=placed.base_segment,
            segments=[
                agent_pb2.PlacedSegment(name=s.name, bytes=s.bytes, fetched=s.replaces_local)
                for s in placed.segments
            ],
            restore_point=placed.restore_point,
            bytes_fetched=placed.bytes,
        )

    @unary
    async def FinishPointInTime(
        self, request: agent_pb2.FinishPointInTimeRequest, context: Context
    ) -> agent_pb2.FinishPointInTimeResponse:
        await self._pitr.finish()
        return agent_pb2.FinishPointInTimeResponse()

    @unary
    async def DiscardReplayState(
        self, request: agent_pb2.DiscardReplayStateRequest, context: Context
    ) -> agent_pb2.DiscardReplayStateResponse:
        discarded = await self._agent.discard_replay_state(request.run_id, hints=request.hints)
        return discarded_message(discarded)

    @unary
    async def RestoreSnapshot(
        self, request: agent_pb2.RestoreSnapshotRequest, context: Context
    ) -> agent_pb2.RestoreSnapshotResponse:
        tables = await self._agent.restore_snapshot(request.run_id, request.tag)
        return restored_message(tables)

    @unary
    async def MountClones(
        self, request: agent_pb2.MountClonesRequest, context: Context
    ) -> agent_pb2.MountClonesResponse:
        mounts = await self._clones.mount(
            request.run_id,
            [
                CloneVolume(
                    v.role, v.array, v.volume, v.serial, v.wwn, v.source_mount_point, v.fs_uuid
                )
                for v in request.volumes
            ],
            read_only=request.read_only,
        )
        return mounted_clones_message(mounts)

    @unary
    async def UnmountClones(
        self, request: agent_pb2.UnmountClonesRequest, context: Context
    ) -> agent_pb2.UnmountClonesResponse:
        # An export of this node reading these clones is stopped first (the clones would be busy).
        await self._s3_exports.release_purpose(request.run_id)
        detached = await self._clones.unmount(request.run_id)
        return agent_pb2.UnmountClonesResponse(detached_volumes=detached)

    @unary
    async def StartDrill(
        self, request: agent_pb2.StartDrillRequest, context: Context
    ) -> agent_pb2.DrillStatus:
        return drill_status_message(await self._drills.start_drill(drill_request(request)))

    @unary
    async def GetDrill(
        self, request: agent_pb2.DrillRequest, context: Context
    ) -> agent_pb2.DrillStatus:
        return drill_status_message(self._drills.get(request.run_id))

    @unary
    async def StopDrill(
        self, request: agent_pb2.DrillRequest, context: Context
    ) -> agent_pb2.DrillStatus:
        return drill_status_message(await self._drills.stop(request.run_id))

    async def GetDrillManifest(
        self, request: agent_pb2.DrillRequest, context: Context
    ) -> AsyncIterator[agent_pb2.GetManifestResponse]:
        batches = partial(self._drills.manifest, request.run_id)
        async for message in _stream_manifest(batches, context, "GetDrillManifest"):
            yield message

    # -- handed whole to a component: table-level restores (ringsnap.agent.staging.table_rpc),
    # restores from S3 (ringsnap.agent.staging.s3_rpc, .s3_room), export (ringsnap.agent.s3.rpc)

    GetStagingSpace = delegated(lambda servicer: servicer._table_imports.get_staging_space)
    StageTable = delegated(lambda servicer: servicer._table_imports.stage_table)
    ImportStagedTable = delegated(lambda servicer: servicer._table_imports.import_staged_table)
    RemoveStaging = delegated(lambda servicer: servicer._table_imports.remove_staging)
    DownloadFromS3 = delegated_stream(lambda servicer: servicer._s3_restores.download)
    InstallS3Download = delegated(lambda servicer: servicer._s3_restores.install)
    CheckS3Download = delegated(lambda servicer: servicer._s3_restores.check)
    CheckS3Room = delegated(lambda servicer: servicer._s3_staging.check_room)
    DiscardS3Download = delegated(lambda servicer: servicer._s3_staging.discard)
    ExportToS3 = delegated_stream(lambda servicer: servicer._s3_exports.export)


async def _stream_manifest(
    open_batches: Callable[[], Iterator[list[manifest.SSTable]]], context: Context, method: str
) -> AsyncIterator[agent_pb2.GetManifestResponse]:
    """A manifest as a stream of batch messages. Walking the tree and building each message run in
    a worker thread (a node's manifest can be a million files); the walk is closed however the
    stream ends (a client gone mid-stream included), and an error aborts with its mapped status."""
    loop = asyncio.get_running_loop()
    batches: Iterator[list[manifest.SSTable]] | None = None
    try:
        batches = open_batches()
        while True:
            message = await loop.run_in_executor(None, _next_message, batches)
            if message is None:
                return
            yield message
    except (asyncio.CancelledError, grpc.aio.AbortError):
        raise
    except Exception as exc:
        await STATUSES.abort(context, exc, method)
    finally:
        if batches is not None:
            await loop.run_in_executor(None, _close, batches)


def _next_message(
    batches: Iterator[list[manifest.SSTable]],
) -> agent_pb2.GetManifestResponse | None:
    # Runs in a worker thread: the walk and the message building both stay off the event loop.
    batch = next(batches, None)
    return None if batch is None else manifest_batch_message(batch)


def _close(batches: Iterator[list[manifest.SSTable]]) -> None:
    close = getattr(batches, "close", None)
    if close is not None:
        close()
