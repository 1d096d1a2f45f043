"""What a drill will do, decided before anything is made: the nodes, the clones of each node's
volumes on each array, the drill host, the expected duration, and every reason to refuse.

Planning asks the production agents and the arrays read-only questions. It refuses a backup that
cannot be cloned (failed, lost, native snapshots), a cluster without a drill host, a node the
backup left out or recorded no canary for, an agent that does not answer, a volume whose production
mount point is unclear, and an array whose driver cannot clone (naming the array) or that lost the
snapshot. A drill changes nothing in production: the plan says so, and no confirmation is asked.
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from ringsnap import device_ids
from ringsnap.coordinator.drill.model import purpose_id
from ringsnap.coordinator.drill.ports import NodeDrillFacts, NodeFactsPort
from ringsnap.coordinator.model import Backup, BackupNode, NodeVolume, SnapshotKind
from ringsnap.coordinator.ports import ArrayPort, NodeVolumeFacts
from ringsnap.coordinator.restore.plan import match_volume, narrowed
from ringsnap.plugins.errors import NotFoundError, SnapshotLostError
from ringsnap.plugins.types import SnapshotRef

#: What the plan says a drill changes in production.
CHANGES_NOTHING = (
    "nothing in production: the drill clones the backup's snapshots, starts each node on its"
    " clones on the drill host in a network namespace without any route, then deletes the clones;"
    " no confirmation is needed"
)


@dataclass(frozen=True)
class DrillSettings:
    #: At most this many nodes drilled at once (`--parallel`).
    max_parallel: int = 1
    #: The drill host tears a node's drill down by itself after this long.
    deadline_seconds: float = 1800.0
    #: How often the drill host is asked how a drill goes.
    poll_seconds: float = 2.0
    #: One agent call (mount, unmount, manifest, stop).
    agent_timeout: float = 600.0
    #: One array's clone or clone deletion.
    array_timeout: float = 1800.0


@dataclass(frozen=True)
class DrillRequest:
    cluster: str
    #: The backup; empty: the newest restorable backup of the cluster (`--latest`).
    backup_id: str = ""
    #: Node names; empty: one node (the one drilled longest ago), or every node with `ring`.
    nodes: tuple[str, ...] = ()
    ring: bool = False
    parallel: int = 1
    trigger: str = ""
    requested_by: str = ""


@dataclass(frozen=True)
class CloneSource:
    """One backed-up volume of a node to clone: its array, name, role, and where it stood."""

    array: str
    volume: str
    role: str
    source_mount_point: str
    #: The filesystem UUID the node reports on the backed-up volume itself (matched by WWN),
    #: which its clone holds too: the drill host refuses a device holding another. "" when the
    #: node's disk there is another volume now (a clone-mode restore's clone): not checked.
    fs_uuid: str = ""


@dataclass(frozen=True)
class NodeDrillPlan:
    name: str
    host_id: str
    purpose_id: str
    canary_key: str
    #: Cassandra's cluster name, as the node's system.local holds it.
    cluster_name: str
    address: str
    data_directories: tuple[str, ...]
    commitlog_directory: str
    num_tokens: int
    datacenter: str
    rack: str
    volumes: tuple[CloneSource, ...]
    #: The backup's snapshot on each array, narrowed to this node's volumes.
    snapshots: tuple[SnapshotRef, ...]
    #: Why this node's snapshot can prove nothing (its contents are lost: an overflowed
    #: node-local snapshot, `SnapshotLostError`); the drill reports it NOT PROVEN, cloning nothing.
    lost: str = ""


@dataclass(frozen=True)
class DrillPlan:
    drill_id: str
    backup: Backup
    drill_host: str
    nodes: tuple[NodeDrillPlan, ...]
    parallel: int
    deadline_seconds: float
    canary_keyspace: str
    changes: str = CHANGES_NOTHING
    warnings: tuple[str, ...] = ()
    refusals: tuple[str, ...] = ()
    #: Per node, the median of past drills of the cluster; None without a past drill.
    expected_seconds: float | None = None

    @property
    def refused(self) -> bool:
        return bool(self.refusals)


def choose_nodes(
    backup: Backup, request: DrillRequest, last_drilled: Mapping[str, datetime]
) -> tuple[list[str], list[str]]:
    """The node names to drill, and refusals for names the backup does not hold."""
    included = [n.name for n in backup.nodes if n.included]
    if request.nodes:
        unknown = [n for n in request.nodes if n not in included]
        return [n for n in request.nodes if n in included], [
            f"node {name} is not among the nodes backup {backup.id} holds"
            f" ({', '.join(included) or 'none'})"
            for name in unknown
        ]
    if request.ring:
        return included, []
    if not included:
        return [], []
    # One node: the one whose last drill is oldest (never drilled first), so that drills made one
    # node at a time go round the ring.
    oldest = min(included, key=lambda n: (n in last_drilled, last_drilled.get(n), n))
    return [oldest], []


async def plan_drill(  # noqa: PLR0917 - the plan needs every outside view at once
    drill_id: str,
    request: DrillRequest,
    backup: Backup,
    facts: Mapping[str, NodeFactsPort],
    arrays: Mapping[str, ArrayPort],
    drill_host: str,
    canary_keyspace: str,
    settings: DrillSettings,
    *,
    last_drilled: Mapping[str, datetime] | None = None,
    past_node_seconds: Sequence[float] = (),
    timeout: float = 60.0,
) -> DrillPlan:
    """Look at everything the drill will use; change nothing."""
    refusals: list[str] = []
    warnings: list[str] = []
    if backup.cluster != request.cluster:
        refusals.append(f"backup {backup.id} is of cluster {backup.cluster}, not {request.cluster}")
    if not backup.state.usable:
        refusals.append(f"backup {backup.id} is {backup.state.value}: there is nothing to drill")
    if backup.lost:
        refusals.append(f"backup {backup.id}: its snapshots are gone ({backup.lost_reason})")
    if backup.snapshot_kind is SnapshotKind.NATIVE:
        refusals.append(
            f"backup {backup.id} is made of Cassandra's native snapshots, which live on the"
            " production nodes: a drill needs array snapshots to clone"
        )
    if not drill_host:
        refusals.append(
            f"cluster {request.cluster} has no drill host: add a [clusters.drill] table with the"
            " drill host's agent address to the coordinator's config"
        )
    if request.parallel < 1 or request.parallel > settings.max_parallel:
        refusals.append(
            f"--parallel {request.parallel} is outside 1..{settings.max_parallel} (the cluster's"
            " drill parallelism in the coordinator's config)"
        )
    names, unknown = choose_nodes(backup, request, last_drilled or {})
    refusals += unknown
    purposes: dict[str, str] = {}
    nodes: list[NodeDrillPlan] = []
    looks = await asyncio.gather(
        *(_look(name, facts, timeout) for name in names), return_exceptions=True
    )
    for name, seen in zip(names, looks, strict=True):
        node = backup.node(name)
        if isinstance(seen, BaseException):
            refusals.append(f"node {name}: {seen}")
            continue
        problems = _node_problems(backup, node)
        purpose = purpose_id(drill_id, name)
        if purpose in purposes:
            problems.append(
                f"node {name}: its drill id {purpose} is also node {purposes[purpose]}'s"
            )
        purposes[purpose] = name
        volumes: list[CloneSource] = []
        for volume in node.volumes:
            try:
                point = match_volume(name, volume, [v for v in seen.volumes if v.mounted])
            except ValueError as exc:
                problems.append(str(exc))
                continue
            volumes.append(
                CloneSource(
                    volume.array,
                    volume.volume,
                    volume.role.value,
                    point,
                    _fs_uuid(volume, point, seen.volumes),
                )
            )
        snapshots = _snapshots(backup, node, problems)
        refusals += problems
        nodes.append(
            NodeDrillPlan(
                name=name,
                host_id=node.host_id,
                purpose_id=purpose,
                canary_key=node.canary_id,
                cluster_name=seen.cluster_name,
                address=seen.address,
                data_directories=seen.data_directories,
                commitlog_directory=seen.commitlog_directory,
                num_tokens=seen.num_tokens,
                datacenter=seen.datacenter,
                rack=seen.rack,
                volumes=tuple(volumes),
                snapshots=snapshots,
            )
        )
    array_refusals, lost = await _check_arrays(nodes, arrays, timeout)
    refusals += array_refusals
    for name, why in sorted(lost.items()):
        warnings.append(f"node {name} will be NOT PROVEN, nothing of it drilled: {why}")
    nodes = [replace(n, lost=lost[n.name]) if n.name in lost else n for n in nodes]
    if len(names) < len([n for n in backup.nodes if n.included]):
        warnings.append(
            f"only {', '.join(names) or 'no node'} of backup {backup.id} is drilled: the backup is"
            " marked proven once every node of it is proven (drill the others, or use --ring)"
        )
    expected = statistics.median(past_node_seconds) if past_node_seconds else None
    if expected is not None and nodes:
        rounds = -(-len(nodes) // max(1, request.parallel))
        expected *= rounds
    return DrillPlan(
        drill_id=drill_id,
        backup=backup,
        drill_host=drill_host,
        nodes=tuple(nodes),
        parallel=max(1, min(request.parallel, settings.max_parallel)),
        deadline_seconds=settings.deadline_seconds,
        canary_keyspace=canary_keyspace,
        warnings=tuple(warnings),
        refusals=tuple(refusals),
        expected_seconds=expected,
    )


async def _look(name: str, facts: Mapping[str, NodeFactsPort], timeout: float) -> NodeDrillFacts:
    port = facts.get(name)
    if port is None:
        raise LookupError("it is in the backup but not in the coordinator's config")
    try:
        return await asyncio.wait_for(port.drill_facts(), timeout)
    except TimeoutError:
        raise TimeoutError(f"its agent did not answer within {timeout:g} s") from None


def _node_problems(backup: Backup, node: BackupNode) -> list[str]:
    problems: list[str] = []
    if not node.host_id:
        problems.append(f"node {node.name}: backup {backup.id} recorded no host id for it")
    if not node.canary_id:
        problems.append(
            f"node {node.name}: backup {backup.id} recorded no canary for it; its presence cannot"
            " be proven"
        )
    if not node.volumes:
        problems.append(f"node {node.name}: backup {backup.id} recorded no volume of it")
    return problems


def _snapshots(backup: Backup, node: BackupNode, problems: list[str]) -> tuple[SnapshotRef, ...]:
    wanted: dict[str, set[str]] = {}
    for volume in node.volumes:
        wanted.setdefault(volume.array, set()).add(volume.volume)
    refs: list[SnapshotRef] = []
    for array, volumes in sorted(wanted.items()):
        ref = next((r for r in backup.snapshots if r.array == array), None)
        if ref is None:
            problems.append(f"backup {backup.id} holds no snapshot on array {array}")
            continue
        ref = narrowed(ref, volumes)
        absent = volumes - {m.volume.name for m in ref.members}
        if absent:
            problems.append(
                f"array {array}: snapshot {ref.snapshot_name} holds no image of"
                f" {', '.join(sorted(absent))} (node {node.name})"
            )
            continue
        refs.append(ref)
    return tuple(refs)


async def _check_arrays(
    nodes: Sequence[NodeDrillPlan], arrays: Mapping[str, ArrayPort], timeout: float
) -> tuple[list[str], dict[str, str]]:
    """(refusals, node -> why its snapshot's contents are lost). A lost snapshot refuses no
    drill: drilling it can only say NOT PROVEN, and must say it (never PROVEN, never silent)."""
    refusals: list[str] = []
    lost: dict[str, str] = {}
    seen: set[str] = set()
    for node in nodes:
        for ref in node.snapshots:
            port = arrays.get(ref.array)
            if port is None:
                if ref.array not in seen:
                    refusals.append(f"array {ref.array} is not in the coordinator's config")
                seen.add(ref.array)
                continue
            if ref.array not in seen and not port.capabilities().clone:
                refusals.append(
                    f"array {ref.array}: its driver ({port.name}) cannot clone a snapshot, so no"
                    " drill can run from it"
                )
            seen.add(ref.array)
            try:
                await asyncio.wait_for(port.get_snapshot(ref), timeout)
            except NotFoundError as exc:
                refusals.append(
                    f"array {ref.array}: snapshot {ref.snapshot_name} is missing: {exc}"
                )
            except SnapshotLostError as exc:
                lost[node.name] = "; ".join(filter(None, (lost.get(node.name), str(exc))))
            except Exception as exc:
                refusals.append(f"array {ref.array}: cannot be asked about its snapshot: {exc}")
    return refusals, lost


def _fs_uuid(volume: NodeVolume, point: str, facts: Sequence[NodeVolumeFacts]) -> str:
    """The UUID of the filesystem at `point` when its device is `volume` by WWN, else ""."""
    for fact in facts:
        if (
            fact.mount_point == point
            and fact.mounted
            and volume.wwn
            and device_ids.same_volume((fact.wwn,), (volume.wwn,))
        ):
            return fact.fs_uuid
    return ""
