"""The drill's ports over gRPC with mutual TLS: the drill host's agent (`DrillHost`) and the
production agents' read-only facts (`NodeFactsPort`)."""

from __future__ import annotations

from ringsnap.api.v1 import agent_pb2
from ringsnap.coordinator.agents.clones import CloneMountingConnection
from ringsnap.coordinator.agents.connection import (
    AgentConnection,
    ClientTls,
    sstable_from_wire,
    volume_from_wire,
)
from ringsnap.coordinator.drill.ports import DrillSpec, DrillStatus, NodeDrillFacts
from ringsnap.coordinator.ports import SSTable
from ringsnap.wire import duration, seconds

#: The manifest of a node's clones lists every SSTable; stopping a drill stops Cassandra.
MANIFEST_TIMEOUT_SECONDS = 600.0
STOP_TIMEOUT_SECONDS = 300.0


class GrpcDrillHost(CloneMountingConnection):
    """The drill host's agent at `address` (host:port)."""

    def __init__(self, address: str, tls: ClientTls, *, call_timeout: float = 30.0) -> None:
        super().__init__("drill host", address, tls, call_timeout=call_timeout)

    async def start_drill(self, spec: DrillSpec) -> DrillStatus:
        request = agent_pb2.StartDrillRequest(
            run_id=spec.purpose_id,
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
        with self._calling("StartDrill"):
            reply = await self._stub.StartDrill(request, timeout=self._timeout)
        return _status(reply)

    async def get_drill(self, run_id: str) -> DrillStatus:
        request = agent_pb2.DrillRequest(run_id=run_id)
        with self._calling("GetDrill"):
            reply = await self._stub.GetDrill(request, timeout=self._timeout)
        return _status(reply)

    async def drill_manifest(self, run_id: str) -> list[SSTable]:
        request = agent_pb2.DrillRequest(run_id=run_id)
        sstables: list[SSTable] = []
        with self._calling("GetDrillManifest"):
            async for batch in self._stub.GetDrillManifest(
                request, timeout=MANIFEST_TIMEOUT_SECONDS
            ):
                sstables.extend(sstable_from_wire(entry) for entry in batch.entries)
        return sstables

    async def stop_drill(self, run_id: str) -> DrillStatus:
        request = agent_pb2.DrillRequest(run_id=run_id)
        with self._calling("StopDrill"):
            reply = await self._stub.StopDrill(request, timeout=STOP_TIMEOUT_SECONDS)
        return _status(reply)


def _status(reply: agent_pb2.DrillStatus) -> DrillStatus:
    return DrillStatus(
        purpose_id=reply.run_id,
        state=reply.state,
        step=reply.step,
        message=reply.message,
        proof=tuple(reply.proof),
        elapsed_seconds=seconds(reply.elapsed),
        bytes_verified=reply.bytes_verified,
        row_counts=tuple(sorted(reply.row_counts.items())),
    )


class GrpcNodeFacts(AgentConnection):
    """A production node's agent, asked what a drill of its backup needs (read-only calls)."""

    def __init__(self, node: str, address: str, tls: ClientTls) -> None:
        super().__init__(f"node {node}", address, tls, call_timeout=30.0)
        self.node = node

    async def drill_facts(self) -> NodeDrillFacts:
        with self._calling("GetNodeInfo"):
            info = await self._stub.GetNodeInfo(
                agent_pb2.GetNodeInfoRequest(), timeout=self._timeout
            )
        with self._calling("GetVolumeState"):
            state = await self._stub.GetVolumeState(agent_pb2.GetVolumeStateRequest(), timeout=60.0)
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
