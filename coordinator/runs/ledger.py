"""The resource ledger as runs and the retries use it (every call off the event loop), and the one
retry path that undoes what a run left: unmount on the node (or the drill host) that mounts it,
then delete on the array (a clone), delete through the array's port (a backup's snapshot,
`snapshot_undo`: a node-local array's port asks its node's agent), or clear on the node (a native
snapshot tag).

Safety, in one place:
- a resource is in the ledger before it exists (a clone: before the array is asked, by the hint
  its names will contain), so a process killed at any point leaves nothing only it knew about;
- a mapping (a clone presented to a host) is undone first, each round: unmounted on its node
  (confirmed), then unmapped on the array; a clone is deleted only once no mapping of it is left;
- a clone is never deleted while it may be mounted: the unmount on its node must be confirmed
  first (nothing mounted, or the agent knowing no such purpose, is a confirmation); a node that
  does not answer, or is no longer configured, keeps the entry;
- the resources of a cluster a run holds (`lease`) are left alone until the next round: that run
  may be using them; staging is never retried (a resume needs it; its run removes it);
- an entry leaves the ledger only once its undo was confirmed; a failure stays, with its error.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Protocol

from ringsnap.coordinator.presentation import HostLookup, unpresent_entry
from ringsnap.coordinator.runs.lease import Lease
from ringsnap.coordinator.runs.resources import LedgerEntry, Resource, ResourceType
from ringsnap.coordinator.runs.snapshot_undo import NotYetMade, SnapshotUndo
from ringsnap.errors import RingsnapError
from ringsnap.logs import get_logger
from ringsnap.plugins.errors import NotFoundError
from ringsnap.plugins.types import SnapshotRef, Volume

log = get_logger(__name__)

#: How long a retry waits for a node to confirm an unmount (a cut network must not hold the loop).
UNMOUNT_TIMEOUT_SECONDS = 120.0
#: How long a clone known only by its hint is looked for before the entry lets it go (the call
#: that never answered may still make it).
UNNAMED_GRACE = timedelta(minutes=15)


class LedgerStore(Protocol):
    """The catalog's ledger (`catalog.runs.RunStore`); blocking calls."""

    def add_resource(self, resource: Resource) -> LedgerEntry: ...

    def resource_made(self, entry_id: int, name: str, volume_id: str = "") -> None: ...

    def resource_failed(self, entry_id: int, error: str) -> None: ...

    def resource_gone(self, entry_id: int) -> None: ...

    def resources(self, run_id: str | None = None) -> list[LedgerEntry]: ...

    def snapshot_made(self, entry_id: int, ref: SnapshotRef) -> None: ...


class Ledger:
    """The ledger for a run's steps: record before making, name once made, gone once undone."""

    def __init__(self, store: LedgerStore) -> None:
        self.store = store

    async def record(self, resource: Resource) -> int:
        return (await asyncio.to_thread(self.store.add_resource, resource)).id

    async def made(self, entry_id: int, name: str, volume_id: str = "") -> None:
        await asyncio.to_thread(self.store.resource_made, entry_id, name, volume_id)

    async def failed(self, entry_id: int, error: str) -> None:
        await asyncio.to_thread(self.store.resource_failed, entry_id, error)

    async def snapshot_made(self, entry_id: int, ref: SnapshotRef) -> None:
        """A snapshot entry's array answered: deleted by `ref` from now on."""
        await asyncio.to_thread(self.store.snapshot_made, entry_id, ref)

    async def gone(self, entry_id: int) -> None:
        await asyncio.to_thread(self.store.resource_gone, entry_id)

    async def entries(self, run_id: str | None = None) -> list[LedgerEntry]:
        return await asyncio.to_thread(self.store.resources, run_id)

    async def pending(self, entry_id: int) -> bool:
        return any(e.id == entry_id for e in await self.entries())


class NodeHolder(Protocol):
    """A node's agent, as the retries need it."""

    async def unmount_clones(self, purpose_id: str) -> Sequence[str]: ...


class DrillHostHolder(Protocol):
    """A cluster's drill host, as the retries need it (both calls idempotent)."""

    async def stop_drill(self, purpose_id: str) -> object: ...

    async def unmount_clones(self, purpose_id: str) -> Sequence[str]: ...


class TagHolder(Protocol):
    async def clear_snapshot(self, tag: str) -> None: ...


