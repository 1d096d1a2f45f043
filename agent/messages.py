"""The agent's own values as messages of its API: the node's facts and filesystems, freeze and
thaw results, manifest batches, mounted clones, a drill's status and request. The restore steps'
messages are `ringsnap.agent.restore.messages`."""

from __future__ import annotations

from collections.abc import Sequence

from ringsnap.agent import manifest, volumes
from ringsnap.agent.clones import MountedClone
from ringsnap.agent.drill.model import DrillRequest, DrillStatus
from ringsnap.agent.freeze import FreezeResult, ThawResult
from ringsnap.agent.node import NodeInfo
from ringsnap.api.v1 import agent_pb2, types_pb2
from ringsnap.wire import duration, seconds_of, unix_timestamp


def _role(kinds: frozenset[str]) -> types_pb2.FilesystemRole.ValueType:
    if {"data", "commitlog"} <= kinds:
        return types_pb2.FILESYSTEM_ROLE_DATA_AND_COMMITLOG
    if "data" in kinds:
        return types_pb2.FILESYSTEM_ROLE_DATA
    if "commitlog" in kinds:
        return types_pb2.FILESYSTEM_ROLE_COMMITLOG
    return types_pb2.FILESYSTEM_ROLE_UNSPECIFIED


def filesystem_message(filesystem: volumes.NodeFilesystem) -> types_pb2.Filesystem:
    return types_pb2.Filesystem(
        mount_point=filesystem.mount_point,
        device=filesystem.device,
        fs_type=filesystem.fs_type,
        role=_role(filesystem.kinds),
        serial=filesystem.identity.serial,
        wwn=filesystem.identity.wwn,
        loop_backing_file=filesystem.identity.loop_backing_file,
        cassandra_directories=list(filesystem.cassandra_directories),
        nguid=filesystem.identity.nguid,
        eui=filesystem.identity.eui,
        fs_uuid=filesystem.identity.fs_uuid,
        identity_source=filesystem.identity.source,
    )


def node_info_message(info: NodeInfo) -> agent_pb2.NodeInfo:
    return agent_pb2.NodeInfo(
        cluster_name=info.cluster_name,
        host_id=info.host_id,
        datacenter=info.datacenter,
        rack=info.rack,
        tokens=list(info.tokens),
        cassandra_version=info.cassandra_version,
        data_directories=list(info.data_directories),
        commitlog_directory=info.commitlog_directory,
        filesystems=[filesystem_message(fs) for fs in info.filesystems],
        agent_version=info.agent_version,
        rpc_address=info.rpc_address,
    )


def freeze_message(result: FreezeResult) -> agent_pb2.FreezeFilesystemsResponse:
    return agent_pb2.FreezeFilesystemsResponse(
        filesystems=[
            agent_pb2.FrozenFilesystem(
                mount_point=fs.mount_point,
                frozen_at=unix_timestamp(fs.frozen_at),
                freeze_duration=duration(fs.freeze_seconds),
                sync_duration=duration(fs.sync_seconds),
            )
            for fs in result.filesystems
        ],
        lease_expires_at=unix_timestamp(result.lease_expires_at),
    )


def thaw_message(result: ThawResult) -> agent_pb2.ThawFilesystemsResponse:
    response = agent_pb2.ThawFilesystemsResponse(lease_expired=result.lease_expired)
    for fs in result.filesystems:
        entry = response.filesystems.add(mount_point=fs.mount_point, was_frozen=fs.was_frozen)
        if fs.frozen_seconds is not None:
            entry.frozen_for.CopyFrom(duration(fs.frozen_seconds))
        if fs.thaw_seconds is not None:
            entry.thaw_duration.CopyFrom(duration(fs.thaw_seconds))
    return response


def manifest_batch_message(batch: Sequence[manifest.SSTable]) -> agent_pb2.GetManifestResponse:
    response = agent_pb2.GetManifestResponse()
    add_entry = response.entries.add
    for table in batch:
        entry = add_entry(
            data_directory=table.data_directory,
            keyspace=table.keyspace,
            table=table.table,
            table_directory=table.table_directory,
            generation=table.generation,
            format=table.format,
            version=table.version,
            data_digest_crc32=table.data_digest_crc32,
            complete=table.complete,
            problem=table.problem,
            snapshot_tag=table.snapshot_tag,
        )
        add_component = entry.components.add
        for name, path, size, mtime in table.components:
            add_component(name=name, path=path, size_bytes=size, mtime_ns=mtime)
    return response


def mounted_clones_message(mounts: Sequence[MountedClone]) -> agent_pb2.MountClonesResponse:
    return agent_pb2.MountClonesResponse(
        mounts=[
            agent_pb2.MountedClone(
                role=clone.role,
                volume=clone.volume,
                device=clone.device,
                mount_point=clone.mount_point,
                source_mount_point=clone.source_mount_point,
            )
            for clone in mounts
        ]
    )


def drill_status_message(status: DrillStatus) -> agent_pb2.DrillStatus:
    return agent_pb2.DrillStatus(
        run_id=status.run_id,
        state=status.state,
        step=status.step,
        message=status.message,
        proof=list(status.proof),
        elapsed=duration(status.elapsed_seconds),
        bytes_verified=status.bytes_verified,
        step_seconds=status.timings,
        row_counts=status.row_counts,
    )


def drill_request(request: agent_pb2.StartDrillRequest) -> DrillRequest:
    return DrillRequest(
        run_id=request.run_id,
        node=request.node,
        cluster_name=request.cluster_name,
        address=request.address,
        host_id=request.host_id,
        data_directories=tuple(request.data_directories),
        commitlog_directory=request.commitlog_directory,
        canary_keyspace=request.canary_keyspace,
        canary_key=request.canary_key,
        backup_id=request.backup_id,
        deadline_seconds=(
            seconds_of(request.deadline, "deadline") if request.HasField("deadline") else 0.0
        ),
        num_tokens=request.num_tokens,
        datacenter=request.datacenter,
        rack=request.rack,
    )
