"""`AgentPort` over gRPC with mutual TLS: translates between v1 messages and domain types."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import grpc

from ringsnap.api.v1 import agent_pb2, agent_pb2_grpc, types_pb2
from ringsnap.coordinator.clone_mounts import CloneToMount
from ringsnap.coordinator.ports import (
    AgentError,
    DiscardedDirectory,
    FilesystemFacts,
    FreezeReceipt,
    NodeFacts,
    NodeVolumeFacts,
    RestoredTable,
    SSTable,
    SSTableComponent,
    ThawReceipt,
    VolumeState,
)
from ringsnap.wire import duration as _duration
from ringsnap.wire import moment
from ringsnap.wire import seconds as _seconds

_ROLES = {
    types_pb2.FILESYSTEM_ROLE_DATA: "data",
    types_pb2.FILESYSTEM_ROLE_COMMITLOG: "commitlog",
    types_pb2.FILESYSTEM_ROLE_DATA_AND_COMMITLOG: "data+commitlog",
}


#: Limits of the restore calls: each bounds work the agent itself bounds more tightly (a drain
#: and the stop command, hooks and mounts per volume, deleting a large commit log).
STOP_TIMEOUT_SECONDS = 960.0
VOLUMES_TIMEOUT_SECONDS = 900.0
DISCARD_TIMEOUT_SECONDS = 600.0
#: A native snapshot flushes every table first; clearing one deletes its links.
SNAPSHOT_TIMEOUT_SECONDS = 600.0
#: Added to the wait of a start: the start command itself and the last poll.
START_MARGIN_SECONDS = 120.0


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

    def channel(self, address: str) -> grpc.aio.Channel:
        """A mutual-TLS channel to an agent; messages up to 64 MiB each way (manifests, staging
        lists)."""
        options: list[tuple[str, str | int]] = [
            ("grpc.max_receive_message_length", 64 << 20),
            ("grpc.max_send_message_length", 64 << 20),
        ]
        if self.server_name:
            options.append(("grpc.ssl_target_name_override", self.server_name))
        return grpc.aio.secure_channel(address, self.credentials(), options=options)


def clone_volumes_message(
    run_id: str, clones: Sequence[CloneToMount], *, read_only: bool
) -> agent_pb2.MountClonesRequest:
    """The MountClones request for `clones`, built in one place for every client that mounts
    clones (drill host, table restore, export)."""
    return agent_pb2.MountClonesRequest(
        run_id=run_id,
        read_only=read_only,
        volumes=[
            agent_pb2.CloneVolume(
                role=c.role,
                array=c.array,
                volume=c.volume,
                serial=c.serial,
                wwn=c.wwn,
                source_mount_point=c.source_mount_point,
                fs_uuid=c.fs_uuid,
            )
            for c in clones
        ],
    )


class AgentConnection:
    """A mutual-TLS channel to one agent and the service stub on it, for every client of the
    agents' service (backups and restores, drill hosts, table restores).

    `_calling(rpc)` is the one place a call's gRPC error becomes an `AgentError` naming who was
    called (`who`: "node n1", "drill host"), the address, the RPC and the status.
    """

    def __init__(self, who: str, address: str, tls: ClientTls, *, call_timeout: float) -> None:
        self.address = address
        self._who = who
        self._channel = tls.channel(address)
        self._stub = agent_pb2_grpc.AgentServiceStub(self._channel)
        self._timeout = call_timeout

    async def close(self) -> None:
        await self._channel.close()

    # Every agent answers it, Cassandra up or down, the drill host too: its volumes and the
    # initiators its host reaches arrays with.
    async def volume_state(self) -> VolumeState:
        with self._calling("GetVolumeState"):
            reply = await self._stub.GetVolumeState(
                agent_pb2.GetVolumeStateRequest(), timeout=max(self._timeout, 60.0)
            )
        return VolumeState(
            cassandra_running=reply.cassandra_running,
            detail=reply.cassandra_detail,
            volumes=tuple(_volume(volume) for volume in reply.volumes),
            iqns=tuple(reply.iqns),
            wwpns=tuple(reply.wwpns),
            nqns=tuple(reply.nqns),
        )

    @contextlib.contextmanager
    def _calling(self, rpc: str) -> Iterator[None]:
        try:
            yield
        except grpc.aio.AioRpcError as exc:
            raise AgentError(
                f"{self._who} ({self.address}): {rpc}: {exc.code().name}: {exc.details()}",
                code=exc.code().name,
            ) from None


class GrpcNodeAgent(AgentConnection):
    """One node's agent at `address` (host:port)."""

    def __init__(self, node: str, address: str, tls: ClientTls, *, call_timeout: float = 30.0):
        super().__init__(f"node {node}", address, tls, call_timeout=call_timeout)
        self._node = node

    @property
    def node(self) -> str:
        return self._node

    async def node_info(self) -> NodeFacts:
        with self._calling("GetNodeInfo"):
            info = await self._stub.GetNodeInfo(
                agent_pb2.GetNodeInfoRequest(), timeout=self._timeout
            )
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
                    nguid=fs.nguid,
                    eui=fs.eui,
                    fs_uuid=fs.fs_uuid,
                    identity_source=fs.identity_source,
                    cassandra_directories=tuple(fs.cassandra_directories),
                )
                for fs in info.filesystems
            ),
        )

    async def flush(self) -> float:
        with self._calling("FlushMemtables"):
            reply = await self._stub.FlushMemtables(
                agent_pb2.FlushMemtablesRequest(), timeout=max(self._timeout, 300.0)
            )
        return _seconds(reply.duration)

    async def freeze(self, run_id: str, lease_seconds: float) -> FreezeReceipt:
        request = agent_pb2.FreezeFilesystemsRequest(
            run_id=run_id, lease=_duration(lease_seconds), sync_first=True
        )
        with self._calling("FreezeFilesystems"):
            reply = await self._stub.FreezeFilesystems(request, timeout=self._timeout)
        return FreezeReceipt(
            mount_points=tuple(fs.mount_point for fs in reply.filesystems),
            freeze_seconds=_freeze_span(reply.filesystems),
            lease_expires_at=moment(reply.lease_expires_at),
        )

    async def renew(self, run_id: str, lease_seconds: float) -> datetime:
        request = agent_pb2.RenewLeaseRequest(run_id=run_id, lease=_duration(lease_seconds))
        with self._calling("RenewLease"):
            reply = await self._stub.RenewLease(request, timeout=lease_seconds)
        return moment(reply.lease_expires_at)

    async def thaw(self, run_id: str) -> ThawReceipt:
        with self._calling("ThawFilesystems"):
            reply = await self._stub.ThawFilesystems(
                agent_pb2.ThawFilesystemsRequest(run_id=run_id),
                timeout=self._timeout,
            )
        thawed = [fs for fs in reply.filesystems if fs.was_frozen]
        return ThawReceipt(
            thawed=tuple(fs.mount_point for fs in thawed),
            thaw_seconds=max((_seconds(fs.thaw_duration) for fs in thawed), default=0.0),
            frozen_for_seconds=max((_seconds(fs.frozen_for) for fs in thawed), default=0.0),
            lease_expired=reply.lease_expired,
        )

    async def manifest(self, snapshot_tag: str = "") -> list[SSTable]:
        request = agent_pb2.GetManifestRequest(snapshot_tag=snapshot_tag)
        sstables: list[SSTable] = []
        with self._calling("GetManifest"):
            async for batch in self._stub.GetManifest(request, timeout=600.0):
                sstables.extend(_sstable(entry) for entry in batch.entries)
        return sstables

    async def create_snapshot(self, tag: str) -> float:
        with self._calling("CreateSnapshot"):
            reply = await self._stub.CreateSnapshot(
                agent_pb2.CreateSnapshotRequest(tag=tag), timeout=SNAPSHOT_TIMEOUT_SECONDS
            )
        return _seconds(reply.duration)

    async def clear_snapshot(self, tag: str) -> None:
        with self._calling("ClearSnapshot"):
            await self._stub.ClearSnapshot(
                agent_pb2.ClearSnapshotRequest(tag=tag), timeout=SNAPSHOT_TIMEOUT_SECONDS
            )

    # -- restores ---------------------------------------------------------------------------------

    async def stop_cassandra(self, *, drain: bool) -> bool:
        with self._calling("StopCassandra"):
            reply = await self._stub.StopCassandra(
                agent_pb2.StopCassandraRequest(drain=drain), timeout=STOP_TIMEOUT_SECONDS
            )
        return reply.drained

    async def start_cassandra(self, *, wait_seconds: float, until_gossip: bool = False) -> float:
        request = agent_pb2.StartCassandraRequest(until_gossip=until_gossip)
        if wait_seconds:
            request.wait.CopyFrom(_duration(wait_seconds))
        timeout = max(wait_seconds, 0.0) + max(self._timeout, START_MARGIN_SECONDS)
        with self._calling("StartCassandra"):
            reply = await self._stub.StartCassandra(request, timeout=timeout)
        return _seconds(reply.duration)

    async def release_volumes(
        self, run_id: str, mount_points: Sequence[str]
    ) -> tuple[NodeVolumeFacts, ...]:
        request = agent_pb2.ReleaseVolumesRequest(run_id=run_id, mount_points=list(mount_points))
        with self._calling("ReleaseVolumes"):
            reply = await self._stub.ReleaseVolumes(request, timeout=VOLUMES_TIMEOUT_SECONDS)
        return tuple(_volume(volume) for volume in reply.volumes)

    async def attach_volumes(
        self,
        run_id: str,
        volumes: Sequence[tuple[str, str]],
        identities: Mapping[str, str] | None = None,
    ) -> tuple[NodeVolumeFacts, ...]:
        known = identities or {}
        request = agent_pb2.AttachVolumesRequest(
            run_id=run_id,
            volumes=[
                agent_pb2.AttachVolume(
                    mount_point=point, volume_name=name, identity=known.get(point, "")
                )
                for point, name in volumes
            ],
        )
        with self._calling("AttachVolumes"):
            reply = await self._stub.AttachVolumes(request, timeout=VOLUMES_TIMEOUT_SECONDS)
        return tuple(_volume(volume) for volume in reply.volumes)

    async def discard_replay_state(
        self, run_id: str, *, hints: bool
    ) -> tuple[DiscardedDirectory, ...]:
        request = agent_pb2.DiscardReplayStateRequest(run_id=run_id, hints=hints)
        with self._calling("DiscardReplayState"):
            reply = await self._stub.DiscardReplayState(request, timeout=DISCARD_TIMEOUT_SECONDS)
        return tuple(
            DiscardedDirectory(path=d.path, kind=d.kind, files=d.files, bytes=d.bytes)
            for d in reply.directories
        )

    async def restore_snapshot(self, run_id: str, tag: str) -> tuple[RestoredTable, ...]:
        request = agent_pb2.RestoreSnapshotRequest(run_id=run_id, tag=tag)
        with self._calling("RestoreSnapshot"):
            reply = await self._stub.RestoreSnapshot(request, timeout=VOLUMES_TIMEOUT_SECONDS)
        return tuple(
            RestoredTable(
                data_directory=t.data_directory,
                keyspace=t.keyspace,
                table_directory=t.table_directory,
                restored=t.restored,
                files_moved=t.files_moved,
                files_linked=t.files_linked,
                replaced_directory=t.replaced_directory,
            )
            for t in reply.tables
        )


