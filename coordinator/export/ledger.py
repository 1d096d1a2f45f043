"""An export's clones in the resource ledger: the entry of a clone about to be made, and the
ledger seen as the clone session's cleanups (so that a deletion keeps it true)."""

from __future__ import annotations

from ringsnap.coordinator.export.ports import ExportJournal
from ringsnap.coordinator.runs.resources import Resource, ResourceType


def clone_resource(
    cluster: str, backup_id: str, array: str, suffix: str, reason: str, *, node: str, purpose: str
) -> Resource:
    """A clone of the backup's snapshot on `array`, about to be made by its export (its name
    will contain `suffix`), to be mounted on `node` of `cluster` under `purpose`."""
    return Resource(
        type=ResourceType.CLONE,
        cluster=cluster,
        run_id=backup_id,
        run_kind="export",
        reason=reason,
        array=array,
        name_hint=suffix,
        node=node,
        mount_purpose=purpose,
    )


class LedgerCleanups:
    """`CloneCleanups` over the ledger entries of the journal."""

    def __init__(self, journal: ExportJournal) -> None:
        self.journal = journal

    async def cleanup_pending(self, cleanup_id: int) -> bool:
        return await self.journal.resource_pending(cleanup_id)

    async def cleanup_done(self, cleanup_id: int) -> None:
        await self.journal.resource_gone(cleanup_id)

    async def cleanup_failed(self, cleanup_id: int, error: str) -> None:
        await self.journal.resource_failed(cleanup_id, error)
