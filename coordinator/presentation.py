"""Presenting clones to the host that mounts them, and taking them away again (issue 20).

On a SAN a clone is invisible to every host until the array maps it to that host's host object.
Every flow that has an agent mount clones (exports, table restores, drills) goes through here:

    clones = await presenter.present(node, purpose, clones)   # before MountClones
    ...
    await presenter.unpresent(node, purpose)                  # after UnmountClones confirmed

Safety: each mapping is a `mapping` entry of the resource ledger BEFORE the array is asked to make
it (volume, array, node and the purpose it is mounted under, plus the host object once known), and
leaves the ledger only once the array confirmed the unmapping. A coordinator killed between the
present and the mount, or between the unmount and the unpresent, leaves the entry; the ledger's
retry (`runs.ledger`) unmounts on the node first, then unpresents.

A clone on an array whose driver cannot present (LVM: the volumes are the node's own disks) is
passed on as it is: the agent's attach hook attaches it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol, cast

from ringsnap.coordinator.clone_mounts import CloneToMount
from ringsnap.coordinator.config import ClusterSection
from ringsnap.coordinator.model import RestoreNode
from ringsnap.coordinator.ports import VolumeState
from ringsnap.coordinator.runs.resources import LedgerEntry, Resource, ResourceType
from ringsnap.errors import RingsnapError
from ringsnap.logs import get_logger
from ringsnap.plugins.types import Capabilities, HostInitiators, Presentation, Volume

log = get_logger(__name__)


class PresentingArray(Protocol):
    """An array port whose driver can present (`ringsnap.plugins.api.Presentable`)."""

    def capabilities(self) -> Capabilities: ...

    async def list_volumes(self) -> Sequence[Volume]: ...

    async def present(
        self, volumes: Sequence[Volume], host: HostInitiators
    ) -> Sequence[Presentation]: ...

    async def unpresent(self, volumes: Sequence[Volume], host: HostInitiators) -> None: ...


def presenting(port: object) -> PresentingArray | None:
    """`port` as a presenting array, or None when its driver cannot present."""
    capabilities = getattr(port, "capabilities", None)
    if capabilities is None or not hasattr(port, "present"):
        return None
    if not cast(Callable[[], Capabilities], capabilities)().present:
        return None
    return cast(PresentingArray, port)


class MappingStore(Protocol):
    """The catalog's resource ledger (blocking calls; run off the event loop here)."""

    def add_resource(self, resource: Resource) -> LedgerEntry: ...

    def resource_host(self, entry_id: int, host: str) -> None: ...

    def resource_failed(self, entry_id: int, error: str) -> None: ...

    def resource_gone(self, entry_id: int) -> None: ...

    def resources(self, run_id: str | None = None) -> list[LedgerEntry]: ...


class InitiatorSource(Protocol):
    """An agent's report of its host (GetVolumeState: it answers with Cassandra down too)."""

    async def volume_state(self) -> VolumeState: ...


class NoInitiators(RingsnapError):
    exit_code = 3


async def host_of(agent: InitiatorSource, array_host: str | None, who: str) -> HostInitiators:
    """The host `who` as arrays know it: the initiators its agent reports, and the host object
    the configuration names for it (`array_host`). Neither: refused, saying what to set."""
    state = await agent.volume_state()
    host = HostInitiators(state.iqns, state.wwpns, state.nqns, array_host or "")
    if not host.array_host and not host.normalized():
        raise NoInitiators(
            f"{who}: its agent reports no initiator (no /etc/iscsi/initiatorname.iscsi, no FC"
            " port in /sys/class/fc_host, no /etc/nvme/hostnqn) and the configuration names no"
            " array_host for it: set array_host to its host object on the array, or configure"
            " its iSCSI, FC or NVMe initiator"
        )
    return host


@dataclass(frozen=True)
class RunOf:
    """The run the mappings belong to, as the ledger names it."""

    cluster: str
    run_id: str
    run_kind: str


HostLookup = Callable[[str], Awaitable[HostInitiators]]


