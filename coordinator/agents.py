"""`NodeAgent` over gRPC with mutual TLS: translates between v1 messages and domain types."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import grpc
from google.protobuf.duration_pb2 import Duration

from ringsnap.api.v1 import agent_pb2, agent_pb2_grpc, types_pb2
from ringsnap.coordinator.ports import (
    FilesystemFacts,
    FreezeReceipt,
    NodeFacts,
    SSTable,
    SSTableComponent,
    ThawReceipt,
)
from ringsnap.errors import RingsnapError

_ROLES = {
    types_pb2.FILESYSTEM_ROLE_DATA: "data",
    types_pb2.FILESYSTEM_ROLE_COMMITLOG: "commitlog",
    types_pb2.FILESYSTEM_ROLE_DATA_AND_COMMITLOG: "data+commitlog",
}


class AgentError(RingsnapError):
    """An agent call failed; the message names the node, the call and the gRPC status."""


@dataclass(frozen=True)
class ClientTls:
    """The coordinator's client certificate and the CA that signed the agents' certificates."""

    cert: bytes
    key: bytes = field(repr=False)  # never in a log or an error
    ca: bytes
    #: Expected name in the agents' certificates when it differs from the address host.
    server_name: str = ""

    @classmethod
    def from_files(cls, cert: Path, key: Path, ca: Path, server_name: str = "") -> ClientTls:
        return cls(cert.read_bytes(), key.read_bytes(), ca.read_bytes(), server_name)

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=self.key, certificate_chain=self.cert
        )


def _seconds(duration: Duration) -> float:
    return duration.seconds + duration.nanos / 1e9


def _duration(seconds: float) -> Duration:
    duration = Duration()
    duration.FromNanoseconds(round(seconds * 1e9))
    return duration


class GrpcNodeAgent:
    """One node's agent at `address` (host:port)."""

    def __init__(self, node: str, address: str, tls: ClientTls, *, call_timeout: float = 30.0):
        self._node = node
        self.address = address
        options: list[tuple[str, str | int]] = [("grpc.max_receive_message_length", 64 << 20)]
        if tls.server_name:
            options.append(("grpc.ssl_target_name_override", tls.server_name))
        self._channel = grpc.aio.secure_channel(address, tls.credentials(), options=options)
        self._stub = agent_pb2_grpc.AgentServiceStub(self._channel)
        self._timeout = call_timeout

    @property
    def node(self) -> str:
        return self._node

    async def close(self) -> None:
        await self._channel.close()

    def _error(self, call: str, exc: grpc.aio.AioRpcError) -> AgentError:
        return AgentError(
            f"node {self._node} ({self.address}): {call}: {exc.code().name}: {exc.details()}"
        )

    async def node_info(self) -> NodeFacts:
        try:
            info = await self._stub.GetNodeInfo(
                agent_pb2.GetNodeInfoRequest(), timeout=self._timeout
            )
        except grpc.aio.AioRpcError as exc:
            raise self._error("GetNodeInfo", exc) from None
        return NodeFacts(
            cluster_name=info.cluster_name,
            host_id=info.host_id,
            datacenter=info.datacenter,
            rack=info.rack,
            cassandra_version=info.cassandra_version,
            rpc_address=info.rpc_address,
            tokens=tuple(info.tokens),
            filesystems=tuple(
                FilesystemFacts(
                    mount_point=fs.mount_point,
                    device=fs.device,
                    fs_type=fs.fs_type,
                    role=_ROLES.get(fs.role, "unknown"),
                    serial=fs.serial,
                    wwn=fs.wwn,
                    loop_backing_file=fs.loop_backing_file,
                )
                for fs in info.filesystems
            ),
        )

    async def flush(self) -> float:
        try:
            reply = await self._stub.FlushMemtables(
                agent_pb2.FlushMemtablesRequest(), timeout=max(self._timeout, 300.0)
            )
        except grpc.aio.AioRpcError as exc:
            raise self._error("FlushMemtables", exc) from None
        return _seconds(reply.duration)

    async def freeze(self, operation_id: str, lease_seconds: float) -> FreezeReceipt:
        request = agent_pb2.FreezeFilesystemsRequest(
            operation_id=operation_id, lease=_duration(lease_seconds), sync_first=True
        )
        try:
            reply = await self._stub.FreezeFilesystems(request, timeout=self._timeout)
        except grpc.aio.AioRpcError as exc:
            raise self._error("FreezeFilesystems", exc) from None
        return FreezeReceipt(
            mount_points=tuple(fs.mount_point for fs in reply.filesystems),
            freeze_seconds=sum(_seconds(fs.freeze_duration) for fs in reply.filesystems),
            lease_expires_at=reply.lease_expires_at.ToDatetime(tzinfo=UTC),
        )

    async def renew(self, operation_id: str, lease_seconds: float) -> datetime:
        request = agent_pb2.RenewLeaseRequest(
            operation_id=operation_id, lease=_duration(lease_seconds)
        )
        try:
            reply = await self._stub.RenewLease(request, timeout=lease_seconds)
        except grpc.aio.AioRpcError as exc:
            raise self._error("RenewLease", exc) from None
        return reply.lease_expires_at.ToDatetime(tzinfo=UTC)

    async def thaw(self, operation_id: str) -> ThawReceipt:
        try:
            reply = await self._stub.ThawFilesystems(
                agent_pb2.ThawFilesystemsRequest(operation_id=operation_id),
                timeout=self._timeout,
            )
        except grpc.aio.AioRpcError as exc:
            raise self._error("ThawFilesystems", exc) from None
        thawed = [fs for fs in reply.filesystems if fs.was_frozen]
        return ThawReceipt(
            thawed=tuple(fs.mount_point for fs in thawed),
            thaw_seconds=sum(_seconds(fs.thaw_duration) for fs in thawed),
            frozen_for_seconds=max((_seconds(fs.frozen_for) for fs in thawed), default=0.0),
            lease_expired=reply.lease_expired,
        )

    async def manifest(self, snapshot_tag: str = "") -> list[SSTable]:
        request = agent_pb2.GetManifestRequest(snapshot_tag=snapshot_tag)
        sstables: list[SSTable] = []
        try:
            async for batch in self._stub.GetManifest(request, timeout=600.0):
                sstables.extend(_sstable(entry) for entry in batch.entries)
        except grpc.aio.AioRpcError as exc:
            raise self._error("GetManifest", exc) from None
        return sstables


def _sstable(entry: types_pb2.ManifestEntry) -> SSTable:
    return SSTable(
        data_directory=entry.data_directory,
        keyspace=entry.keyspace,
        table=entry.table,
        table_directory=entry.table_directory,
        generation=entry.generation,
        format=entry.format,
        version=entry.version,
        components=tuple(SSTableComponent(c.name, c.path, c.size_bytes) for c in entry.components),
        data_digest_crc32=entry.data_digest_crc32,
        complete=entry.complete,
        problem=entry.problem,
    )


async def close_all(agents: Sequence[GrpcNodeAgent]) -> None:
    for agent in agents:
        await agent.close()
