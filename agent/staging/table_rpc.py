"""The table-restore RPCs of the agent's servicer: messages to `TableImporter` calls and back.

`AgentServicer` delegates each RPC here (its decorator turns errors into statuses); nothing is
decided here.
"""

from __future__ import annotations

import asyncio
from functools import cached_property

from ringsnap.agent.clones import CLONES_DIRECTORY
from ringsnap.agent.node import NodeAgent
from ringsnap.agent.staging.table import SSTableToStage, StagedComponent, TableImporter
from ringsnap.api.v1 import agent_pb2, types_pb2
from ringsnap.wire import duration


def sstable_to_stage(entry: types_pb2.ManifestEntry) -> SSTableToStage:
    return SSTableToStage(
        data_directory=entry.data_directory,
        table_directory=entry.table_directory,
        components=tuple(StagedComponent(c.path, c.size_bytes) for c in entry.components),
        data_digest_crc32=entry.data_digest_crc32,
    )


class TableImportRpcs:
    """GetStagingSpace, StageTable, ImportStagedTable, RemoveStaging."""

    def __init__(self, agent: NodeAgent) -> None:
        self._agent = agent

    @cached_property
    def _importer(self) -> TableImporter:
        # On first use: a servicer is also built around agents that never restore a table.
        volumes = self._agent.config.volumes
        return TableImporter(
            self._agent.config.cassandra, volumes.state_directory / CLONES_DIRECTORY
        )

    async def get_staging_space(
        self, request: agent_pb2.GetStagingSpaceRequest
    ) -> agent_pb2.StagingSpace:
        space = await asyncio.to_thread(self._importer.space, request.run_id)
        return agent_pb2.StagingSpace(
            staging_directory=space.staging_directory,
            free_bytes=space.free_bytes,
            staged_bytes=space.staged_bytes,
        )

    async def stage_table(
        self, request: agent_pb2.StageTableRequest
    ) -> agent_pb2.StageTableResponse:
        staged = await asyncio.to_thread(
            self._importer.stage,
            request.run_id,
            request.keyspace,
            request.table,
            [(m.source_mount_point, m.mount_point) for m in request.clone_mounts],
            [sstable_to_stage(entry) for entry in request.sstables],
        )
        return agent_pb2.StageTableResponse(
            directory=staged.directory,
            sstables=staged.sstables,
            files=staged.files,
            bytes=staged.bytes,
            bytes_verified=staged.bytes_verified,
        )

    async def import_staged_table(
        self, request: agent_pb2.ImportStagedTableRequest
    ) -> agent_pb2.ImportStagedTableResponse:
        result = await self._importer.import_staged(
            request.run_id, request.keyspace, request.table
        )
        return agent_pb2.ImportStagedTableResponse(
            sstables_imported=result.sstables_imported,
            failed_directories=list(result.failed_directories),
            duration=duration(result.seconds),
            method=result.method,
        )

    async def remove_staging(
        self, request: agent_pb2.RemoveStagingRequest
    ) -> agent_pb2.RemoveStagingResponse:
        files, size = await asyncio.to_thread(self._importer.remove, request.run_id)
        return agent_pb2.RemoveStagingResponse(files=files, bytes=size)