def _freeze_span(filesystems: Sequence[agent_pb2.FrozenFilesystem]) -> float:
    """First syncfs/FIFREEZE started to the last FIFREEZE returned, on the agent's clock: the
    node's filesystems freeze in parallel, so a sum of their durations would overstate it."""
    if not filesystems:
        return 0.0
    ended = [fs.frozen_at.ToNanoseconds() / 1e9 for fs in filesystems]
    began = [
        end - _seconds(fs.freeze_duration) - _seconds(fs.sync_duration)
        for end, fs in zip(ended, filesystems, strict=True)
    ]
    return max(ended) - min(began)


def _volume(volume: agent_pb2.NodeVolume) -> NodeVolumeFacts:
    return NodeVolumeFacts(
        mount_point=volume.mount_point,
        device=volume.device,
        fs_type=volume.fs_type,
        fs_uuid=volume.fs_uuid,
        kinds=tuple(volume.kinds),
        serial=volume.serial,
        wwn=volume.wwn,
        loop_backing_file=volume.loop_backing_file,
        mounted=volume.mounted,
        released_by=volume.released_by,
    )


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


#: The conversions, for the other clients of the agents' service (the drill host's).
volume_from_wire = _volume
sstable_from_wire = _sstable


async def close_all(agents: Sequence[GrpcNodeAgent]) -> None:
    for agent in agents:
        await agent.close()
