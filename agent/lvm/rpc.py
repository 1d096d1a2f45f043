"""`NodeSnapshotService`: v1 messages to `NodeSnapshots` calls and back, provider errors to status
codes (once). lvm2 runs in a worker thread; the event loop keeps serving freezes and renewals."""

from __future__ import annotations

import asyncio

import grpc

from ringsnap import logs
from ringsnap.agent.lvm.snapshots import LocalSnapshotInfo, NodeSnapshots
from ringsnap.agent.lvm.space import SpaceReport
from ringsnap.agent.metrics import AgentMetrics
from ringsnap.api.v1 import node_snapshots_pb2 as pb
from ringsnap.api.v1 import node_snapshots_pb2_grpc as pb_grpc
from ringsnap.errors import ValidationError
from ringsnap.plugins.errors import (
    AlreadyExistsError,
    ArrayTimeoutError,
    BusyError,
    DriverError,
    NotFoundError,
    QuotaExceededError,
    UnsupportedError,
)
from ringsnap.rpcerrors import Context, ErrorStatuses
from ringsnap.snapshot_wire import ref_message, ref_of, volume_message, volume_of

log = logs.get_logger(__name__)

#: The coordinator's client maps these codes back to the same provider errors.
STATUSES = ErrorStatuses(
    (
        (ValidationError, grpc.StatusCode.INVALID_ARGUMENT),
        (NotFoundError, grpc.StatusCode.NOT_FOUND),
        (AlreadyExistsError, grpc.StatusCode.ALREADY_EXISTS),
        (QuotaExceededError, grpc.StatusCode.RESOURCE_EXHAUSTED),
        (BusyError, grpc.StatusCode.UNAVAILABLE),
        (ArrayTimeoutError, grpc.StatusCode.DEADLINE_EXCEEDED),
        (UnsupportedError, grpc.StatusCode.UNIMPLEMENTED),
        (DriverError, grpc.StatusCode.FAILED_PRECONDITION),
    ),
    internal="internal error in the agent's node snapshots; see its log",
    log=log,
)
unary = STATUSES.unary


def space_message(report: SpaceReport) -> pb.LocalSpace:
    return pb.LocalSpace(
        node=report.node,
        pools=[
            pb.PoolUsage(
                pool=f.pool,
                data_percent=f.data_percent,
                metadata_percent=f.metadata_percent,
                free_bytes=f.free_bytes,
                needed_bytes=f.needed_bytes,
            )
            for f in report.pools
        ],
        refusals=list(report.refusals),
        warnings=list(report.warnings),
    )


def record_space(metrics: AgentMetrics, report: SpaceReport) -> None:
    """Each pool's use and each volume group's room, for the agent's metrics."""
    for figure in report.pools:
        if "/" in figure.pool:
            metrics.lvm_pool_used.labels(pool=figure.pool, part="data").set(figure.data_percent)
            metrics.lvm_pool_used.labels(pool=figure.pool, part="metadata").set(
                figure.metadata_percent
            )
        else:
            metrics.lvm_free_bytes.labels(vg=figure.pool).set(figure.free_bytes)


def snapshot_message(node: str, found: LocalSnapshotInfo) -> pb.LocalSnapshot:
    info = found.info
    return pb.LocalSnapshot(
        ref=ref_message(info.ref),
        space_bytes=info.space_bytes or 0,
        space_known=info.space_bytes is not None,
        warnings=list(info.warnings),
        invalid_members=list(found.invalid),
        node=node,
    )


class NodeSnapshotServicer(pb_grpc.NodeSnapshotServiceServicer):
    """Answers for a node without `[lvm]` with FAILED_PRECONDITION naming the section."""

    def __init__(
        self, node: str, snapshots: NodeSnapshots | None, metrics: AgentMetrics | None = None
    ) -> None:
        self._node = node
        self._snapshots = snapshots
        self._metrics = metrics

    def _lvm(self) -> NodeSnapshots:
        if self._snapshots is None:
            raise DriverError(
                f"host {self._node}: the agent has no [lvm] section, so it takes no node-local"
                " snapshots; add [[lvm.volumes]] to its config or use an array for this node"
            )
        return self._snapshots

    @unary
    async def ListLocalVolumes(
        self, request: pb.ListLocalVolumesRequest, context: Context
    ) -> pb.ListLocalVolumesResponse:
        found = await asyncio.to_thread(self._lvm().volumes, request.array)
        return pb.ListLocalVolumesResponse(
            volumes=[
                pb.LocalVolume(
                    volume=volume_message(v.volume, request.array),
                    kind=v.kind,
                    directories=list(v.directories),
                )
                for v in found
            ]
        )

    @unary
    async def CheckLocalSpace(
        self, request: pb.CheckLocalSpaceRequest, context: Context
    ) -> pb.LocalSpace:
        volumes = [volume_of(v) for v in request.volumes]
        report = await asyncio.to_thread(self._lvm().space, request.array, volumes)
        if self._metrics is not None:
            record_space(self._metrics, report)
        return space_message(report)

    @unary
    async def CreateLocalSnapshot(
        self, request: pb.CreateLocalSnapshotRequest, context: Context
    ) -> pb.LocalSnapshot:
        snapshots = self._lvm()
        volumes = [volume_of(v) for v in request.volumes]
        ref = await asyncio.to_thread(snapshots.create, request.array, request.name, volumes)
        return pb.LocalSnapshot(ref=ref_message(ref), node=self._node)

    @unary
    async def GetLocalSnapshot(
        self, request: pb.LocalSnapshotRequest, context: Context
    ) -> pb.LocalSnapshot:
        found = await asyncio.to_thread(self._lvm().get, ref_of(request.ref))
        return snapshot_message(self._node, found)

    @unary
    async def ListLocalSnapshots(
        self, request: pb.ListLocalSnapshotsRequest, context: Context
    ) -> pb.ListLocalSnapshotsResponse:
        volumes = [volume_of(v) for v in request.volumes]
        found = await asyncio.to_thread(self._lvm().snapshots, request.array, volumes)
        return pb.ListLocalSnapshotsResponse(
            snapshots=[snapshot_message(self._node, item) for item in found]
        )

    @unary
    async def DeleteLocalSnapshot(
        self, request: pb.LocalSnapshotRequest, context: Context
    ) -> pb.DeleteLocalSnapshotResponse:
        await asyncio.to_thread(self._lvm().delete, ref_of(request.ref))
        return pb.DeleteLocalSnapshotResponse()

    @unary
    async def RevertLocalSnapshot(
        self, request: pb.LocalSnapshotRequest, context: Context
    ) -> pb.RevertLocalSnapshotResponse:
        merged = await asyncio.to_thread(self._lvm().revert, ref_of(request.ref))
        return pb.RevertLocalSnapshotResponse(merged=merged)

    @unary
    async def CloneLocalSnapshot(
        self, request: pb.CloneLocalSnapshotRequest, context: Context
    ) -> pb.CloneLocalSnapshotResponse:
        ref = ref_of(request.ref)
        clones = await asyncio.to_thread(self._lvm().clone, ref, request.suffix)
        return pb.CloneLocalSnapshotResponse(clones=[volume_message(v, ref.array) for v in clones])

    @unary
    async def DeleteLocalClone(
        self, request: pb.DeleteLocalCloneRequest, context: Context
    ) -> pb.DeleteLocalCloneResponse:
        await asyncio.to_thread(self._lvm().delete_clone, request.array, volume_of(request.volume))
        return pb.DeleteLocalCloneResponse()