class Presenter:
    """Presents a run's clones to its nodes' hosts, each mapping in the ledger first.

    `hosts(node)` is the node's host (`host_of`); `arrays` the run's array ports."""

    def __init__(
        self,
        arrays: Mapping[str, object],
        store: MappingStore,
        run: RunOf,
        hosts: HostLookup,
    ) -> None:
        self.arrays = arrays
        self.store = store
        self.run = run
        self.hosts = hosts

    def _array(self, name: str) -> PresentingArray | None:
        port = self.arrays.get(name)
        if port is None:
            raise RingsnapError(f"array {name} is not configured; cannot present its clones")
        return presenting(port)

    async def _entries(self, node: str, purpose: str) -> list[LedgerEntry]:
        entries = await asyncio.to_thread(self.store.resources)
        return [
            e
            for e in entries
            if e.resource.type is ResourceType.MAPPING
            and e.resource.cluster == self.run.cluster
            and host_key(e.resource) == node
            and e.resource.mount_purpose == purpose
        ]

    async def present(
        self, node: str, purpose: str, clones: Sequence[CloneToMount], *, keep: bool = False
    ) -> list[CloneToMount]:
        """Map each clone to `node`'s host; the clones with the identity the host will see
        (`wwn`), in their order. A clone already presented for this purpose is asked again
        (idempotent on the array) under its existing entry.

        `keep`: the mapping is what the run is for (a clone-mode restore: the clones become the
        node's disks), so its entry leaves the ledger once the array confirmed it, before the
        node attaches the clone: a retry never unmaps a disk a node may have mounted."""
        wanted = [c for c in clones if self._array(c.array) is not None]
        if not wanted:
            return list(clones)
        host = await self.hosts(node)
        wanted_ids = await self._with_ids(wanted)
        known = {(e.resource.array, e.resource.name): e for e in await self._entries(node, purpose)}
        identities: dict[tuple[str, str], str] = {}
        for clone in wanted_ids:
            port = self._array(clone.array)
            assert port is not None
            entry = known.get((clone.array, clone.volume))
            if entry is None:
                entry = await asyncio.to_thread(
                    self.store.add_resource,
                    Resource(
                        type=ResourceType.MAPPING,
                        cluster=self.run.cluster,
                        run_id=self.run.run_id,
                        run_kind=self.run.run_kind,
                        reason=f"clone {clone.volume} presented to node {node} for {purpose}",
                        array=clone.array,
                        name=clone.volume,
                        volume_id=clone.volume_id,
                        node="" if node == DRILL_HOST_NODE else node,
                        drill_host=node == DRILL_HOST_NODE,
                        mount_purpose=purpose,
                        host=host.array_host,
                    ),
                )
            volume = Volume(clone.volume, clone.volume_id)
            try:
                (presentation,) = await port.present([volume], host)
            except Exception as exc:
                await asyncio.to_thread(self.store.resource_failed, entry.id, str(exc))
                raise RingsnapError(
                    f"array {clone.array} did not present clone {clone.volume} to node {node}"
                    f" ({host.describe()}): {exc}"
                ) from exc
            if keep:
                await asyncio.to_thread(self.store.resource_gone, entry.id)
            elif presentation.host != entry.resource.host:
                await asyncio.to_thread(self.store.resource_host, entry.id, presentation.host)
            identities[(clone.array, clone.volume)] = presentation.identity
            log.info(
                "clone presented",
                node=node,
                purpose=purpose,
                array=clone.array,
                volume=clone.volume,
                host=presentation.host,
                lun=presentation.lun,
                identity=presentation.identity,
            )
        return [
            replace(c, wwn=identities[(c.array, c.volume)])
            if (c.array, c.volume) in identities
            else c
            for c in clones
        ]

    async def _with_ids(self, clones: Sequence[CloneToMount]) -> list[CloneToMount]:
        """`clones`, each with its id on the array (listed when the run did not record it)."""
        ids: dict[tuple[str, str], str] = {}
        for array in sorted({c.array for c in clones if not c.volume_id}):
            port = self._array(array)
            assert port is not None
            ids.update({(array, v.name): v.id for v in await port.list_volumes()})
        return [
            c if c.volume_id else replace(c, volume_id=ids.get((c.array, c.volume), ""))
            for c in clones
        ]

    async def unpresent(self, node: str, purpose: str) -> None:
        """Unmap every clone presented to `node` for `purpose` (call it once the node confirmed
        they are unmounted); raises naming what the arrays would not unmap (those entries stay,
        with the error, for the ledger's retry)."""
        failures: list[str] = []
        for entry in await self._entries(node, purpose):
            try:
                await unpresent_entry(entry, self.arrays, self.hosts)
            except Exception as exc:
                await asyncio.to_thread(self.store.resource_failed, entry.id, str(exc))
                failures.append(f"{entry.resource.describe()}: {exc}")
                continue
            await asyncio.to_thread(self.store.resource_gone, entry.id)
        if failures:
            raise RingsnapError(
                "clones not unpresented (kept in the ledger, retried): " + "; ".join(failures)
            )


