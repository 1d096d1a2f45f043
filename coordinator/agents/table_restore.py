"""`TableNodePort` over gRPC with mutual TLS (its own channel to the node's agent)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from ringsnap.api.v1 import agent_pb2, types_pb2
from ringsnap.coordinator.agents.clones import CloneMountingConnection
from ringsnap.coordinator.agents.connection import ClientTls
from ringsnap.coordinator.ports import SSTable
from ringsnap.coordinator.table_restore.ports import ImportedTable, StagedTable, StagingSpace
from ringsnap.wire import seconds

#: Staging copies a table's bytes; an import verifies every SSTable.
STAGE_TIMEOUT_SECONDS = 3600.0
IMPORT_TIMEOUT_SECONDS = 3600.0

T = TypeVar("T")


def manifest_entry(sstable: SSTable) -> types_pb2.ManifestEntry:
    return types_pb2.ManifestEntry(
        data_directory=sstable.data_directory,
        keyspace=sstable.keyspace,
        table=sstable.table,
        table_directory=sstable.table_directory,
        generation=sstable.generation,
        format=sstable.format,
        version=sstable.version,
        components=[
            types_pb2.SSTableComponent(name=c.name, path=c.path, size_bytes=c.size_bytes)
            for c in sstable.components
        ],
        data_digest_crc32=sstable.data_digest_crc32,
        complete=sstable.complete,
        problem=sstable.problem,
    )


class GrpcTableNode(CloneMountingConnection):
    """One node's agent at `address` (host:port), for table restores."""

    def __init__(self, node: str, address: str, tls: ClientTls, *, call_timeout: float = 60.0):
        super().__init__(f"node {node}", address, tls, call_timeout=call_timeout)
        self._node = node

    @property
    def node(self) -> str:
        return self._node

    async def staging_space(self, run_id: str) -> StagingSpace:
        with self._calling("GetStagingSpace"):
            reply = await self._stub.GetStagingSpace(
                agent_pb2.GetStagingSpaceRequest(run_id=run_id), timeout=self._timeout
            )
        return StagingSpace(reply.staging_directory, reply.free_bytes, reply.staged_bytes)

    async def stage_table(
        self,
        run_id: str,
        keyspace: str,
        table: str,
        clone_mounts: Sequence[tuple[str, str]],
        sstables: Sequence[SSTable],
    ) -> StagedTable:
        request = agent_pb2.StageTableRequest(
            run_id=run_id,
            keyspace=keyspace,
            table=table,
            clone_mounts=[
                agent_pb2.CloneMount(source_mount_point=s, mount_point=m) for s, m in clone_mounts
            ],
            sstables=[manifest_entry(s) for s in sstables],
        )
        with self._calling("StageTable"):
            reply = await self._stub.StageTable(request, timeout=STAGE_TIMEOUT_SECONDS)
        return StagedTable(
            reply.directory, reply.sstables, reply.files, reply.bytes, reply.bytes_verified
        )

    async def import_staged_table(
        self, run_id: str, keyspace: str, table: str
    ) -> ImportedTable:
        request = agent_pb2.ImportStagedTableRequest(
            run_id=run_id, keyspace=keyspace, table=table
        )
        with self._calling("ImportStagedTable"):
            reply = await self._stub.ImportStagedTable(request, timeout=IMPORT_TIMEOUT_SECONDS)
        return ImportedTable(
            reply.sstables_imported,
            tuple(reply.failed_directories),
            seconds(reply.duration),
            reply.method,
        )

    async def remove_staging(self, run_id: str) -> tuple[int, int]:
        with self._calling("RemoveStaging"):
            reply = await self._stub.RemoveStaging(
                agent_pb2.RemoveStagingRequest(run_id=run_id), timeout=self._timeout
            )
        return reply.files, reply.bytes
