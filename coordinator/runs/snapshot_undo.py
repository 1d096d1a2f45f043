"""The undo of a ledger 'snapshot' entry (a backup's array snapshot): deleted through its array's
port, by reference once the array answered, else looked for by name among the snapshots of the
configured volumes. A node-local array (`agent-lvm`) is a port like any other: its delete goes
through that node's agent.

Safety:
- a name only is looked for: a call that never answered (a killed coordinator, a hung array) may
  still make the snapshot, so a name not found is kept for `NAME_GRACE` after the entry was
  recorded, then let go;
- only names ringsnap gives snapshots (backup ids) are looked for: any other name (a row an older
  ringsnap never wrote) is kept, saying to delete it by hand;
- a snapshot already gone is what the undo wants.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Protocol

from ringsnap import names
from ringsnap.coordinator.runs.resources import LedgerEntry
from ringsnap.errors import RingsnapError
from ringsnap.plugins.errors import NotFoundError
from ringsnap.plugins.types import SnapshotInfo, SnapshotRef, Volume

#: How long a snapshot known only by name is looked for before its entry lets it go.
NAME_GRACE = timedelta(minutes=15)


class ArraySnapshots(Protocol):
    """An array's port as the snapshot undo needs it."""

    async def list_volumes(self) -> Sequence[Volume]: ...

    async def list_snapshots(self, volumes: Sequence[Volume]) -> Sequence[SnapshotInfo]: ...

    async def delete_snapshot(self, ref: SnapshotRef) -> None: ...


class NotYetMade(Exception):
    """Not on the array yet: a call still in flight may make it (the entry is looked at again)."""


class SnapshotUndo:
    """Deletes snapshot entries' snapshots; `volume_names(array)` are the configured volumes'
    names on an array (a snapshot looked for by name is one of theirs)."""

    def __init__(
        self,
        arrays: Mapping[str, ArraySnapshots],
        volume_names: Callable[[str], set[str]],
        now: Callable[[], datetime],
    ) -> None:
        self.arrays = arrays
        self.volume_names = volume_names
        self.now = now

    async def delete(self, entry: LedgerEntry) -> None:
        """Delete the entry's snapshot; raises NotYetMade while it may still appear."""
        resource = entry.resource
        array = self.arrays.get(resource.array)
        if array is None:
            raise RingsnapError(
                f"{resource.describe()}: array {resource.array!r} is no longer configured;"
                " delete the snapshot by hand"
            )
        if resource.ref is not None:
            with contextlib.suppress(NotFoundError):
                await array.delete_snapshot(resource.ref)
            return
        try:
            names.snapshot_tag(resource.name, "a snapshot name")
        except ValueError as exc:
            raise RingsnapError(
                f"{resource.describe()}: {exc}; ringsnap never names a snapshot so: delete it"
                " by hand"
            ) from None
        wanted = self.volume_names(resource.array)
        volumes = [v for v in await array.list_volumes() if v.name in wanted]
        found = [
            info.ref
            for info in await array.list_snapshots(volumes)
            if info.ref.snapshot_name == resource.name
        ]
        for ref in found:
            with contextlib.suppress(NotFoundError):
                await array.delete_snapshot(ref)
        if not found and self.now() - entry.created_at < NAME_GRACE:
            raise NotYetMade(
                "not on the array yet; a call still in flight may make it, so it is looked for"
                " again"
            )
