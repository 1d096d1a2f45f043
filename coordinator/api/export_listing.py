"""Which backups have an off-array copy, for `ringsnap list` and `show` (the API's
`Backup.off_array_copy`)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from ringsnap.api.v1 import coordinator_pb2 as pb
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.export.model import ExportState


def _copies(catalog: Catalog, backup_ids: list[str]) -> dict[str, str]:
    found = catalog.exported_backups(backup_ids)
    copies: dict[str, str] = {}
    for backup_id in found:
        record = catalog.find_export(backup_id)
        if record is not None and record.state is ExportState.SUCCEEDED:
            copies[backup_id] = record.copy_description()
    return copies


async def off_array_copies(catalog: Catalog, messages: Iterable[pb.Backup]) -> None:
    """Fill `off_array_copy` of each backup message that has a copy."""
    listed = list(messages)
    if not listed:
        return
    copies = await asyncio.to_thread(_copies, catalog, [m.backup_id for m in listed])
    for message in listed:
        message.off_array_copy = copies.get(message.backup_id, "")
