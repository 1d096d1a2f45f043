"""Restore values as API messages, for the servicer and the components it delegates to."""

from __future__ import annotations

from collections.abc import Sequence

from ringsnap.agent.snapshot_restore import RestoredTable
from ringsnap.api.v1 import agent_pb2


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
