"""`ringsnap restore --to TIME` as one process runs it: the base backup chosen from the catalog,
the restore planned as a whole-ring revert, each node's placement asked for (`--dry-run`: only
that), then the point-in-time workflow run and proven with the time canaries."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from ringsnap.coordinator.agents.pitr import GrpcPitr
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.gathering import failures_of
from ringsnap.coordinator.model import BackupSummary, RestoreMode, RestoreRecord
from ringsnap.coordinator.pitr.time_canary import TimeCanaries, TimeProof
from ringsnap.coordinator.restore.pitr import PointInTime, PointInTimeWorkflow, base_backup
from ringsnap.coordinator.restore.pitr_ports import NodePlacement
from ringsnap.coordinator.restore.plan import RestoreRequest
from ringsnap.coordinator.restore.s3_keys import NO_KEYS, RestoreKeys
from ringsnap.coordinator.restore.session import CatalogRestoreJournal, open_restore_session
from ringsnap.coordinator.restore.workflow import Progress, RestoreRefused
from ringsnap.coordinator.ring import open_session


@dataclass(frozen=True)
class PointInTimePlan:
    base: BackupSummary
    target_ms: int
    #: Per node: what the bucket holds from the oldest segment in its live commit-log directory
    #: on (the backup's own position is known only once its volume is back).
    placements: dict[str, NodePlacement]
    refusals: tuple[str, ...]


async def plan_point_in_time(
    config: CoordinatorConfig, cluster_name: str, target_ms: int
) -> PointInTimePlan:
    async with open_restore_session(config, cluster_name) as session:
        summaries = await asyncio.to_thread(session.catalog.backup_summaries, cluster_name)
        base = base_backup(summaries, target_ms)
        pitr = _pitr_agents(session)
        placements: dict[str, NodePlacement] = {}

        async def ask(node: str) -> None:
            placements[node] = await pitr[node].place_point_in_time("", target_ms, dry_run=True)

        failures = await failures_of(sorted(pitr), ask)
        await asyncio.gather(*(a.close() for a in pitr.values()))
        return PointInTimePlan(
            base, target_ms, placements, tuple(f"node {n}: {e}" for n, e in failures)
        )


def _pitr_agents(session: Any) -> dict[str, GrpcPitr]:
    from ringsnap.coordinator.cluster_clients import client_tls

    tls = client_tls(session.config)
    return {n.name: GrpcPitr(n.name, n.agent, tls) for n in session.cluster.nodes}


def _prover(
    config: CoordinatorConfig, cluster_name: str
) -> Callable[[str, int], Awaitable[TimeProof]]:
    cluster = next(c for c in config.clusters if c.name == cluster_name)

    async def prove(host_id: str, target_ms: int) -> TimeProof:
        def read() -> TimeProof:
            session = open_session(cluster)
            try:
                return TimeCanaries(session, cluster.canary_keyspace).prove(
                    UUID(host_id), target_ms, 1000
                )
            finally:
                session.cluster.shutdown()

        return await asyncio.to_thread(read)

    return prove


async def run_point_in_time(
    config: CoordinatorConfig,
    cluster_name: str,
    target_ms: int,
    requested_by: str,
    progress: Progress | None = None,
    *,
    from_s3: bool = False,
    keys: RestoreKeys = NO_KEYS,
) -> RestoreRecord:
    """`from_s3`: the base backup comes from its S3 copy (the array's snapshots lost), as
    `restore --from s3`, opened with `keys` when it is encrypted (refused at the plan, naming
    its recipients, without one that opens it); the commit log is placed the same way after its
    install."""
    catalog = await asyncio.to_thread(Catalog, config.coordinator.catalog)
    try:
        async with open_restore_session(config, cluster_name, catalog=catalog) as session:
            summaries = await asyncio.to_thread(catalog.backup_summaries, cluster_name)
            base = base_backup(summaries, target_ms)
            plan = await session.plan(
                RestoreRequest(
                    base.id,
                    (),
                    RestoreMode.S3 if from_s3 else RestoreMode.REVERT,
                    requested_by=requested_by,
                    keys=keys,
                )
            )
            if plan.refused:
                raise RestoreRefused("; ".join(plan.refusals))
            pitr = _pitr_agents(session)
            try:
                kwargs = {"progress": progress} if progress is not None else {}
                workflow = PointInTimeWorkflow(
                    session.agents,
                    session.arrays,
                    session.ring,
                    CatalogRestoreJournal(catalog),
                    seeds=session.cluster.seeds,
                    settings=session.settings,
                    s3_agents=session.s3_agents,
                    keys=plan.keys,
                    point=PointInTime(target_ms, pitr, _prover(config, cluster_name)),
                    **kwargs,
                )
                return await workflow.run(plan, requested_by)
            finally:
                await asyncio.gather(*(a.close() for a in pitr.values()))
    finally:
        await asyncio.to_thread(catalog.close)
