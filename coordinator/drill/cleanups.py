"""Clones as pending cleanups (drills, exports): a clone is recorded in the catalog's
`pending_cleanups` the moment the array made it, before anything uses it, and leaves only when the
array confirmed its deletion. A clone whose deletion fails (or a coordinator killed mid-run) stays
there, and the coordinator retries it with the snapshots (`Coordinator.run_pending_cleanups`):
never forgotten.

The cleanup row names the clone in its `snapshot_name` column as `clone:` and a small JSON object:
the array's name and id of the volume (drivers delete a clone by id, FlashArray by name), the
cluster and the purpose id it was mounted under, and which agent mounted it: `node` (a node of the
cluster, e.g. an export's) or, without `node`, the cluster's drill host. One retry path serves
them all: it unmounts that purpose on that agent first (UnmountClones is idempotent: nothing
mounted is success), and deletes the clone only once the agent confirmed; an agent that does not
answer keeps the cleanup pending (logged by the caller), so no volume is ever deleted under a mount.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from ringsnap.coordinator.drill.ports import DrillHost
from ringsnap.coordinator.model import CleanupRequest
from ringsnap.coordinator.ports import AgentError, ArrayPort
from ringsnap.errors import RingsnapError
from ringsnap.logs import get_logger
from ringsnap.plugins.types import Volume

log = get_logger(__name__)

CLONE_CLEANUP_PREFIX = "clone:"
#: How long a retry waits for the agent to confirm the unmount (a cut network must not hold the
#: daemon's cleanup loop): no answer keeps the cleanup.
UNMOUNT_TIMEOUT_SECONDS = 120.0
#: Node names as the configuration allows them (a catalog row never names anything else).
_MAX_NODE_NAME = 253


@dataclass(frozen=True)
class CloneCleanup:
    volume: Volume
    cluster: str
    purpose_id: str
    #: The node of `cluster` whose agent mounted the clone; "" for the cluster's drill host.
    node: str = ""


class CloneHolder(Protocol):
    """An agent that mounts clones: UnmountClones of a purpose (idempotent)."""

    async def unmount_clones(self, purpose_id: str) -> Sequence[str]: ...


#: The agent of (cluster, node) from the coordinator's configuration; None if it names no such node.
NodeAgents = Callable[[str, str], CloneHolder | None]


def clone_cleanup(
    array: str, clone: Volume, reason: str, *, cluster: str, purpose_id: str, node: str = ""
) -> CleanupRequest:
    """The cleanup of a clone mounted under `purpose_id` by the agent of `node` (of `cluster`), or
    by the cluster's drill host when `node` is empty."""
    fields = {"name": clone.name, "id": clone.id, "cluster": cluster, "purpose": purpose_id}
    if node:
        fields["node"] = node
    body = json.dumps(fields, separators=(",", ":"), sort_keys=True)
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
    node = body.get("node", "")
    if not isinstance(node, str) or len(node) > _MAX_NODE_NAME or (node and not node.isprintable()):
        raise ValueError(
            f"clone cleanup {snapshot_name!r} names no readable node: unmount and delete that"
            " clone by hand"
        )
    if node and not body["purpose"]:
        raise ValueError(
            f"clone cleanup {snapshot_name!r} names node {node} but no purpose to unmount: unmount"
            " and delete that clone by hand"
        )
    return CloneCleanup(
        Volume(name=body["name"], id=body["id"]), body["cluster"], body["purpose"], node
    )


async def delete_clone(
    cleanup: CloneCleanup,
    array: ArrayPort,
    hosts: Mapping[str, DrillHost],
    nodes: NodeAgents | None = None,
) -> None:
    """Unmount the clone's purpose on the agent that mounted it (a node's, or the cluster's drill
    host, whose drill is stopped first; all idempotent), then delete the clone; raises (the
    cleanup stays pending) when any of it fails, and never deletes a clone not confirmed
    unmounted."""
    if cleanup.node:
        await _unmount_on_node(cleanup, nodes)
        await array.delete_clone(cleanup.volume)
        return
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


async def _unmount_on_node(cleanup: CloneCleanup, nodes: NodeAgents | None) -> None:
    name, node = cleanup.volume.name, cleanup.node
    agent = nodes(cleanup.cluster, node) if nodes is not None else None
    if agent is None:
        raise RingsnapError(
            f"clone {name}: node {node} of cluster {cleanup.cluster} mounted it (purpose"
            f" {cleanup.purpose_id}) and is not in the configuration; it is not deleted while it"
            " may be mounted: unmount it on that node by hand, then delete the clone by hand"
        )
    try:
        detached = await asyncio.wait_for(
            agent.unmount_clones(cleanup.purpose_id), UNMOUNT_TIMEOUT_SECONDS
        )
    except AgentError as exc:
        if exc.code != "NOT_FOUND":
            raise _not_confirmed(cleanup, str(exc)) from None
        detached = ()  # the agent knows no clone of that purpose: nothing mounted
    except TimeoutError:
        raise _not_confirmed(cleanup, f"no answer in {UNMOUNT_TIMEOUT_SECONDS:g} s") from None
    log.info(
        "clone unmounted on its node before its deletion",
        clone=name,
        node=node,
        purpose_id=cleanup.purpose_id,
        detached=list(detached),
    )


def _not_confirmed(cleanup: CloneCleanup, why: str) -> RingsnapError:
    return RingsnapError(
        f"clone {cleanup.volume.name}: node {cleanup.node} did not confirm it is unmounted"
        f" ({why}); it is kept (never deleted while it may be mounted) and retried"
    )


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


class ClosableCloneHolder(CloneHolder, Protocol):
    async def close(self) -> None: ...


class NodeAgentCache:
    """The agents of the nodes that mounted clones, opened on first use (for the cleanups)."""

    def __init__(self, open_agent: Callable[[str, str], ClosableCloneHolder | None]) -> None:
        self._open = open_agent
        self._agents: dict[tuple[str, str], ClosableCloneHolder | None] = {}

    def get(self, cluster: str, node: str) -> CloneHolder | None:
        key = (cluster, node)
        if key not in self._agents:
            self._agents[key] = self._open(cluster, node)
        return self._agents[key]

    async def close(self) -> None:
        agents, self._agents = self._agents, {}
        for agent in agents.values():
            if agent is not None:
                await agent.close()
