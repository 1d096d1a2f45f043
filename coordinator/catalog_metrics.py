"""The coordinator's metrics that come from its configuration and its catalog rather than from a
run it watched: the limits the alerts compare with, the newest proven backup, the newest restore
and drill, the backups whose S3 copy is overdue. Restores and drills also run in the operator's CLI
process, so the catalog is the one place that knows them all."""

from __future__ import annotations

from datetime import datetime, timedelta

from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.headline import longest_interval_seconds, missing_s3_copies, newest_proven
from ringsnap.coordinator.metrics import CoordinatorMetrics

#: A cluster whose schedules name no policy is held to this (the policies' own default).
DEFAULT_PROVEN_MAX_AGE = timedelta(hours=24)


def proven_max_age(config: CoordinatorConfig, cluster: str) -> timedelta:
    """The smallest `proven_max_age_hours` of the policies the cluster's schedules back up under."""
    hours = [
        config.retention[s.policy].proven_max_age_hours
        for s in config.schedules
        if s.cluster == cluster and s.policy in config.retention
    ]
    return timedelta(hours=min(hours)) if hours else DEFAULT_PROVEN_MAX_AGE


def export_deadlines(config: CoordinatorConfig) -> dict[str, timedelta]:
    """Policy → how long its exports may take, for the policies that export."""
    return {
        name: timedelta(hours=policy.export_deadline_hours)
        for name, policy in config.retention.items()
        if policy.export
    }


def configure(metrics: CoordinatorMetrics, config: CoordinatorConfig, now: datetime) -> None:
    """Series of the configured limits, set once at start."""
    for cluster in config.clusters:
        metrics.add_cluster(cluster.name, freeze_budget=config.freeze_budget_seconds(cluster.name))
        metrics.set_proven_max_age(
            cluster.name, proven_max_age(config, cluster.name).total_seconds()
        )
    for schedule in config.schedules:
        metrics.set_schedule(
            schedule.cluster, schedule.name, longest_interval_seconds(schedule.schedule(), now)
        )


def refresh(
    metrics: CoordinatorMetrics, catalog: Catalog, config: CoordinatorConfig, now: datetime
) -> None:
    """Everything the catalog tells the metrics; cheap enough to run after every run."""
    metrics.record_restores(catalog.list_restores(limit=200))
    deadlines = export_deadlines(config)
    for cluster in config.clusters:
        summaries = catalog.backup_summaries(cluster.name)
        proven = newest_proven(summaries)
        if proven is not None:
            metrics.set_last_proven(cluster.name, proven.started_at)
        drill = next(
            (d for d in catalog.list_drills(cluster.name, limit=5) if d.seconds is not None), None
        )
        if drill is not None:
            metrics.record_drill(drill)
        if deadlines:
            candidates = [s for s in summaries if s.policy in deadlines]
            exported = catalog.exported_backups([s.id for s in candidates])
            late = missing_s3_copies(candidates, exported, deadlines, now)
            metrics.set_missing_copies(cluster.name, len(late))
