"""What the journals of the workflows that read a backup (restores, drills, table restores, exports)
share: the catalog calls they make, each off the event loop (SQLite blocks): the manifests and
the resource ledger (`CatalogResources`)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence

from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.model import Verification
from ringsnap.coordinator.ports import SSTable
from ringsnap.coordinator.runs.resources import Resource


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


class CatalogResources:
    """The resource-ledger calls of a journal whose run makes clones on the run engine: each
    recorded before it is made, named once made, gone once its deletion was confirmed."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog

    async def record_resources(self, resources: Sequence[Resource]) -> list[int]:
        return [(await asyncio.to_thread(self.catalog.add_resource, r)).id for r in resources]

    async def resource_made(self, entry_id: int, name: str, volume_id: str) -> None:
        await asyncio.to_thread(self.catalog.resource_made, entry_id, name, volume_id)

    async def resource_pending(self, entry_id: int) -> bool:
        entries = await asyncio.to_thread(self.catalog.resources)
        return any(e.id == entry_id for e in entries)

    async def resource_gone(self, entry_id: int) -> None:
        await asyncio.to_thread(self.catalog.resource_gone, entry_id)

    async def resource_failed(self, entry_id: int, error: str) -> None:
        await asyncio.to_thread(self.catalog.resource_failed, entry_id, error)
