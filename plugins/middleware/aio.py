"""The async facade: the coordinator's `ArrayPort` over a wrapped driver, each call in a worker
thread (`asyncio.to_thread`, which carries the caller's `deadline()` along).

A cancelled coroutine does not stop the array call already running in its thread; the driver's own
timeouts bound it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from ringsnap.plugins.api import PreparedSnapshot
from ringsnap.plugins.middleware.base import WrappedDriver
from ringsnap.plugins.types import (
    Capabilities,
    HostInitiators,
    Presentation,
    SnapshotInfo,
    SnapshotRef,
    Volume,
)


class AsyncDriver:
    """`ringsnap.coordinator.ports.ArrayPort` for one array, around its wrapped driver."""

    def __init__(self, wrapped: WrappedDriver) -> None:
        self._wrapped = wrapped

    @property
    def array(self) -> str:
        return self._wrapped.array

    @property
    def name(self) -> str:
        return self._wrapped.name

    def capabilities(self) -> Capabilities:
        return self._wrapped.capabilities()

    async def check(self) -> None:
        await asyncio.to_thread(self._wrapped.check)

    async def list_volumes(self) -> Sequence[Volume]:
        return await asyncio.to_thread(self._wrapped.list_volumes)

    @property
    def identifies_volumes(self) -> bool:
        return self._wrapped.identifies_volumes

    async def host_identities(self, volumes: Sequence[Volume]) -> Mapping[str, tuple[str, ...]]:
        return await asyncio.to_thread(self._wrapped.host_identities, volumes)

    async def create_group_snapshot(self, volumes: Sequence[Volume], name: str) -> SnapshotRef:
        return await asyncio.to_thread(self._wrapped.create_group_snapshot, volumes, name)

    async def prepare_group_snapshot(
        self, volumes: Sequence[Volume], name: str
    ) -> PreparedSnapshot:
        return await asyncio.to_thread(self._wrapped.prepare_group_snapshot, volumes, name)

    async def commit_group_snapshot(self, prepared: PreparedSnapshot) -> SnapshotRef:
        return await asyncio.to_thread(self._wrapped.commit_group_snapshot, prepared)

    async def describe_group_snapshot(
        self, prepared: PreparedSnapshot, ref: SnapshotRef
    ) -> SnapshotRef:
        return await asyncio.to_thread(self._wrapped.describe_group_snapshot, prepared, ref)

    async def finish_group_snapshot(self, prepared: PreparedSnapshot) -> None:
        await asyncio.to_thread(self._wrapped.finish_group_snapshot, prepared)

    async def abort_group_snapshot(self, prepared: PreparedSnapshot) -> None:
        await asyncio.to_thread(self._wrapped.abort_group_snapshot, prepared)

    async def list_snapshots(self, volumes: Sequence[Volume]) -> Sequence[SnapshotInfo]:
        return await asyncio.to_thread(self._wrapped.list_snapshots, volumes)

    async def get_snapshot(self, ref: SnapshotRef) -> SnapshotInfo:
        return await asyncio.to_thread(self._wrapped.get_snapshot, ref)

    async def delete_snapshot(self, ref: SnapshotRef) -> None:
        await asyncio.to_thread(self._wrapped.delete_snapshot, ref)

    async def revert_plan(self, ref: SnapshotRef) -> Sequence[str]:
        return await asyncio.to_thread(self._wrapped.revert_plan, ref)

    async def revert(self, ref: SnapshotRef) -> None:
        await asyncio.to_thread(self._wrapped.revert, ref)

    async def clone(self, ref: SnapshotRef, suffix: str) -> Sequence[Volume]:
        return await asyncio.to_thread(self._wrapped.clone, ref, suffix)

    async def delete_clone(self, volume: Volume) -> None:
        await asyncio.to_thread(self._wrapped.delete_clone, volume)

    async def present(
        self, volumes: Sequence[Volume], host: HostInitiators
    ) -> Sequence[Presentation]:
        return await asyncio.to_thread(self._wrapped.present, volumes, host)

    async def unpresent(self, volumes: Sequence[Volume], host: HostInitiators) -> None:
        await asyncio.to_thread(self._wrapped.unpresent, volumes, host)

    async def close(self) -> None:
        await asyncio.to_thread(self._wrapped.close)
