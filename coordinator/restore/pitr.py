"""A restore to a time (`ringsnap restore --to T`): the newest backup finished at or before T,
restored as a whole-ring revert, then each node's shipped commit log from the backup's position on
is placed with `restore_point_in_time` = T before the start; once the ring serves, the restore
lines leave every node's properties and each node proves T with its time canaries.

The steps are those of the array restore (`RestoreWorkflow`) with three more: `place commit log`
(after the manifest check, before the start: the nodes are stopped and their volumes are the
backup's), `finish point in time` and `time proof` (after the canary verification). Whole ring
only: replay on one node would bring it to T while its replicas stay at now.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from ringsnap.coordinator.gathering import failures_of
from ringsnap.coordinator.model import BackupSummary, NodeVerdict, RestoreNode, RestoreRecord
from ringsnap.coordinator.pitr.time_canary import TimeProof
from ringsnap.coordinator.restore.pitr_ports import NodePlacement, PitrPort
from ringsnap.coordinator.restore.plan import RestorePlan
from ringsnap.coordinator.restore.record import RestoreRun
from ringsnap.coordinator.restore.workflow import RestoreFailed, RestoreRefused, RestoreWorkflow
from ringsnap.logs import get_logger
from ringsnap.plugins.types import SnapshotRef

log = get_logger(__name__)

PLACE = "place commit log"
FINISH = "finish point in time"
PROVE = "time proof"

TimeProver = Callable[[str, int], Awaitable[TimeProof]]  # host id, target ms


def parse_time(text: str) -> int:
    """`2026-11-29T06:40:00.123Z` (UTC; the Z, `+00:00` or nothing) to epoch milliseconds."""
    value = text.strip().replace(" ", "T")
    if value.endswith("Z"):
        value = value[:-1] + "+00:00"
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise RestoreRefused(
            f"--to {text!r} is not a UTC time such as 2026-11-29T06:40:00.123Z"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    if moment.utcoffset() != UTC.utcoffset(None):
        raise RestoreRefused(f"--to {text!r}: give the time in UTC (Z or +00:00)")
    return int(moment.timestamp() * 1000)


def base_backup(summaries: Sequence[BackupSummary], target_ms: int) -> BackupSummary:
    """The newest restorable backup finished at or before the target (its snapshot holds nothing
    written after the target)."""
    fitting = [
        s
        for s in summaries
        if s.restorable
        and s.finished_at is not None
        and s.finished_at.timestamp() * 1000 <= target_ms
    ]
    if not fitting:
        raise RestoreRefused(
            "no restorable backup finished at or before the time asked: the recoverable window"
            " starts at the oldest retained backup (`ringsnap status`)"
        )
    return max(fitting, key=lambda s: s.finished_at or s.started_at)


@dataclass(frozen=True)
class PointInTime:
    target_ms: int
    pitr_agents: Mapping[str, PitrPort]
    prove: TimeProver
    canary_interval_ms: int = 1000


class PointInTimeWorkflow(RestoreWorkflow):
    """`RestoreWorkflow` for a whole-ring revert, with the commit log placed up to T."""

    def __init__(self, *args: object, point: PointInTime, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.point = point
        self.placements: dict[str, NodePlacement] = {}

    async def run(self, plan: RestorePlan, requested_by: str) -> RestoreRecord:
        if not plan.whole_ring:
            raise RestoreRefused(
                "a restore to a time restores the whole ring, not single nodes: replay would put"
                " them at that time and their replicas at now"
            )
        return await super().run(plan, requested_by)

    def _steps(
        self, run: RestoreRun, snapshots: Mapping[str, SnapshotRef], lost: Sequence[str]
    ) -> list[tuple[str, Callable[[], Awaitable[None]]]]:
        steps = super()._steps(run, snapshots, lost)
        names = [name for name, _ in steps]
        at = names.index("start")
        steps.insert(at, (PLACE, lambda: self._place(run)))
        steps += [(FINISH, lambda: self._finish(run)), (PROVE, lambda: self._prove(run))]
        return steps

    async def _place(self, run: RestoreRun) -> None:
        async def place(node: RestoreNode) -> None:
            placed = await self.point.pitr_agents[node.name].place_point_in_time(
                run.record.id, self.point.target_ms, dry_run=False
            )
            self.placements[node.name] = placed
            fetched = [s for s in placed.segments if s.fetched]
            log.warning(
                "commit log placed up to the point in time",
                node=node.name,
                base_segment=placed.base_segment,
                segments=len(placed.segments),
                fetched=len(fetched),
                bytes=placed.bytes_fetched,
                restore_point=placed.restore_point,
            )

        failures = await failures_of(list(run.record.nodes), place)
        if failures:
            raise RestoreFailed(
                "; ".join(f"node {node.name}: {PLACE}: {error}" for node, error in failures)
            )

    async def _finish(self, run: RestoreRun) -> None:
        for node in run.record.nodes:
            await self.point.pitr_agents[node.name].finish_point_in_time(run.record.id)

    async def _prove(self, run: RestoreRun) -> None:
        for node in run.record.nodes:
            proof = await self.point.prove(node.host_id, self.point.target_ms)
            verdict = node.verdict
            unproven = node.unproven
            if not proof.proven:
                verdict = NodeVerdict.NOT_PROVEN
                unproven = (*unproven, proof.line)
            await run.node_update(
                node.name,
                proof=(*node.proof, f"point in time: {proof.line}"),
                unproven=unproven,
                verdict=verdict,
            )


__all__ = ["PointInTimeWorkflow", "base_backup", "parse_time"]
