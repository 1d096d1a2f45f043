"""The plan of a backup, from what the agents and arrays answered: who is in, which volumes of which
array, or why the backup cannot start. A pure function: the workflow asks, this decides."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from ringsnap.coordinator.backup.followed import Choice, follow
from ringsnap.coordinator.backup.model import BackupRefused, NodeOutcome, NodeTarget
from ringsnap.coordinator.model import NodeVolume
from ringsnap.coordinator.ports import NodeFacts
from ringsnap.coordinator.volume_identity import ExpectedVolume, is_on, mismatches
from ringsnap.plugins.types import Volume


@dataclass(frozen=True)
class Listing:
    """What one array answered: its volumes, and how a host sees each (by volume name; None
    when its driver's volumes are no SAN LUNs, e.g. LVM: then nothing is compared)."""

    volumes: Sequence[Volume]
    host_ids: Mapping[str, tuple[str, ...]] | None = None


@dataclass(frozen=True)
class Plan:
    #: Every node, in the configured order: included, or excluded with the reason.
    nodes: dict[str, NodeOutcome]
    #: The volumes of the included nodes, per array, in node order.
    volumes: dict[str, list[Volume]]
    #: What the operator should know: volumes followed to where a restore attached them.
    warnings: tuple[str, ...] = ()


def arrays_of(nodes: Sequence[NodeTarget], configured: Collection[str]) -> list[str]:
    """The arrays the nodes' volumes are on, sorted; refused when one is not configured."""
    wanted = {v.array for n in nodes for v in n.volumes}
    unknown = wanted - set(configured)
    if unknown:
        raise BackupRefused(f"nodes use arrays that are not configured: {sorted(unknown)}")
    return sorted(wanted)


def plan_backup(
    nodes: Sequence[NodeTarget],
    facts: Sequence[NodeFacts | BaseException],
    listings: Mapping[str, Listing | Sequence[Volume] | BaseException],
    *,
    allow_partial: bool,
) -> Plan:
    """`facts`: each node's answer (in `nodes` order); `listings`: each array's volumes (a bare
    sequence: no host ids, as from a driver that identifies none).

    An unreachable array takes every node on it, so it refuses the backup; an unreachable node
    is excluded, which refuses it unless `allow_partial`. A node whose configured volumes are not
    the disks its agent reports under its directories refuses it (`volume_identity`). A configured
    volume a restore replaced on the node is followed to the one attached since
    (`ringsnap.coordinator.backup.followed`), unless the disk is the configured one after all.
    """
    by_array: dict[str, dict[str, Volume]] = {}
    host_ids: dict[str, Mapping[str, tuple[str, ...]] | None] = {}
    problems: list[str] = []
    for array, answer in listings.items():
        if isinstance(answer, BaseException):
            problems.append(f"array {array} unreachable: {answer}")
            continue
        listing = answer if isinstance(answer, Listing) else Listing(answer)
        by_array[array] = {v.name: v for v in listing.volumes}
        host_ids[array] = listing.host_ids
    if problems:  # an unreachable array takes every node on it: never partial
        raise BackupRefused("; ".join(problems) + "; fix the array or its credentials and retry")

    outcomes: dict[str, NodeOutcome] = {}
    unreachable: list[str] = []
    identity_problems: list[str] = []
    warnings: list[str] = []
    for node, info in zip(nodes, facts, strict=True):
        if isinstance(info, BaseException):
            reason = f"agent unreachable: {info}"
            unreachable.append(f"node {node.name}: {reason}")
            outcomes[node.name] = NodeOutcome(node.name, excluded_reason=reason)
            continue
        volumes = []
        notes: list[str] = []
        for target in node.volumes:
            choice = _choose(node, target, info, host_ids.get(target.array))
            volume = by_array[target.array].get(choice.volume)
            if volume is None:
                raise BackupRefused(
                    f"node {node.name}: volume {choice.volume!r} not found on array"
                    f" {target.array}; check the node's volumes in the coordinator config"
                )
            volumes.append(volume)
            warnings += [choice.warning] if choice.warning else []
            notes += [choice.note] if choice.note else []
        outcomes[node.name] = NodeOutcome(
            node.name,
            info.host_id,
            tuple(
                _with_host_id(v, host_ids.get(t.array))
                for v, t in zip(volumes, node.volumes, strict=True)
            ),
        )
        identity_problems += _identity_problems(node, info, volumes, host_ids, notes)
    check_one_ring(
        {n.name: f for n, f in zip(nodes, facts, strict=True) if isinstance(f, NodeFacts)}
    )
    if identity_problems:
        raise BackupRefused(
            "the configured volumes are not the disks under Cassandra (nothing was flushed or"
            " frozen): " + "; ".join(identity_problems)
        )
    if unreachable and not allow_partial:
        raise BackupRefused(
            "; ".join(unreachable)
            + "; bring the agents back, or allow a partial backup: allow_partial = true in this"
            " cluster's [[clusters]] table of the coordinator's configuration"
        )
    if not any(not outcome.excluded_reason for outcome in outcomes.values()):
        raise BackupRefused("no node of the cluster is reachable")
    per_array: dict[str, list[Volume]] = {}
    for node in nodes:
        if outcomes[node.name].excluded_reason:
            continue
        for target, volume in zip(node.volumes, outcomes[node.name].volumes, strict=True):
            per_array.setdefault(target.array, []).append(volume)
    return Plan(outcomes, per_array, tuple(warnings))


def _choose(
    node: NodeTarget,
    target: NodeVolume,
    info: NodeFacts,
    host_ids: Mapping[str, tuple[str, ...]] | None,
) -> Choice:
    """The volume to snapshot for `target`: the catalog's when it followed it, unless the array
    tells that the disk under the role's directories is the configured volume (moved back by
    hand): the disk decides, so a stale catalog never holds a correct config hostage."""
    choice = follow(node.name, target, node.followed)
    if choice.volume == target.volume or host_ids is None:
        return choice
    configured = ExpectedVolume(
        target.array, target.volume, target.role, host_ids.get(target.volume, ())
    )
    if any(is_on(f, configured) for f in info.filesystems):
        return Choice(target.volume)
    return choice


def check_one_ring(facts: Mapping[str, NodeFacts]) -> None:
    """Refuse a plan whose agents answer for more than one Cassandra cluster, or for one node
    twice: a mistyped agent address would otherwise freeze, and snapshot into this backup, a
    node of another cluster, or leave a node of this one out."""
    names: dict[str, list[str]] = {}
    hosts: dict[str, list[str]] = {}
    for node, info in sorted(facts.items()):
        names.setdefault(info.cluster_name, []).append(node)
        hosts.setdefault(info.host_id, []).append(node)
    if len(names) > 1:
        said = "; ".join(f"{', '.join(nodes)} in {name!r}" for name, nodes in sorted(names.items()))
        raise BackupRefused(
            f"the agents answer for more than one Cassandra cluster ({said}); check each node's"
            " agent address in the coordinator config"
        )
    twice = [nodes for nodes in hosts.values() if len(nodes) > 1]
    if twice:
        raise BackupRefused(
            "; ".join(f"nodes {', '.join(nodes)} reach the same Cassandra node" for nodes in twice)
            + " (same host id); check each node's agent address in the coordinator config"
        )


def _with_host_id(volume: Volume, host_ids: Mapping[str, tuple[str, ...]] | None) -> Volume:
    """`volume` with the id a host sees it by as its `wwn` where the listing gave none (ONTAP):
    the catalog records it, and a restore compares it with the device it will revert."""
    ids = [i for i in (host_ids or {}).get(volume.name, ()) if i]
    return replace(volume, wwn=ids[0]) if ids and not volume.wwn else volume


def _identity_problems(
    node: NodeTarget,
    info: NodeFacts,
    volumes: Sequence[Volume],
    host_ids: Mapping[str, Mapping[str, tuple[str, ...]] | None],
    notes: Sequence[str] = (),
) -> list[str]:
    """Per directory of `node`, why its configured volumes are not the disks its agent reports
    (see `ringsnap.coordinator.volume_identity`); nothing for volumes of a driver that
    identifies none (LVM)."""
    expected = [
        ExpectedVolume(target.array, volume.name, target.role, ids.get(volume.name, ()))
        for target, volume in zip(node.volumes, volumes, strict=True)
        if (ids := host_ids.get(target.array)) is not None
    ]
    if not expected:
        return []
    known = {
        (array, name): ids
        for array, by_name in host_ids.items()
        for name, ids in (by_name or {}).items()
    }
    fix = (
        f"edit node {node.name}'s volumes in the coordinator's config ([[clusters.nodes]]"
        f' name = "{node.name}", volumes = [{{ array, volume, role }}]) so that each role'
        " names the volume its directory is on"
        + "".join(f" ({note})" for note in notes)
    )
    return mismatches(node.name, info.filesystems, expected, known=known, fix=fix)