async def unpresent_entry(
    entry: LedgerEntry, arrays: Mapping[str, object], hosts: HostLookup | None
) -> None:
    """Unmap one `mapping` entry's volume from its host on its array (the host object recorded,
    else the node's host as `hosts` finds it). The node must have let go of the device."""
    resource = entry.resource
    port = arrays.get(resource.array)
    if port is None:
        raise RingsnapError(
            f"{resource.describe()}: array {resource.array!r} is no longer configured; unmap the"
            " volume by hand"
        )
    presenter = presenting(port)
    if presenter is None:
        return  # the driver cannot present: it mapped nothing
    if resource.host:
        host = HostInitiators(array_host=resource.host)
    elif hosts is not None:
        host = await hosts(host_key(resource))
    else:
        raise RingsnapError(
            f"{resource.describe()}: the host object is not recorded and its host cannot be"
            " asked for its initiators; unmap the volume by hand"
        )
    await presenter.unpresent([Volume(resource.name, resource.volume_id)], host)
    log.info("clone unpresented", resource=resource.describe())


#: How a presenter and a host lookup name a cluster's drill host (not a valid node name: no
#: clash). The ledger does not: its entries carry the `drill_host` flag (`host_key`).
DRILL_HOST_NODE = "@drill-host"


def host_key(resource: Resource) -> str:
    """Whose host a ledger entry is presented to, as `HostLookup` and `Presenter` name it."""
    return DRILL_HOST_NODE if resource.drill_host else resource.node


def cluster_hosts(
    cluster: ClusterSection,
    agents: Mapping[str, InitiatorSource],
    drill_host: InitiatorSource | None = None,
) -> HostLookup:
    """How the hosts of `cluster` (its nodes, and `DRILL_HOST_NODE`) are found on its arrays:
    each agent asked once for its initiators, with the node's configured `array_host`."""
    found: dict[str, HostInitiators] = {}

    async def lookup(node: str) -> HostInitiators:
        if node not in found:
            if node == DRILL_HOST_NODE:
                if drill_host is None or cluster.drill is None:
                    raise RingsnapError(f"cluster {cluster.name} has no drill host configured")
                found[node] = await host_of(
                    drill_host,
                    cluster.drill.array_host,
                    f"the drill host of cluster {cluster.name}",
                )
            else:
                section = next((n for n in cluster.nodes if n.name == node), None)
                agent = agents.get(node)
                if section is None or agent is None:
                    raise RingsnapError(f"node {node} is not a node of cluster {cluster.name}")
                found[node] = await host_of(
                    agent, section.array_host, f"node {node} of cluster {cluster.name}"
                )
        return found[node]

    return lookup


async def present_restored_clones(
    presenter: Callable[[str], Presenter] | None, restore_id: str, node: RestoreNode
) -> dict[str, str]:
    """A clone-mode restore: map the node's clones to its host before it attaches them; they
    become its disks, so the mappings are kept (`keep`). `presenter`: the restore's, by its id
    (None: nothing is presented). Returns, by mount point, the identity each presented clone has
    on the host: an agent with no attach hook finds it by that (AttachVolume.identity)."""
    clones = [
        CloneToMount(role="data", array=v.array, volume=v.attached_volume)
        for v in node.volumes
        if v.attached_volume and v.attached_volume != v.volume
    ]
    if not clones or presenter is None:
        return {}
    presented = await presenter(restore_id).present(node.name, restore_id, clones, keep=True)
    by_volume = {(c.array, c.volume): c.wwn for c in presented if c.wwn}
    return {
        v.mount_point: by_volume[(v.array, v.attached_volume)]
        for v in node.volumes
        if (v.array, v.attached_volume) in by_volume
    }
