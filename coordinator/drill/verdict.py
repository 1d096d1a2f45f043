"""A drill's verdict: the drill's state from its nodes' verdicts and the run's errors, and what it
says about the backup (failed as soon as a check failed on a node; proven once drills proved every
node it holds)."""

from __future__ import annotations

from ringsnap.coordinator.drill.model import DrillRecord, DrillState, DrillVerdict
from ringsnap.coordinator.drill.ports import DrillJournal
from ringsnap.coordinator.model import Verification


def drill_outcome(
    record: DrillRecord, errors: list[str]
) -> tuple[DrillState, str, tuple[str, ...]]:
    """The drill's final state, its error (the run's errors, then every node's problems) and its
    warnings (an incomplete teardown added)."""
    nodes = record.nodes
    if errors or any(n.verdict is DrillVerdict.FAILED for n in nodes):
        state = DrillState.FAILED
    elif any(n.verdict is not DrillVerdict.PROVEN for n in nodes):
        state = DrillState.NOT_PROVEN
    else:
        state = DrillState.PROVEN
    problems = [f"node {n.name}: {p}" for n in nodes for p in n.problems]
    left = [f"node {n.name}: {t}" for n in nodes for t in n.teardown]
    error = "; ".join([*errors, *problems])
    warnings = record.warnings
    if left:
        warnings = (
            *warnings,
            "teardown incomplete (clones not deleted stay pending cleanups, retried by the"
            " coordinator): " + "; ".join(left),
        )
    return state, error, warnings


async def mark_backup(journal: DrillJournal, record: DrillRecord) -> None:
    """Mark the drilled backup: failed when a node was not proven; proven when, with this drill,
    drills proved every node the backup holds; else leave it as it is."""
    not_proven = [n for n in record.nodes if n.verdict is DrillVerdict.NOT_PROVEN]
    if not_proven:
        detail = f"drill {record.id}: not proven on " + "; ".join(
            f"{n.name} ({'; '.join(n.problems)})" for n in not_proven
        )
        await journal.mark_verified(record.backup_id, Verification.FAILED, detail, record.id)
        return
    if not any(n.verdict is DrillVerdict.PROVEN for n in record.nodes):
        return
    proven = await journal.proven_nodes(record.backup_id)
    wanted = await journal.backup_nodes(record.backup_id)
    missing = [n for n in wanted if n not in proven]
    if missing:
        return
    by = sorted({proven[n] for n in wanted})
    detail = (
        f"drill {record.id}: every node proven"
        if by == [record.id]
        else f"drills {', '.join(by)}: every node proven"
    )
    await journal.mark_verified(record.backup_id, Verification.PROVEN, detail, record.id)
