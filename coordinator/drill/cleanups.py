"""A drill's clones as pending cleanups: a clone is recorded in the catalog's `pending_cleanups`
the moment the array made it, before anything uses it, and leaves only when the array confirmed its
deletion. A clone whose deletion fails (or a coordinator killed mid-drill) stays there, and the
coordinator retries it with the snapshots (`Coordinator.run_pending_cleanups`): never forgotten.

The cleanup row names the clone in its `snapshot_name` column as `clone:` and a small JSON object:
the array's name and id of the volume (drivers delete a clone by id, FlashArray by name), and the
cluster and purpose id it was mounted under on the drill host. A retry unmounts that purpose on the
drill host first (UnmountClones is idempotent), so that no volume is ever deleted under a mount.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from ringsnap.coordinator.agents import AgentError
from ringsnap.coordinator.drill.ports import DrillHost
from ringsnap.coordinator.model import CleanupRequest
from ringsnap.coordinator.ports import ArrayPort
from ringsnap.errors import RingsnapError
from ringsnap.plugins.types import Volume

CLONE_CLEANUP_PREFIX = "clone:"


@dataclass(frozen=True)
class CloneCleanup:
    volume: Volume
    cluster: str
    purpose_id: str


def clone_cleanup(
    array: str, clone: Volume, reason: str, *, cluster: str, purpose_id: str
) -> CleanupRequest:
    body = json.dumps(
        {"name": clone.name, "id": clone.id, "cluster": cluster, "purpose": purpose_id},
        separators=(",", ":"),
        sort_keys=True,
    )
    return CleanupRequest(array=array, reason=reason, snapshot_name=CLONE_CLEANUP_PREFIX + body)


def cleanup_clone(snapshot_name: str) -> CloneCleanup | None:
    """The clone a pending cleanup deletes; None for a snapshot's cleanup. A clone cleanup whose
    body cannot be read raises ValueError (the cleanup then stays pending, with the error)."""
    if not snapshot_name.startswith(CLONE_CLEANUP_PREFIX):
        return None
    try:
        body = json.loads(snapshot_name.removeprefix(CLONE_CLEANUP_PREFIX))
    except ValueError:
        body = None
    keys = ("name", "id", "cluster", "purpose")
    if not isinstance(body, dict) or not all(isinstance(body.get(k), str) for k in keys):
        raise ValueError(f"unreadable clone cleanup {snapshot_name!r}: delete that clone by hand")
    if not body["name"]:
        raise ValueError(f"clone cleanup {snapshot_name!r} names no volume: delete it by hand")
    return CloneCleanup(Volume(name=body["name"], id=body["id"]), body["cluster"], body["purpose"])


async def delete_clone(
    cleanup: CloneCleanup, array: ArrayPort, hosts: Mapping[str, DrillHost]
) -> None:
    """Stop the drill and unmount the clone's purpose on its cluster's drill host (both idempotent),
    then delete the clone; raises (the cleanup stays pending) when any of it fails."""
    host = hosts.get(cleanup.cluster)
    if cleanup.purpose_id:
        if host is None:
            raise RingsnapError(
                f"clone {cleanup.volume.name}: cluster {cleanup.cluster} has no drill host"
                " configured to unmount it from; unmount it there by hand, then configure the"
                " drill host again or delete the clone by hand"
            )
        try:
            await host.stop_drill(cleanup.purpose_id)
        except AgentError as exc:
            if exc.code != "NOT_FOUND":  # no drill ran on these clones: nothing to stop
                raise
        await host.unmount_clones(cleanup.purpose_id)
    await array.delete_clone(cleanup.volume)


class DrillHosts:
    """The drill hosts of every cluster of a config, opened on first use (for the cleanups)."""

    def __init__(self, open_hosts: Callable[[], Mapping[str, ClosableDrillHost]]) -> None:
        self._open = open_hosts
        self._hosts: Mapping[str, ClosableDrillHost] | None = None

    def get(self) -> Mapping[str, DrillHost]:
        if self._hosts is None:
            self._hosts = self._open()
        return self._hosts

    async def close(self) -> None:
        hosts, self._hosts = self._hosts, None
        for host in (hosts or {}).values():
            await host.close()


class ClosableDrillHost(DrillHost, Protocol):
    async def close(self) -> None: ...
