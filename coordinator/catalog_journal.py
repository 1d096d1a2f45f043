"""What the journals of the workflows that read a backup (restores, drills, table restores) share:
the catalog calls they make, each off the event loop (SQLite blocks)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.model import Verification
from ringsnap.coordinator.ports import SSTable


class CatalogJournalBase:
    """The catalog calls every backup-reading workflow's journal makes; each workflow's journal
    adds the saving of its own record."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog

    async def manifest(self, backup_id: str, node: str) -> Iterable[SSTable]:
        return await asyncio.to_thread(lambda: list(self.catalog.iter_manifest(backup_id, node)))

    async def mark_verified(
        self, backup_id: str, result: Verification, detail: str, by: str
    ) -> None:
        await asyncio.to_thread(self.catalog.mark_verified, backup_id, result, detail, by=by)
