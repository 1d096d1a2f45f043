"""The row counts a table restore is checked against: per node, the rows of each table over the
node's primary token ranges as the newest proven drill of the backup counted them on a clone of the
snapshot (the snapshot's data exactly: a count taken live at backup time would be of another
moment), compared with the same count on the live ring after the import."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ringsnap.coordinator.drill.model import DrillRecord, DrillVerdict

#: The prefix of a verification line that is neither a pass nor a failure.
NOT_COMPARED = "not compared:"


@dataclass(frozen=True)
class DrilledCounts:
    """One node's counts, from one drill."""

    drill_id: str
    #: "keyspace.table" → rows over the node's primary token ranges in the snapshot.
    rows: Mapping[str, int]


def newest_drilled_counts(drills: Iterable[DrillRecord]) -> dict[str, DrilledCounts]:
    """Node name → the counts of the newest drill (of `drills`, newest first) that proved that
    node and counted its tables. A node a drill did not prove has no counts worth comparing."""
    found: dict[str, DrilledCounts] = {}
    for drill in drills:
        for node in drill.nodes:
            if node.name in found or node.verdict is not DrillVerdict.PROVEN:
                continue
            if node.row_counts:
                found[node.name] = DrilledCounts(drill.id, dict(node.row_counts))
    return found


def compare_counts(  # noqa: PLR0917 - one sentence needs all of these
    node: str,
    source: str,
    target: str,
    live_rows: int,
    drilled: DrilledCounts | None,
    backup_id: str,
    cluster: str,
) -> str:
    """The verification line of one node and one table: "ok: ...", "FAILED: ..." or
    "not compared: ..." (the backup was never drilled on that node, or not since counts were kept).
    `source` is the backup's table, `target` the restored one (another with `--as`)."""
    where = f"node {node}: {target}"
    if drilled is None:
        return (
            f"{NOT_COMPARED} {where}: {live_rows} rows over the node's primary ranges; the count"
            f" could not be compared: no drill proved backup {backup_id} on node {node} and"
            f" counted its rows (`ringsnap drill {backup_id} --cluster {cluster} --nodes {node}`"
            " records one)"
        )
    expected = drilled.rows.get(source)
    if expected is None:
        return (
            f"{NOT_COMPARED} {where}: {live_rows} rows over the node's primary ranges; drill"
            f" {drilled.drill_id} of backup {backup_id} counted no table {source} on node {node}"
        )
    if expected == live_rows:
        return (
            f"ok: {where}: {live_rows} rows over the node's primary ranges at CL=ALL, equal to"
            f" the backup's (drill {drilled.drill_id})"
        )
    return (
        f"FAILED: {where}: {live_rows} rows over the node's primary ranges at CL=ALL, the"
        f" backup's {expected} (drill {drilled.drill_id}); rows written to or deleted from"
        f" {target} since the restore began, or replicas that differed at backup time, also make"
        " a difference"
    )