class ArrayClones(Protocol):
    async def list_volumes(self) -> Sequence[Volume]: ...

    async def delete_clone(self, volume: Volume) -> None: ...


class _NotFound(Exception):
    """The agent knows no such purpose (its NOT_FOUND): nothing runs or is mounted under it."""


async def _known(call: Awaitable[object]) -> None:
    try:
        await call
    except Exception as exc:
        if getattr(exc, "code", "") == "NOT_FOUND":
            raise _NotFound(str(exc)) from None
        raise


class NotConfirmed(RingsnapError):
    """The node did not confirm the unmount: the clone is kept."""


class LedgerRetry:
    """Undoes the ledger's entries. `node_agent(cluster, node)` is that node's agent (None when
    the configuration no longer has it), `drill_host(cluster)` the cluster's drill host (None:
    none configured); `held(cluster)` is the lease on it (None: free)."""

    def __init__(
        self,
        ledger: Ledger,
        arrays: Mapping[str, ArrayClones],
        *,
        node_agent: Callable[[str, str], NodeHolder | None],
        tag_agent: Callable[[str, str], TagHolder | None],
        held: Callable[[str], Lease | None],
        now: Callable[[], datetime],
        unmount_timeout: float = UNMOUNT_TIMEOUT_SECONDS,
        drill_host: Callable[[str], DrillHostHolder | None] = lambda _cluster: None,
        node_host: Callable[[str], HostLookup | None] | None = None,
        snapshots: SnapshotUndo | None = None,
    ) -> None:
        self.ledger = ledger
        #: How backups' snapshot entries are deleted (None: kept, saying this retry does not).
        self.snapshots = snapshots
        self.arrays = arrays
        self.node_agent = node_agent
        self.tag_agent = tag_agent
        self.drill_host = drill_host
        self.held = held
        self.now = now
        self.unmount_timeout = unmount_timeout
        #: `node_host(cluster)`: how a node's host is found by its initiators, for a mapping
        #: recorded before the array named its host object.
        self.node_host = node_host

    async def run(
        self, entries: Sequence[LedgerEntry] | None = None, *, even_if_held: bool = False
    ) -> int:
        """Undo each entry (all of the ledger by default); how many are left. `even_if_held`: the
        caller knows no run uses them (a deleted backup's native tags)."""
        todo = list(await self.ledger.entries() if entries is None else entries)
        # Mappings first: a clone still mapped to a host is not deleted behind its back.
        todo.sort(key=lambda e: e.resource.type is not ResourceType.MAPPING)
        mapped: set[tuple[str, str]] = set()
        for entry in todo:
            resource = entry.resource
            if resource.type is ResourceType.STAGING:
                continue
            holder = None if even_if_held else self.held(resource.cluster)
            if holder is not None:
                log.info(
                    "resource retry deferred",
                    resource=resource.describe(),
                    held_by=holder.describe(),
                )
                continue
            if resource.type is ResourceType.CLONE and (resource.array, resource.name) in mapped:
                await self.ledger.failed(entry.id, "still presented to a host: unmapped first")
                continue
            try:
                gone = await self.undo(entry)
            except Exception as exc:
                if resource.type is ResourceType.MAPPING:
                    mapped.add((resource.array, resource.name))
                log.warning(
                    "resource not undone; will retry", resource=resource.describe(), error=str(exc)
                )
                await self.ledger.failed(entry.id, str(exc))
                continue
            if gone:
                await self.ledger.gone(entry.id)
        return len(await self.ledger.entries())

    async def undo(self, entry: LedgerEntry) -> bool:
        """Undo one entry; False when it must be looked at again (a clone not made yet)."""
        resource = entry.resource
        if resource.type is ResourceType.NATIVE_TAG:
            agent = self.tag_agent(resource.cluster, resource.node)
            if agent is None:
                raise RingsnapError(
                    f"node {resource.node} of cluster {resource.cluster} is no longer configured;"
                    f" clear its snapshot by hand (nodetool clearsnapshot -t {resource.name})"
                )
            await agent.clear_snapshot(resource.name)
            return True
        if resource.type is ResourceType.MAPPING:
            if resource.mount_purpose and resource.drill_host:
                await self.unmount_on_drill_host(resource)
            elif resource.mount_purpose:
                await self.unmount(resource)
            hosts = self.node_host(resource.cluster) if self.node_host is not None else None
            await unpresent_entry(entry, self.arrays, hosts)
            return True
        if resource.type is ResourceType.SNAPSHOT and self.snapshots is not None:
            try:
                await self.snapshots.delete(entry)
            except NotYetMade as exc:
                await self.ledger.failed(entry.id, str(exc))
                return False
            return True
        if resource.type is not ResourceType.CLONE:
            # Never undo an entry of another type as if it were a clone.
            raise RingsnapError(
                f"{resource.describe()}: this ringsnap does not undo {resource.type.value}"
                " entries; delete it by hand"
            )
        if resource.mount_purpose and resource.drill_host:
            await self.unmount_on_drill_host(resource)
        elif resource.mount_purpose:
            await self.unmount(resource)
        return await self._delete_clone(entry)

    async def unmount(self, resource: Resource) -> None:
        """Unmount the resource's purpose on its node; raises NotConfirmed unless confirmed."""
        agent = self.node_agent(resource.cluster, resource.node)
        if agent is None:
            raise NotConfirmed(
                f"{resource.describe()}: node {resource.node} of cluster {resource.cluster} mounted"
                f" it (purpose {resource.mount_purpose}) and is not in the configuration; it is"
                " not deleted while it may be mounted: unmount it there by hand, then delete it"
            )
        try:
            detached = await asyncio.wait_for(
                agent.unmount_clones(resource.mount_purpose), self.unmount_timeout
            )
        except TimeoutError:
            raise self._not_confirmed(
                resource, f"no answer in {self.unmount_timeout:g} s"
            ) from None
        except Exception as exc:
            if getattr(exc, "code", "") != "NOT_FOUND":
                raise self._not_confirmed(resource, str(exc)) from None
            detached = ()  # the agent knows no such purpose: nothing mounted
        log.info(
            "clone unmounted on its node before its deletion",
            resource=resource.describe(),
            detached=list(detached),
        )

    async def unmount_on_drill_host(self, resource: Resource) -> None:
        """Stop the drill of the resource's purpose on its cluster's drill host (a drill that
        ended or never started is fine), then unmount; raises NotConfirmed unless confirmed."""
        host = self.drill_host(resource.cluster)
        if host is None:
            raise NotConfirmed(
                f"{resource.describe()}: cluster {resource.cluster} has no drill host configured"
                " to unmount it from; it is not deleted while it may be mounted: unmount it there"
                " by hand, then configure the drill host again or delete the clone by hand"
            )
        try:
            with contextlib.suppress(_NotFound):
                await asyncio.wait_for(
                    _known(host.stop_drill(resource.mount_purpose)), self.unmount_timeout
                )
            detached = await asyncio.wait_for(
                host.unmount_clones(resource.mount_purpose), self.unmount_timeout
            )
        except TimeoutError:
            raise self._not_confirmed(
                resource, f"no answer in {self.unmount_timeout:g} s"
            ) from None
        except Exception as exc:
            raise self._not_confirmed(resource, str(exc)) from None
        log.info(
            "clone unmounted on the drill host before its deletion",
            resource=resource.describe(),
            detached=list(detached),
        )

    @staticmethod
    def _not_confirmed(resource: Resource, why: str) -> NotConfirmed:
        whose = "the drill host" if resource.drill_host else f"node {resource.node}"
        return NotConfirmed(
            f"{resource.describe()}: {whose} did not confirm it is unmounted ({why}); it is kept"
            " (never deleted while it may be mounted) and retried"
        )

    async def _delete_clone(self, entry: LedgerEntry) -> bool:
        resource = entry.resource
        array = self.arrays.get(resource.array)
        if array is None:
            raise RingsnapError(
                f"{resource.describe()}: array {resource.array!r} is no longer configured;"
                " delete the clone by hand"
            )
        if resource.made:
            found = [Volume(name=resource.name, id=resource.volume_id)]
        else:
            # Recorded before the array answered: look for what the call may have made.
            found = [v for v in await array.list_volumes() if resource.name_hint in v.name]
            if not found and self.now() - entry.created_at < UNNAMED_GRACE:
                await self.ledger.failed(
                    entry.id, "not on the array yet; a clone call still in flight may make it"
                )
                return False
        for volume in found:
            with contextlib.suppress(NotFoundError):  # already gone: what the undo wants
                await array.delete_clone(volume)
        return True
