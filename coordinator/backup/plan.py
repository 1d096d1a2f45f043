"""The plan of a backup, from what the agents and arrays answered: who is in, which volumes of which
array, or why the backup cannot start. A pure function: the workflow asks, this decides."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from ringsnap.coordinator.backup.model import BackupRefused, NodeOutcome, NodeTarget
from ringsnap.coordinator.ports import NodeFacts
from ringsnap.plugins.types import Volume


@dataclass(frozen=True)
class Plan:
    #: Every node, in the configured order: included, or excluded with the reason.
    nodes: dict[str, NodeOutcome]
    #: The volumes of the included nodes, per array, in node order.
    volumes: dict[str, list[Volume]]


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
    listings: Mapping[str, Sequence[Volume] | BaseException],
    *,
    allow_partial: bool,
) -> Plan:
    """`facts`: each node's answer (in `nodes` order); `listings`: each array's volumes.

    An unreachable array takes every node on it, so it refuses the backup; an unreachable node
    is excluded, which refuses it unless `allow_partial`.
    """
    by_array: dict[str, dict[str, Volume]] = {}
    problems: list[str] = []
    for array, listing in listings.items():
        if isinstance(listing, BaseException):
            problems.append(f"array {array} unreachable: {listing}")
        else:
            by_array[array] = {v.name: v for v in listing}
    if problems:  # an unreachable array takes every node on it: never partial
        raise BackupRefused("; ".join(problems) + "; fix the array or its credentials and retry")

    outcomes: dict[str, NodeOutcome] = {}
    unreachable: list[str] = []
    for node, info in zip(nodes, facts, strict=True):
        if isinstance(info, BaseException):
            reason = f"agent unreachable: {info}"
            unreachable.append(f"node {node.name}: {reason}")
            outcomes[node.name] = NodeOutcome(node.name, excluded_reason=reason)
            continue
        volumes = []
        for target in node.volumes:
            volume = by_array[target.array].get(target.volume)
            if volume is None:
                raise BackupRefused(
                    f"node {node.name}: volume {target.volume!r} not found on array"
                    f" {target.array}; check the node's volumes in the coordinator config"
                )
            volumes.append(volume)
        outcomes[node.name] = NodeOutcome(node.name, info.host_id, tuple(volumes))
    check_one_ring(
        {n.name: f for n, f in zip(nodes, facts, strict=True) if isinstance(f, NodeFacts)}
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
    return Plan(outcomes, per_array)


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
