"""The drill's ports over gRPC with mutual TLS: the drill host's agent (`DrillHost`) and the
production agents' read-only facts (`NodeFactsPort`)."""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from ringsnap.api.v1 import agent_pb2, agent_pb2_grpc
from ringsnap.coordinator.agents import (
    AgentError,
    ClientTls,
    sstable_from_wire,
    volume_from_wire,
)
from ringsnap.coordinator.drill.ports import (
    CloneMount,
    DrillSpec,
    DrillStatus,
    MountedClone,
    NodeDrillFacts,
)
from ringsnap.coordinator.ports import SSTable
from ringsnap.wire import duration, seconds

#: Attaching and mounting clones runs the attach hook per volume; unmounting, the detach hook.
MOUNT_TIMEOUT_SECONDS = 900.0
#: The manifest of a node's clones lists every SSTable; stopping a drill stops Cassandra.
MANIFEST_TIMEOUT_SECONDS = 600.0
STOP_TIMEOUT_SECONDS = 300.0


class GrpcDrillHost:
    """The drill host's agent at `address` (host:port)."""

    def __init__(self, address: str, tls: ClientTls, *, call_timeout: float = 30.0) -> None:
        self._address = address
        self._channel = tls.channel(address)
        self._stub = agent_pb2_grpc.AgentServiceStub(self._channel)
        self._timeout = call_timeout

    @property
    def address(self) -> str:
        return self._address

    async def close(self) -> None:
        await self._channel.close()

    def _error(self, call: str, exc: grpc.aio.AioRpcError) -> AgentError:
        return AgentError(
            f"drill host ({self._address}): {call}: {exc.code().name}: {exc.details()}",
            code=exc.code().name,
        )

    async def mount_clones(
        self, purpose_id: str, clones: Sequence[CloneMount], *, read_only: bool
    ) -> tuple[MountedClone, ...]:
        request = agent_pb2.MountClonesRequest(
            purpose_id=purpose_id,
            read_only=read_only,
            volumes=[
                agent_pb2.CloneVolume(
                    role=c.role,
                    array=c.array,
                    volume=c.volume,
                    serial=c.serial,
                    wwn=c.wwn,
                    source_mount_point=c.source_mount_point,
                )
                for c in clones
            ],
        )
        try:
            reply = await self._stub.MountClones(request, timeout=MOUNT_TIMEOUT_SECONDS)
        except grpc.aio.AioRpcError as exc:
            raise self._error("MountClones", exc) from None
        return tuple(
            MountedClone(
                role=m.role,
                volume=m.volume,
                device=m.device,
                mount_point=m.mount_point,
                source_mount_point=m.source_mount_point,
            )
            for m in reply.mounts
        )

    async def unmount_clones(self, purpose_id: str) -> tuple[str, ...]:
        request = agent_pb2.UnmountClonesRequest(purpose_id=purpose_id)
        try:
            reply = await self._stub.UnmountClones(request, timeout=MOUNT_TIMEOUT_SECONDS)
        except grpc.aio.AioRpcError as exc:
            raise self._error("UnmountClones", exc) from None
        return tuple(reply.detached_volumes)

    async def start_drill(self, spec: DrillSpec) -> DrillStatus:
        request = agent_pb2.StartDrillRequest(
            drill_id=spec.purpose_id,
            node=spec.node,
            cluster_name=spec.cluster_name,
            address=spec.address,
            host_id=spec.host_id,
            data_directories=list(spec.data_directories),
            commitlog_directory=spec.commitlog_directory,
            canary_keyspace=spec.canary_keyspace,
            canary_key=spec.canary_key,
            backup_id=spec.backup_id,
            deadline=duration(spec.deadline_seconds),
            num_tokens=spec.num_tokens,
            datacenter=spec.datacenter,
            rack=spec.rack,
        )
        try:
            reply = await self._stub.StartDrill(request, timeout=self._timeout)
        except grpc.aio.AioRpcError as exc:
            raise self._error("StartDrill", exc) from None
        return _status(reply)

    async def get_drill(self, purpose_id: str) -> DrillStatus:
        try:
            reply = await self._stub.GetDrill(
                agent_pb2.DrillRequest(drill_id=purpose_id), timeout=self._timeout
            )
        except grpc.aio.AioRpcError as exc:
            raise self._error("GetDrill", exc) from None
        return _status(reply)

    async def drill_manifest(self, purpose_id: str) -> list[SSTable]:
        sstables: list[SSTable] = []
        try:
            async for batch in self._stub.GetDrillManifest(
                agent_pb2.DrillRequest(drill_id=purpose_id), timeout=MANIFEST_TIMEOUT_SECONDS
            ):
                sstables.extend(sstable_from_wire(entry) for entry in batch.entries)
        except grpc.aio.AioRpcError as exc:
            raise self._error("GetDrillManifest", exc) from None
        return sstables

    async def stop_drill(self, purpose_id: str) -> DrillStatus:
        try:
            reply = await self._stub.StopDrill(
                agent_pb2.DrillRequest(drill_id=purpose_id), timeout=STOP_TIMEOUT_SECONDS
            )
        except grpc.aio.AioRpcError as exc:
            raise self._error("StopDrill", exc) from None
        return _status(reply)


def _status(reply: agent_pb2.DrillStatus) -> DrillStatus:
    return DrillStatus(
        purpose_id=reply.drill_id,
        state=reply.state,
        step=reply.step,
        message=reply.message,
        proof=tuple(reply.proof),
        elapsed_seconds=seconds(reply.elapsed),
        bytes_verified=reply.bytes_verified,
        row_counts=tuple(sorted(reply.row_counts.items())),
    )


class GrpcNodeFacts:
    """A production node's agent, asked what a drill of its backup needs (read-only calls)."""

    def __init__(self, node: str, address: str, tls: ClientTls) -> None:
        self.node = node
        self.address = address
        self._channel = tls.channel(address)
        self._stub = agent_pb2_grpc.AgentServiceStub(self._channel)

    async def close(self) -> None:
        await self._channel.close()

    async def drill_facts(self) -> NodeDrillFacts:
        try:
            info = await self._stub.GetNodeInfo(agent_pb2.GetNodeInfoRequest(), timeout=30.0)
            state = await self._stub.GetVolumeState(agent_pb2.GetVolumeStateRequest(), timeout=60.0)
        except grpc.aio.AioRpcError as exc:
            raise AgentError(
                f"node {self.node} ({self.address}): {exc.code().name}: {exc.details()}",
                code=exc.code().name,
            ) from None
        return NodeDrillFacts(
            cluster_name=info.cluster_name,
            address=info.rpc_address,
            data_directories=tuple(info.data_directories),
            commitlog_directory=info.commitlog_directory,
            num_tokens=len(info.tokens),
            datacenter=info.datacenter,
            rack=info.rack,
            volumes=tuple(volume_from_wire(v) for v in state.volumes),
        )
