"""The pending cleanups the catalog holds, retried until each is done: array snapshots (by their
reference, or by name while a call that never answered may still make them), clones (unmounted
first by the agent that mounted them, and left alone while an operation holds their cluster), and
native snapshots (cleared by the node's agent). A cleanup that fails stays pending with its error;
nothing is lost."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta

from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.drill.cleanups import NodeAgents, cleanup_clone, delete_clone
from ringsnap.coordinator.drill.ports import DrillHost
from ringsnap.coordinator.model import PendingCleanup, native_cleanup_node
from ringsnap.coordinator.ports import AgentPort, ArrayPort
from ringsnap.coordinator.runs.lease import ClusterLeases
from ringsnap.errors import RingsnapError
from ringsnap.logs import get_logger
from ringsnap.plugins.types import Volume

log = get_logger(__name__)

#: How long a snapshot known only by name is looked for before the cleanup lets it go.
NAME_CLEANUP_GRACE = timedelta(minutes=15)


class PendingCleanups:
    """Runs pending cleanups against the configured arrays and agents.

    `drill_hosts()` are the drill hosts by cluster and `clone_holders(cluster, node)` the agent
    of a node that mounts clones (both opened on first use); `node_agent(cluster, node)` is the
    configured node's agent (None when it is no longer configured); `volume_names(array)` the
    names of the configured volumes on an array.
    """

    def __init__(
        self,
        catalog: Catalog,
        arrays: Mapping[str, ArrayPort],
        leases: ClusterLeases,
        *,
        drill_hosts: Callable[[], Mapping[str, DrillHost]],
        clone_holders: NodeAgents,
        node_agent: Callable[[str, str], AgentPort | None],
        volume_names: Callable[[str], set[str]],
        now: Callable[[], datetime],
    ) -> None:
        self.catalog = catalog
        self.arrays = arrays
        self.leases = leases
        self._drill_hosts = drill_hosts
        self._clone_holders = clone_holders
        self._node_agent = node_agent
        self._volume_names = volume_names
        self._now = now

    async def run(self, cleanups: Sequence[PendingCleanup]) -> None:
        for cleanup in cleanups:
            array = self.arrays.get(cleanup.array)
            try:
                if (node := native_cleanup_node(cleanup.array)) is not None:
                    await self._clear_native_snapshot(*node, cleanup.name)
                elif array is None:
                    raise RingsnapError(f"array {cleanup.array!r} is no longer configured")
                elif (clone := cleanup_clone(cleanup.snapshot_name)) is not None:
                    if (holder := self.leases.holder(clone.cluster)) is not None:
                        # Its drill or export may still be using it: the next round retries.
                        log.info(
                            "clone cleanup deferred", clone=cleanup.name, by=holder.describe()
                        )
                        continue
                    await delete_clone(clone, array, self._drill_hosts(), self._clone_holders)
                elif cleanup.ref is not None:
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

    async def _clear_native_snapshot(self, cluster: str, node: str, tag: str) -> None:
        agent = self._node_agent(cluster, node)
        if agent is None:
            raise RingsnapError(
                f"node {node} of cluster {cluster} is no longer configured; clear its native"
                f" snapshot by hand (nodetool clearsnapshot -t {tag})"
            )
        await agent.clear_snapshot(tag)

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
