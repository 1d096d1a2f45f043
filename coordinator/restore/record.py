"""A restore's record: made from a confirmed plan, saved after every change of every node (so a
coordinator killed at any point leaves a record `--resume` continues from), and the operator's
next step for a node at the step it stopped at."""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Protocol

from ringsnap.coordinator.model import (
    RestoreMode,
    RestoreNode,
    RestoreRecord,
    RestoreStep,
    Verification,
)
from ringsnap.coordinator.ports import SSTable
from ringsnap.coordinator.restore.plan import RestorePlan
from ringsnap.coordinator.restore.s3 import s3_next_step
from ringsnap.coordinator.saved_record import SavedRecord


class RestoreJournal(Protocol):
    """Where the restore keeps its record (the catalog, through `CatalogRestoreJournal`)."""

    async def save(self, record: RestoreRecord) -> None: ...

    async def manifest(self, backup_id: str, node: str) -> Iterable[SSTable]: ...

    async def mark_verified(
        self, backup_id: str, result: Verification, detail: str, by: str
    ) -> None: ...

    async def mark_snapshots_lost(self, backup_ids: Sequence[str], reason: str) -> None: ...


def new_restore_id(now: datetime | None = None) -> str:
    now = now or datetime.now(UTC)
    return f"rr-{now:%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def record_for(plan: RestorePlan, requested_by: str) -> RestoreRecord:
    """The record of a restore about to start: every node planned, nothing done."""
    return RestoreRecord(
        id=plan.restore_id,
        cluster=plan.backup.cluster,
        backup_id=plan.backup.id,
        mode=plan.mode,
        whole_ring=plan.whole_ring,
        requested_by=requested_by,
        started_at=datetime.now(UTC),
        warnings=plan.warnings,
        nodes=tuple(
            RestoreNode(
                name=node.name,
                host_id=node.host_id,
                volumes=node.volumes,
                was_running=node.running,
                backup_canary=plan.backup.node(node.name).canary_id,
            )
            for node in plan.nodes
        ),
    )


def next_step_for(record: RestoreRecord, node: RestoreNode, *, native: bool = False) -> str:
    """What the operator does for `node` when the restore stops at its current step (`native`: a
    restore from the nodes' native snapshots)."""
    resume = f"`ringsnap restore --resume {record.id}`"
    points = ", ".join(v.mount_point for v in node.volumes)
    step = node.step
    if record.mode is RestoreMode.S3:
        return s3_next_step(record, step, resume)
    if step is RestoreStep.PLANNED:
        return "nothing was changed on this node"
    if step is RestoreStep.CANARY:
        return (
            "its pre-restore canary is written and nothing else was changed, unless the stop was"
            " sent and its answer lost: then Cassandra is STOPPED (check it on the node);"
            f" {resume} to go on"
        )
    if native:
        return _native_next_step(record, step, resume)
    if step is RestoreStep.STOPPED:
        return (
            f"Cassandra is STOPPED, its volumes are still mounted and unchanged: {resume} to go on,"
            " or start Cassandra on the node to give the restore up"
        )
    if step is RestoreStep.RELEASED:
        return (
            f"Cassandra is STOPPED and its volumes are UNMOUNTED ({points}), not yet restored:"
            f" {resume} to go on"
        )
    if step is RestoreStep.RESTORED:
        return (
            f"its volumes are restored on the array but UNMOUNTED ({points}) and Cassandra is"
            f" STOPPED: {resume} to mount, start and verify"
        )
    if step in (RestoreStep.ATTACHED, RestoreStep.CLEARED, RestoreStep.CHECKED):
        return f"its restored volumes are mounted but Cassandra is STOPPED: {resume} to start and verify"
    if step is RestoreStep.STARTED:
        return f"Cassandra runs on the restored data but is not verified yet: {resume} to verify"
    return ""


def _native_next_step(record: RestoreRecord, step: RestoreStep, resume: str) -> str:
    kept = f"the files they replaced are kept in each table's .ringsnap-replaced/{record.id}/"
    if step is RestoreStep.STOPPED:
        return (
            f"Cassandra is STOPPED; putting its tables back to the snapshot may have begun ({kept}"
            f" as they move): {resume} to go on. Do not start Cassandra by hand"
        )
    if step is RestoreStep.RESTORED:
        return (
            f"its tables are back to the snapshot ({kept}) and Cassandra is STOPPED; its commit log"
            f" still holds newer writes, so do not start it by hand: {resume} to discard the replay"
            " state, start and verify"
        )
    if step in (RestoreStep.CLEARED, RestoreStep.CHECKED):
        return (
            f"its tables are back to the snapshot and Cassandra is STOPPED: {resume} to start and"
            " verify"
        )
    if step is RestoreStep.STARTED:
        return f"Cassandra runs on the restored data but is not verified yet: {resume} to verify"
    return ""


class RestoreRun(SavedRecord[RestoreRecord]):
    """One restore's record, saved after every change; `native`: from the nodes' native snapshots."""

    def __init__(self, record: RestoreRecord, journal: RestoreJournal, *, native: bool) -> None:
        super().__init__(record, journal.save)
        self.native = native

    async def node_update(self, name: str, **changes: object) -> None:
        await self.change_node(name, lambda n: replace(n, **changes))

    async def step_done(self, name: str, step: RestoreStep, seconds: float) -> None:
        node = self.record.node(name)
        timings = (*node.step_seconds, (step.value, round(seconds, 3)))
        await self.node_update(name, step=step, step_seconds=timings)

    def pending(self, step: RestoreStep) -> list[RestoreNode]:
        """Nodes that have not finished `step` yet."""
        return [n for n in self.record.nodes if n.step.order < step.order]
