"""The pending cleanups the catalog holds, retried until each is done: array snapshots of backups
(by their reference, or by name while a call that never answered may still make them). A cleanup
that fails stays pending with its error; nothing is lost. Clones and native snapshot tags are in
the resource ledger (`runs.ledger`), retried by its own path."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta

from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.model import PendingCleanup
from ringsnap.coordinator.ports import ArrayPort
from ringsnap.errors import RingsnapError
from ringsnap.logs import get_logger
from ringsnap.plugins.types import Volume

log = get_logger(__name__)

#: How long a snapshot known only by name is looked for before the cleanup lets it go.
NAME_CLEANUP_GRACE = timedelta(minutes=15)
#: How an older ringsnap named a clone in a cleanup row (`clone:` and JSON).
_UNREADABLE_CLONE = "clone:"


class PendingCleanups:
    """Runs pending cleanups against the configured arrays; `volume_names(array)` are the names
    of the configured volumes on an array."""

    def __init__(
        self,
        catalog: Catalog,
        arrays: Mapping[str, ArrayPort],
        *,
        volume_names: Callable[[str], set[str]],
        now: Callable[[], datetime],
    ) -> None:
        self.catalog = catalog
        self.arrays = arrays
        self._volume_names = volume_names
        self._now = now

    async def run(self, cleanups: Sequence[PendingCleanup]) -> None:
        for cleanup in cleanups:
            array = self.arrays.get(cleanup.array)
            try:
                if array is None:
                    raise RingsnapError(f"array {cleanup.array!r} is no longer configured")
                if cleanup.ref is None and cleanup.snapshot_name.startswith(_UNREADABLE_CLONE):
                    # Only a row ringsnap never wrote: catalog migration 13 moved every readable
                    # clone record to the ledger. Kept, saying what to do.
                    raise RingsnapError(
                        f"cleanup {cleanup.id} holds an unreadable clone record"
                        f" {cleanup.snapshot_name!r}: delete that clone by hand"
                    )
                if cleanup.ref is not None:
                    await array.delete_snapshot(cleanup.ref)
                elif not await self._delete_by_name(array, cleanup):
                    continue
            except Exception as exc:
                log.warning(
                    "cleanup failed; will retry",
                    array=cleanup.array,
                    snapshot=cleanup.name,
                    error=str(exc),
                )
                await asyncio.to_thread(self.catalog.cleanup_failed, cleanup.id, str(exc))
                continue
            log.info(
                "snapshot deleted",
                array=cleanup.array,
                snapshot=cleanup.name,
                reason=cleanup.reason,
            )
            await asyncio.to_thread(self.catalog.cleanup_done, cleanup.id)

    async def _delete_by_name(self, array: ArrayPort, cleanup: PendingCleanup) -> bool:
        """Delete a snapshot known only by name; False while it may still appear.

        A call that never answered (a killed coordinator, a hung array) can still make its snapshot
        later, so a name not found yet stays pending for NAME_CLEANUP_GRACE before it is let go.
        """
        volumes = await self._configured_volumes(cleanup.array)
        found = [
            i.ref
            for i in await array.list_snapshots(volumes)
            if i.ref.snapshot_name == cleanup.snapshot_name
        ]
        for ref in found:
            await array.delete_snapshot(ref)
        if found or self._now() - cleanup.created_at >= NAME_CLEANUP_GRACE:
            return True
        await asyncio.to_thread(
            self.catalog.cleanup_failed,
            cleanup.id,
            "not on the array yet; a call still in flight may make it, so it is looked for again",
        )
        return False

    async def _configured_volumes(self, array: str) -> list[Volume]:
        wanted = self._volume_names(array)
        return [v for v in await self.arrays[array].list_volumes() if v.name in wanted]
