"""Restore values as API messages, for the servicer and the components it delegates to."""

from __future__ import annotations

from collections.abc import Sequence

from ringsnap.agent.initiators import Initiators
from ringsnap.agent.restore.install_record import RestoredTable
from ringsnap.agent.restore.model import DiscardedDirectory, VolumeState
from ringsnap.api.v1 import agent_pb2
from ringsnap.volume_facts import VolumeFacts


def restored_table_messages(tables: Sequence[RestoredTable]) -> list[agent_pb2.RestoredTable]:
    """The tables a snapshot restore or an install from S3 put back."""
    return [
        agent_pb2.RestoredTable(
            data_directory=table.data_directory,
            keyspace=table.keyspace,
            table_directory=table.table_directory,
            restored=table.restored,
            files_moved=table.files_moved,
            files_linked=table.files_linked,
            replaced_directory=table.replaced_directory,
        )
        for table in tables
    ]


def node_volume_message(volume: VolumeFacts) -> agent_pb2.NodeVolume:
    return agent_pb2.NodeVolume(
        mount_point=volume.mount_point,
        device=volume.device,
        fs_type=volume.fs_type,
        fs_uuid=volume.fs_uuid,
        kinds=list(volume.kinds),
        serial=volume.serial,
        wwn=volume.wwn,
        loop_backing_file=volume.loop_backing_file,
        mounted=volume.mounted,
        released_by=volume.released_by,
    )


def volume_state_message(
    state: VolumeState, initiators: Initiators | None = None
) -> agent_pb2.VolumeState:
    found = initiators or Initiators()
    return agent_pb2.VolumeState(
        cassandra_running=state.cassandra.running,
        cassandra_detail=state.cassandra.detail,
        volumes=[node_volume_message(volume) for volume in state.volumes],
        iqns=list(found.iqns),
        wwpns=list(found.wwpns),
        nqns=list(found.nqns),
    )


def discarded_message(
    directories: Sequence[DiscardedDirectory],
) -> agent_pb2.DiscardReplayStateResponse:
    return agent_pb2.DiscardReplayStateResponse(
        directories=[
            agent_pb2.DiscardedDirectory(
                path=directory.path,
                kind=directory.kind,
                files=directory.files,
                bytes=directory.bytes,
            )
            for directory in directories
        ]
    )


def restored_message(tables: Sequence[RestoredTable]) -> agent_pb2.RestoreSnapshotResponse:
    return agent_pb2.RestoreSnapshotResponse(tables=restored_table_messages(tables))
