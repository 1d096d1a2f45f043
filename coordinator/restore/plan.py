"""What a restore will do, decided before anything changes: nodes, volumes, the snapshot of each
volume, what is destroyed, how long it should take, and every reason to refuse.

The plan asks every target agent and array (read-only calls), and refuses rather than starts when
something is not right: an agent or array that does not answer, a snapshot gone from its array, a
node whose Cassandra host id is not the one in the backup (a replaced node), volumes a previous
restore left released, a driver that cannot revert (or clone), and a partial restore from a backup
older than the smallest gc_grace_seconds (deleted data would come back) unless forced. A backup of
native snapshots has no volumes or arrays: each target node must still hold its own snapshot, and
it is restored in place only (no clone).
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Protocol, TypeVar

from ringsnap.coordinator.model import (
    Backup,
    NodeVolume,
    RestoreMode,
    RestoreVolume,
    SnapshotKind,
    VolumeRole,
)
from ringsnap.coordinator.ports import AgentPort, ArrayPort, NodeVolumeFacts
from ringsnap.coordinator.restore.identity import revert_identity_check
from ringsnap.coordinator.restore.s3_keys import NO_KEYS, RestoreKeys
from ringsnap.plugins.errors import NotFoundError
from ringsnap.plugins.types import SnapshotRef

_T = TypeVar("_T")

#: Which Cassandra directories a volume of each role holds.
_KINDS = {
    VolumeRole.DATA: {"data"},
    VolumeRole.COMMITLOG: {"commitlog"},
    VolumeRole.DATA_AND_COMMITLOG: {"data", "commitlog"},
}


class RingPort(Protocol):
    """The ring through CQL (see `ringsnap.coordinator.ring.CqlRing`)."""

    async def write_pre_restore_canaries(
        self, restore_id: str, host_ids: Sequence[str]
    ) -> dict[str, str]: ...

    async def canary_present(self, key: str, host_id: str) -> bool: ...

    async def min_gc_grace(self) -> tuple[int, str]: ...

    async def wait_for_ring(self, host_ids: Sequence[str], timeout: float) -> None: ...

    def reconnect(self) -> None: ...


@dataclass(frozen=True)
class RestoreRequest:
    backup_id: str
    #: Node names; empty for every node of the backup.
    nodes: tuple[str, ...] = ()
    mode: RestoreMode = RestoreMode.REVERT
    #: Restore a node alone even from a backup older than gc_grace_seconds.
    force: bool = False
    requested_by: str = ""
    #: The secret keys of an encrypted copy (`--from s3 --key-file`): in memory only, never
    #: shown, recorded or journaled.
    keys: RestoreKeys = field(default=NO_KEYS, repr=False, compare=False)


@dataclass(frozen=True)
class NodePlan:
    name: str
    agent: AgentPort
    host_id: str
    seed: bool
    #: Cassandra answered at plan time: a pre-restore canary can be written and a drain made.
    running: bool
    volumes: tuple[RestoreVolume, ...]


@dataclass(frozen=True)
class ArrayPlan:
    array: str
    #: The backup's snapshot, narrowed to the target nodes' volumes.
    ref: SnapshotRef
    #: What reverting destroys besides the volumes' current contents (ONTAP: newer snapshots).
    destroys: tuple[str, ...] = ()


@dataclass(frozen=True)
class RestorePlan:
    restore_id: str
    backup: Backup
    mode: RestoreMode
    whole_ring: bool
    nodes: tuple[NodePlan, ...]
    arrays: tuple[ArrayPlan, ...]
    #: Backups whose snapshots this revert deletes on the array (marked lost when it does).
    lost_backups: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    refusals: tuple[str, ...] = ()
    expected_seconds: float | None = None
    destroyed: tuple[str, ...] = field(default=())
    #: The request's keys, for the run of this plan (never in its document).
    keys: RestoreKeys = field(default=NO_KEYS, repr=False, compare=False)

    @property
    def refused(self) -> bool:
        return bool(self.refusals)


async def _ask(what: str, awaitable: Awaitable[_T], timeout: float) -> _T:
    try:
        return await asyncio.wait_for(awaitable, timeout)
    except TimeoutError:
        raise TimeoutError(f"{what}: no answer within {timeout:g} s") from None


def match_volume(node: str, volume: NodeVolume, facts: Sequence[NodeVolumeFacts]) -> str:
    """The mount point of `volume` on the node; raises ValueError saying why it is unclear."""
    wanted = _KINDS[volume.role]
    candidates = [f for f in facts if wanted <= set(f.kinds)]
    if volume.wwn:
        by_wwn = [f for f in candidates if f.wwn and f.wwn.lower() == volume.wwn.lower()]
        if by_wwn:
            candidates = by_wwn
    if len(candidates) == 1:
        return candidates[0].mount_point
    if not candidates:
        raise ValueError(
            f"node {node}: no filesystem of the agent holds the {volume.role.value} directories"
            f" that volume {volume.volume} held; check the agent's [cassandra] directories"
        )
    raise ValueError(
        f"node {node}: volume {volume.volume} ({volume.role.value}) could be any of"
        f" {', '.join(sorted(f.mount_point for f in candidates))}; give the volumes WWNs the agent"
        " can see, or one filesystem per role"
    )


def lost_by_revert(backup: Backup, ref: SnapshotRef, others: Sequence[Backup]) -> list[str]:
    """Backups newer than `backup` with a snapshot of a volume of `ref` on its array: an array
    whose revert deletes newer snapshots (ONTAP restore_to) destroys them."""
    volumes = {m.volume.name for m in ref.members}
    return [
        other.id
        for other in others
        if other.started_at > backup.started_at
        and any(
            r.array == ref.array and {m.volume.name for m in r.members} & volumes
            for r in other.snapshots
        )
    ]


def narrowed(ref: SnapshotRef, volumes: set[str]) -> SnapshotRef:
    """`ref` with only the members for `volumes` (a node restored alone reverts only its own)."""
    return replace(ref, members=tuple(m for m in ref.members if m.volume.name in volumes))


async def plan_restore(  # noqa: PLR0917 - the plan needs every outside view at once
    restore_id: str,
    request: RestoreRequest,
    backup: Backup,
    agents: Mapping[str, AgentPort],
    seeds: Sequence[str],
    arrays: Mapping[str, ArrayPort],
    ring: RingPort,
    *,
    newer_backups: Sequence[Backup] = (),
    past_seconds: Sequence[float] = (),
    timeout: float = 60.0,
    now: datetime | None = None,
) -> RestorePlan:
    """Look at everything the restore will touch; change nothing."""
    refusals: list[str] = []
    warnings: list[str] = []
    if not backup.state.usable:
        refusals.append(f"backup {backup.id} is {backup.state.value}: it cannot be restored")
    from_s3 = request.mode is RestoreMode.S3
    if getattr(backup, "lost_reason", "") and not from_s3:
        refusals.append(f"backup {backup.id}: its snapshots are gone ({backup.lost_reason})")
    native = backup.snapshot_kind is SnapshotKind.NATIVE
    if native and request.mode is RestoreMode.CLONE:
        refusals.append(
            f"backup {backup.id} is made of Cassandra's native snapshots, which are restored in"
            " place on each node: --mode clone needs array snapshots to clone volumes from; use"
            " --mode revert"
        )
    included = [n for n in backup.nodes if n.included]
    names = list(request.nodes) or [n.name for n in included]
    unknown = [n for n in names if n not in {b.name for b in included}]
    for name in unknown:
        refusals.append(
            f"node {name} is not in backup {backup.id} (nodes: "
            f"{', '.join(n.name for n in included)})"
        )
    targets = [n for n in included if n.name in names]
    missing_agents = [n.name for n in targets if n.name not in agents]
    for name in missing_agents:
        refusals.append(f"node {name} is in the backup but not in the coordinator's config")
    targets = [n for n in targets if n.name in agents]
    whole_ring = set(agents) <= {n.name for n in targets}

    async def look(name: str) -> tuple[bool, str, Sequence[NodeVolumeFacts], str]:
        agent = agents[name]
        state = await _ask(f"node {name}: agent", agent.volume_state(), timeout)
        host_id = ""
        if state.cassandra_running:
            facts = await _ask(f"node {name}: Cassandra", agent.node_info(), timeout)
            host_id = facts.host_id
        return state.cassandra_running, host_id, state.volumes, state.detail

    looks = await asyncio.gather(*(look(n.name) for n in targets), return_exceptions=True)
    mounted: dict[str, list[NodeVolumeFacts]] = {}
    nodes: list[NodePlan] = []
    for node, seen in zip(targets, looks, strict=True):
        if isinstance(seen, BaseException):
            refusals.append(f"node {node.name}: the agent cannot be reached: {seen}")
            continue
        running, host_id, facts, detail = seen
        mounted[node.name] = [f for f in facts if f.mounted]
        released = sorted({f.released_by for f in facts if f.released_by})
        if released:
            refusals.append(
                f"node {node.name}: volumes are still released by restore {', '.join(released)};"
                f" finish it first: ringsnap restore --resume {released[0]}"
            )
        if running and host_id != node.host_id:
            refusals.append(
                f"node {node.name}: Cassandra's host id is {host_id}, the backup's is"
                f" {node.host_id}: the node was replaced; restoring would bring the old node back"
                " beside the new one"
            )
        elif not running:
            warnings.append(
                f"node {node.name}: Cassandra is not running ({detail or 'no answer'}); its host id"
                " cannot be checked and no pre-restore canary can be written for it"
            )
        volumes: list[RestoreVolume] = []
        # From S3, the node's files come back into its data directories, whatever its volumes.
        for volume in () if from_s3 else node.volumes:
            try:
                point = match_volume(node.name, volume, [f for f in facts if f.mounted])
            except ValueError as exc:
                refusals.append(str(exc))
                continue
            volumes.append(
                RestoreVolume(
                    array=volume.array, volume=volume.volume, role=volume.role, mount_point=point
                )
            )
        nodes.append(
            NodePlan(
                node.name,
                agents[node.name],
                node.host_id,
                node.name in seeds,
                running,
                tuple(volumes),
            )
        )
    if nodes and not any(n.seed for n in nodes):
        # No seed among the targets: the first target starts alone, then the others.
        nodes[0] = replace(nodes[0], seed=True)
    if native and not from_s3:
        refusals += await _native_snapshots_missing(backup.id, nodes, timeout)

    if request.mode is RestoreMode.REVERT and not native and not from_s3:
        refused, noted = await revert_identity_check(backup.id, targets, mounted, arrays, timeout)
        refusals += refused
        warnings += noted

    array_plans: list[ArrayPlan] = []
    lost: list[str] = []
    if not from_s3:  # the array is never asked: it may be gone
        array_plans, lost = await _plan_arrays(
            backup, request.mode, nodes, arrays, newer_backups, refusals, timeout
        )
    for array_plan in array_plans:
        # Node-local snapshots (an agent's own LVM): the plan says where they are and that they
        # die with that node's disks.
        survives = arrays[array_plan.array].capabilities().extra.get("survives")
        if survives:
            warnings.append(f"array {array_plan.array}: {survives}")
    destroyed = [
        "every write made since the backup on "
        + ("the whole ring" if whole_ring else ", ".join(n.name for n in nodes))
    ]
    for array_plan in array_plans:
        destroyed.extend(f"array {array_plan.array}: {line}" for line in array_plan.destroys)
    if request.mode is RestoreMode.CLONE:
        destroyed = ["nothing: the original volumes are kept untouched beside the clones"]
    elif native or from_s3:
        destroyed[0] += (
            # No id in it: the daemon plans again under the id of the plan shown, and compares.
            " (each table's files are kept aside in <table dir>/.ringsnap-replaced/<restore id>/"
            " on its node, never deleted)"
        )

    if not whole_ring:
        await _check_gc_grace(backup, request.force, ring, refusals, warnings, now, timeout)
        warnings.append(
            "a node restored alone is behind its replicas: run `nodetool repair -full` on"
            f" {', '.join(n.name for n in nodes)} once it is up; with incremental repair, mark its"
            " restored SSTables unrepaired first (sstablerepairedset --really-set --is-unrepaired)"
        )
    expected = statistics.median(past_seconds) if past_seconds else None
    return RestorePlan(
        restore_id=restore_id,
        backup=backup,
        mode=request.mode,
        whole_ring=whole_ring,
        nodes=tuple(nodes),
        arrays=tuple(array_plans),
        lost_backups=tuple(lost),
        warnings=tuple(warnings),
        refusals=tuple(refusals),
        expected_seconds=expected,
        destroyed=tuple(destroyed),
    )


async def _native_snapshots_missing(
    tag: str, nodes: Sequence[NodePlan], timeout: float
) -> list[str]:
    """A native backup comes back from each node's own snapshot: one refusal per node where it
    cannot be found (its manifest lists no SSTable, or the agent cannot list it)."""

    async def count(node: NodePlan) -> int:
        return len(await _ask(f"node {node.name}: agent", node.agent.manifest(tag), timeout))

    counts = await asyncio.gather(*(count(n) for n in nodes), return_exceptions=True)
    refusals: list[str] = []
    for node, found in zip(nodes, counts, strict=True):
        if isinstance(found, BaseException):
            refusals.append(
                f"node {node.name}: its native snapshot {tag} cannot be listed: {found}"
            )
        elif not found:
            refusals.append(
                f"node {node.name} holds no native snapshot {tag} (cleared, or the node's data"
                " directories are not the ones backed up): it cannot be restored from this backup"
            )
    return refusals


async def _plan_arrays(  # noqa: PLR0917
    backup: Backup,
    mode: RestoreMode,
    nodes: Sequence[NodePlan],
    arrays: Mapping[str, ArrayPort],
    newer_backups: Sequence[Backup],
    refusals: list[str],
    timeout: float,
) -> tuple[list[ArrayPlan], list[str]]:
    wanted: dict[str, set[str]] = {}
    for node in nodes:
        for volume in node.volumes:
            wanted.setdefault(volume.array, set()).add(volume.volume)
    plans: list[ArrayPlan] = []
    lost: list[str] = []
    for name, volumes in sorted(wanted.items()):
        array = arrays.get(name)
        ref = next((r for r in backup.snapshots if r.array == name), None)
        if array is None:
            refusals.append(f"array {name} is not in the coordinator's config")
            continue
        if ref is None:
            refusals.append(f"backup {backup.id} holds no snapshot on array {name}")
            continue
        ref = narrowed(ref, volumes)
        absent = volumes - {m.volume.name for m in ref.members}
        if absent:
            refusals.append(
                f"array {name}: snapshot {ref.snapshot_name} holds no image of {', '.join(sorted(absent))}"
            )
            continue
        capabilities = array.capabilities()
        able = capabilities.revert if mode is RestoreMode.REVERT else capabilities.clone
        if not able:
            refusals.append(f"array {name}: its driver cannot {mode.value}; try the other --mode")
            continue
        try:
            await _ask(f"array {name}", array.get_snapshot(ref), timeout)
            destroys: Sequence[str] = ()
            if mode is RestoreMode.REVERT:
                destroys = await _ask(f"array {name}", array.revert_plan(ref), timeout)
        except NotFoundError as exc:
            refusals.append(f"array {name}: snapshot {ref.snapshot_name} is missing: {exc}")
            continue
        except Exception as exc:
            refusals.append(f"array {name} cannot be reached or refused the check: {exc}")
            continue
        if mode is RestoreMode.REVERT and capabilities.revert_deletes_newer:
            lost.extend(lost_by_revert(backup, ref, newer_backups))
        plans.append(ArrayPlan(name, ref, tuple(destroys)))
    return plans, lost


async def _check_gc_grace(  # noqa: PLR0917
    backup: Backup,
    force: bool,
    ring: RingPort,
    refusals: list[str],
    warnings: list[str],
    now: datetime | None,
    timeout: float,
) -> None:
    age = ((now or datetime.now(UTC)) - backup.started_at).total_seconds()
    try:
        grace, table = await _ask("CQL", ring.min_gc_grace(), timeout)
    except Exception as exc:
        message = (
            f"gc_grace_seconds could not be read ({exc}): a node restored alone from a backup"
            " older than it can bring deleted data back"
        )
        (warnings if force else refusals).append(
            message + ("; going on because of --force" if force else "; pass --force to go on")
        )
        return
    if table and age > grace:
        message = (
            f"backup {backup.id} is {age / 86400:.1f} days old, older than gc_grace_seconds of"
            f" {table} ({grace} s): tombstones newer than the backup may already be purged on the"
            " other replicas, so a node restored alone would bring deleted data back"
        )
        if force:
            warnings.append(message + "; going on because of --force")
        else:
            refusals.append(message + "; restore the whole ring, or pass --force")
