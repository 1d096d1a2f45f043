"""The array side of a run that reads a backup through clones (table restores, exports): clone a
snapshot's volumes, and delete the clones again with their ledger entries kept true.

The run records each clone in the resource ledger before the array is asked (`runs.ledger`);
deleting goes through here so that every run leaves the catalog the same way: a clone the
coordinator's retries deleted meanwhile is taken as deleted, a deleted clone's entry goes, and one
the array would not delete stays with the array's error. A record from before the ledger names a
pending cleanup instead (`cleanup_id`): catalog migration 13 moved those rows to the ledger, so
such a clone is the ledger's retries' to delete and is taken as deleted here. Mounting and
unmounting are the node's side (`clone_client`); drills keep their own teardown
(`drill.workflow`), which never raises and records each failure on the node instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol, TypeVar

from ringsnap.coordinator.ports import ArrayPort
from ringsnap.errors import RingsnapError
from ringsnap.logs import get_logger
from ringsnap.plugins.types import SnapshotRef, Volume

log = get_logger(__name__)

#: One array call (clone, delete a clone).
ARRAY_TIMEOUT_SECONDS = 900.0
#: Said after the clones an array would not delete.
LEFT_PENDING = " (they stay pending cleanups, retried by the coordinator)"


class CloneCleanups(Protocol):
    """The catalog's pending cleanups of a run's clones (calls are blocking-free coroutines)."""

    async def cleanup_pending(self, cleanup_id: int) -> bool:
        """Whether the cleanup is still pending (the coordinator's retries may have done it)."""
        ...

    async def cleanup_done(self, cleanup_id: int) -> None: ...

    async def cleanup_failed(self, cleanup_id: int, error: str) -> None: ...


class RecordedClone(Protocol):
    """A clone as a run's record keeps it ("" clone: not made yet)."""

    @property
    def array(self) -> str: ...

    @property
    def clone(self) -> str: ...

    @property
    def clone_id(self) -> str: ...

    @property
    def cleanup_id(self) -> int: ...

    @property
    def deleted(self) -> bool: ...


class CloneTimedOut(RingsnapError):
    """An array did not finish a clone call in time: it may still make the clones, which no run
    has recorded, so the message tells the operator where to look."""

    def __init__(self, array: str, ref: SnapshotRef, suffix: str, timeout: float) -> None:
        super().__init__(
            f"array {array} did not finish cloning snapshot {ref.snapshot_name} within"
            f" {timeout:.0f} s; it may still make the clones (their names built from {suffix!r}),"
            " which ringsnap has not recorded as cleanups: once the run has ended, look for them"
            " on the array and delete them"
        )


async def clone_in_time(
    port: ArrayPort, array: str, ref: SnapshotRef, suffix: str, timeout: float
) -> Sequence[Volume]:
    """`port.clone(ref, suffix)` within `timeout` seconds, or `CloneTimedOut` (logged)."""
    try:
        return await asyncio.wait_for(port.clone(ref, suffix), timeout)
    except TimeoutError:
        log.warning(
            "array clone timed out; clones may still appear",
            array=array,
            snapshot=ref.snapshot_name,
            suffix=suffix,
            timeout_seconds=timeout,
        )
        raise CloneTimedOut(array, ref, suffix, timeout) from None


C = TypeVar("C", bound=RecordedClone)
#: Called once a clone is gone; `by_retry`: the coordinator's pending-cleanup retries deleted it.
Deleted = Callable[[C, bool], Awaitable[None]]


class CloneSession:
    """Clones made on the run's arrays and deleted again, each deletion kept in the catalog."""

    def __init__(
        self,
        arrays: Mapping[str, ArrayPort],
        cleanups: CloneCleanups,
        *,
        timeout: float = ARRAY_TIMEOUT_SECONDS,
    ) -> None:
        self.arrays = arrays
        self.cleanups = cleanups
        self.timeout = timeout

    async def clone(self, array: str, ref: SnapshotRef, suffix: str) -> dict[str, Volume]:
        """Clone every member of `ref` on `array`: the clone of each backed-up volume, by its
        name (drivers return the clones in the order of the snapshot's members)."""
        made = await clone_in_time(self.arrays[array], array, ref, suffix, self.timeout)
        return {m.volume.name: clone for m, clone in zip(ref.members, made, strict=True)}

    async def delete(
        self, clones: Sequence[C], deleted: Deleted[C], *, key: Callable[[C], int] | None = None
    ) -> str:
        """Delete each made and not yet deleted clone on its array; "" when all are gone, else
        what was not deleted (those stay pending cleanups, with the array's error). `key` is the
        clone's id in `cleanups` (by default its `cleanup_id`)."""
        failures: list[str] = []
        for clone in clones:
            if not clone.clone or clone.deleted:
                continue
            cleanup_id = key(clone) if key is not None else clone.cleanup_id
            if cleanup_id and not await self.cleanups.cleanup_pending(cleanup_id):
                await deleted(clone, True)
                continue
            try:
                await asyncio.wait_for(
                    self.arrays[clone.array].delete_clone(Volume(clone.clone, clone.clone_id)),
                    self.timeout,
                )
            except Exception as exc:
                failures.append(f"array {clone.array}: clone {clone.clone} not deleted: {exc}")
                if cleanup_id:
                    await self.cleanups.cleanup_failed(cleanup_id, str(exc))
                continue
            if cleanup_id:
                await self.cleanups.cleanup_done(cleanup_id)
            await deleted(clone, False)
        return "; ".join(failures) + LEFT_PENDING if failures else ""
