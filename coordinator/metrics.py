"""Prometheus metrics of the coordinator, in a registry of its own, served over HTTP on a local
address (`ringsnap.metrics_server`).

Series of the configured clusters exist from the start (at zero), so that alerts on rates and on
absence work before the first backup. `ringsnap_last_successful_backup_timestamp_seconds` counts
complete backups only: a partial one leaves nodes unprotected, which is what the alert is for.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.samples import Sample

from ringsnap import package_version
from ringsnap.coordinator.drill.model import DrillRecord
from ringsnap.coordinator.headline import proven_age_seconds
from ringsnap.coordinator.model import (
    Backup,
    BackupState,
    FreezeWindow,
    PhaseTiming,
    RestoreRecord,
)
from ringsnap.metrics_server import MetricsServer

__all__ = ["CoordinatorMetrics", "MetricsServer"]

RESULTS = tuple(s.value for s in BackupState if s is not BackupState.RUNNING)
SKIP_REASONS = ("busy", "missed")

_DURATION_BUCKETS = (1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200)
# Around the freeze budget (1.5 s by default) and the 250 ms target on simulators.
_WINDOW_BUCKETS = (0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.35, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0)
_OVERHEAD_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5)
_PHASE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 600)


class CoordinatorMetrics:
    def __init__(self, clusters: Iterable[str] = ()) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._proven_clusters: set[str] = set()
        r = self.registry
        self.backup_duration = Histogram(
            "ringsnap_backup_duration_seconds",
            "Wall time of a backup run, start to record, by result.",
            ["cluster", "result"],
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.backups = Counter(
            "ringsnap_backups",
            "Backups finished, by result (complete, partial, failed).",
            ["cluster", "result"],
            registry=r,
        )
        self.skipped = Counter(
            "ringsnap_backups_skipped",
            "Backups that did not run: cluster busy with another backup, or schedule missed.",
            ["cluster", "reason"],
            registry=r,
        )
        self.freeze_window = Histogram(
            "ringsnap_freeze_window_seconds",
            "First freeze to last thaw: how long client writes could stall.",
            ["cluster"],
            buckets=_WINDOW_BUCKETS,
            registry=r,
        )
        self.freeze_overhead = Histogram(
            "ringsnap_freeze_overhead_seconds",
            "Freeze window minus slowest freeze, array call and slowest thaw: coordination cost.",
            ["cluster"],
            buckets=_OVERHEAD_BUCKETS,
            registry=r,
        )
        self.phase_duration = Histogram(
            "ringsnap_backup_phase_duration_seconds",
            "Time spent in each phase of a backup run.",
            ["cluster", "phase"],
            buckets=_PHASE_BUCKETS,
            registry=r,
        )
        self.last_success = Gauge(
            "ringsnap_last_successful_backup_timestamp_seconds",
            "Unix time at which the newest complete backup of the cluster finished.",
            ["cluster"],
            registry=r,
        )
        self.retention_deletions = Counter(
            "ringsnap_retention_deletions",
            "Backups removed by retention.",
            ["cluster"],
            registry=r,
        )
        self.pending_cleanups = Gauge(
            "ringsnap_pending_cleanups",
            "Array snapshots left by failed or deleted backups that are still to be deleted.",
            registry=r,
        )
        self.build_info = Gauge(
            "ringsnap_build_info",
            "Always 1; the version label says which.",
            ["version"],
            registry=r,
        )
        self.build_info.labels(version=package_version()).set(1)
        # Restores run in the operator's CLI process as often as in the daemon, so their figures
        # come from the catalog's records (set at start and after each restore the daemon sees).
        self.last_restore_duration = Gauge(
            "ringsnap_last_restore_duration_seconds",
            "Wall time of the newest finished restore, plan confirmed to record, by result.",
            ["cluster", "result"],
            registry=r,
        )
        self.last_restore = Gauge(
            "ringsnap_last_restore_timestamp_seconds",
            "When the newest restore of each result finished.",
            ["cluster", "result"],
            registry=r,
        )
        self.last_proven = Gauge(
            "ringsnap_last_proven_backup_timestamp_seconds",
            "Start time of the newest backup that a restore or drill proved (the point in time"
            " known to come back).",
            ["cluster"],
            registry=r,
        )
        self.newest_proven_age = Gauge(
            "ringsnap_newest_proven_backup_age_seconds",
            "Age of the newest backup a restore or drill proved, now; +Inf while no backup of the"
            " cluster was ever proven.",
            ["cluster"],
            registry=r,
        )
        # What the shipped alerts compare the figures above with (monitoring/alerts.yml): the
        # configuration's own limits, so that one rule serves every cluster and schedule.
        self.schedule_interval = Gauge(
            "ringsnap_schedule_interval_seconds",
            "Longest time between two consecutive runs of a backup schedule.",
            ["cluster", "schedule"],
            registry=r,
        )
        self.proven_max_age = Gauge(
            "ringsnap_proven_backup_max_age_seconds",
            "Oldest the newest proven backup of the cluster may be (the smallest"
            " proven_max_age_hours of its schedules' policies; 24 h by default).",
            ["cluster"],
            registry=r,
        )
        self.freeze_budget = Gauge(
            "ringsnap_freeze_budget_seconds",
            "Longest a freeze window of the cluster may last (freeze_budget_seconds).",
            ["cluster"],
            registry=r,
        )
        self.over_budget = Counter(
            "ringsnap_freeze_windows_over_budget",
            "Backups whose freeze window (first freeze to last thaw) exceeded the budget.",
            ["cluster"],
            registry=r,
        )
        self.last_window = Gauge(
            "ringsnap_last_freeze_window_seconds",
            "The newest backup's freeze window and its parts (total, slowest_freeze, array_call,"
            " slowest_thaw, overhead).",
            ["cluster", "part"],
            registry=r,
        )
        self.oldest_cleanup = Gauge(
            "ringsnap_oldest_pending_cleanup_timestamp_seconds",
            "When the oldest pending snapshot cleanup was recorded; 0 while none is pending.",
            registry=r,
        )
        # Apart from the pending cleanups: a different room holds them (the run engine's ledger),
        # and what to do differs (resume or abort the run that made them).
        self.ledger_entries = Gauge(
            "ringsnap_ledger_entries",
            "Resources (clones, snapshot tags, staging) the run engine's runs left in the ledger,"
            " not counting those of a cluster a run holds now.",
            registry=r,
        )
        self.oldest_ledger_entry = Gauge(
            "ringsnap_oldest_ledger_entry_timestamp_seconds",
            "When the oldest of those ledger entries was recorded; 0 while there is none.",
            registry=r,
        )
        self.missing_copies = Gauge(
            "ringsnap_backups_missing_s3_copy",
            "Complete backups of an exporting policy with no S3 copy past the policy's"
            " export_deadline_hours.",
            ["cluster"],
            registry=r,
        )
        self.last_step = Gauge(
            "ringsnap_last_restore_step_seconds",
            "Time each step took in the newest finished restore (kind=restore) or drill"
            " (kind=drill, the slowest node's) of the cluster.",
            ["cluster", "kind", "step"],
            registry=r,
        )
        self.last_drill_duration = Gauge(
            "ringsnap_last_drill_duration_seconds",
            "Wall time of the newest finished drill, by result.",
            ["cluster", "result"],
            registry=r,
        )
        self.started = Gauge(
            "ringsnap_coordinator_start_time_seconds",
            "When this coordinator process started (an alert on a never-complete cluster counts"
            " from it).",
            registry=r,
        )
        self.started.set(time.time())
        self.oldest_cleanup.set(0)
        self._budgets: dict[str, float] = {}
        for cluster in clusters:
            self.add_cluster(cluster)

    def add_cluster(self, cluster: str, *, freeze_budget: float | None = None) -> None:
        if freeze_budget is not None:
            self._budgets[cluster] = freeze_budget
            self.freeze_budget.labels(cluster=cluster).set(freeze_budget)
        self.over_budget.labels(cluster=cluster)
        self.missing_copies.labels(cluster=cluster)
        if cluster not in self._proven_clusters:
            self._proven_clusters.add(cluster)
            self.newest_proven_age.labels(cluster=cluster).set(float("inf"))
        for result in RESULTS:
            self.backups.labels(cluster=cluster, result=result)
        for reason in SKIP_REASONS:
            self.skipped.labels(cluster=cluster, reason=reason)
        self.retention_deletions.labels(cluster=cluster)

    # -- recording ---------------------------------------------------------------------------------

    def backup_finished(
        self,
        cluster: str,
        result: BackupState,
        duration_seconds: float,
        *,
        finished_at: datetime | None = None,
        freeze_window: FreezeWindow | None = None,
        phases: Mapping[str, float] | Iterable[PhaseTiming] = (),
    ) -> None:
        if result is BackupState.RUNNING:
            raise ValueError("a running backup has not finished")
        label = BackupState(result).value
        self.backups.labels(cluster=cluster, result=label).inc()
        self.backup_duration.labels(cluster=cluster, result=label).observe(duration_seconds)
        if freeze_window is not None:
            self.freeze_window.labels(cluster=cluster).observe(freeze_window.total)
            self.freeze_overhead.labels(cluster=cluster).observe(max(freeze_window.overhead, 0.0))
            parts = {
                "total": freeze_window.total,
                "slowest_freeze": freeze_window.slowest_freeze,
                "array_call": freeze_window.array_call,
                "slowest_thaw": freeze_window.slowest_thaw,
                "overhead": max(freeze_window.overhead, 0.0),
            }
            for part, seconds in parts.items():
                self.last_window.labels(cluster=cluster, part=part).set(seconds)
            budget = self._budgets.get(cluster)
            if budget is not None and freeze_window.total > budget:
                self.over_budget.labels(cluster=cluster).inc()
        pairs = (
            phases.items()
            if isinstance(phases, Mapping)
            else ((p.phase, p.seconds) for p in phases)
        )
        for phase, seconds in pairs:
            self.phase_duration.labels(cluster=cluster, phase=phase).observe(seconds)
        if result is BackupState.COMPLETE and finished_at is not None:
            self.last_success.labels(cluster=cluster).set(finished_at.timestamp())

    def record_backup(self, backup: Backup) -> None:
        """Everything a finished backup from the catalog tells."""
        if backup.finished_at is None:
            raise ValueError(f"backup {backup.id} has not finished")
        self.backup_finished(
            backup.cluster,
            backup.state,
            (backup.finished_at - backup.started_at).total_seconds(),
            finished_at=backup.finished_at,
            freeze_window=backup.freeze_window,
            phases=backup.timings,
        )

    def set_last_success(self, cluster: str, finished_at: datetime) -> None:
        """Seed the gauge from the catalog at start, so that a restart does not reset it."""
        self.last_success.labels(cluster=cluster).set(finished_at.timestamp())

    def record_restores(self, restores: Iterable[RestoreRecord]) -> None:
        """The newest finished restore of each result, per cluster (records newest first), and
        the steps of the newest finished one. Read again from the catalog each time: a failed
        restore resumed to success no longer counts as failed."""
        seen: set[tuple[str, str]] = set()
        stepped: set[str] = set()
        self.last_restore_duration.clear()
        self.last_restore.clear()
        for record in restores:
            key = (record.cluster, record.state.value)
            if record.finished_at is None or key in seen:
                continue
            seen.add(key)
            seconds = (record.finished_at - record.started_at).total_seconds()
            self.last_restore_duration.labels(*key).set(seconds)
            self.last_restore.labels(*key).set(record.finished_at.timestamp())
            if record.cluster not in stepped:
                stepped.add(record.cluster)
                self._set_steps(
                    record.cluster, "restore", ((t.phase, t.seconds) for t in record.timings)
                )

    def record_drill(self, drill: DrillRecord) -> None:
        """The newest finished drill of a cluster: its duration and each step's (slowest node)."""
        if drill.seconds is None:
            return
        for sample in _samples(self.last_drill_duration):
            if sample.labels["cluster"] == drill.cluster:
                self.last_drill_duration.remove(drill.cluster, sample.labels["result"])
        self.last_drill_duration.labels(drill.cluster, drill.state.value).set(drill.seconds)
        slowest: dict[str, float] = {}
        for node in drill.nodes:
            for step, seconds in node.step_seconds:
                slowest[step] = max(slowest.get(step, 0.0), seconds)
        self._set_steps(drill.cluster, "drill", slowest.items())

    def _set_steps(self, cluster: str, kind: str, steps: Iterable[tuple[str, float]]) -> None:
        for sample in _samples(self.last_step):
            if sample.labels["cluster"] == cluster and sample.labels["kind"] == kind:
                self.last_step.remove(cluster, kind, sample.labels["step"])
        for step, seconds in steps:
            self.last_step.labels(cluster, kind, step).set(seconds)

    def set_schedule(self, cluster: str, schedule: str, interval_seconds: float) -> None:
        self.schedule_interval.labels(cluster=cluster, schedule=schedule).set(interval_seconds)

    def set_proven_max_age(self, cluster: str, seconds: float) -> None:
        self.proven_max_age.labels(cluster=cluster).set(seconds)

    def set_missing_copies(self, cluster: str, count: int) -> None:
        self.missing_copies.labels(cluster=cluster).set(count)

    def set_last_proven(self, cluster: str, backup_started_at: datetime) -> None:
        self.last_proven.labels(cluster=cluster).set(backup_started_at.timestamp())
        # Computed at each scrape, so that an alert on the age needs no new proof to fire; by the
        # function `ringsnap status` prints it with.
        self._proven_clusters.add(cluster)
        self.newest_proven_age.labels(cluster=cluster).set_function(
            lambda: proven_age_seconds(backup_started_at, datetime.now(UTC))
        )

    def backup_skipped(self, cluster: str, reason: str) -> None:
        if reason not in SKIP_REASONS:
            raise ValueError(f"skip reason must be one of {SKIP_REASONS}, not {reason!r}")
        self.skipped.labels(cluster=cluster, reason=reason).inc()

    def retention_deleted(self, cluster: str, count: int = 1) -> None:
        self.retention_deletions.labels(cluster=cluster).inc(count)

    def set_pending_cleanups(self, count: int, oldest: datetime | None = None) -> None:
        self.pending_cleanups.set(count)
        self.oldest_cleanup.set(oldest.timestamp() if oldest is not None and count else 0)

    def set_ledger_entries(self, count: int, oldest: datetime | None = None) -> None:
        self.ledger_entries.set(count)
        self.oldest_ledger_entry.set(oldest.timestamp() if oldest is not None and count else 0)

    def exposition(self) -> bytes:
        """The registry in the Prometheus text format."""
        return generate_latest(self.registry)


def _samples(metric: Gauge) -> list[Sample]:
    """The samples of every child of `metric` now (a copy: children may be removed meanwhile)."""
    return [sample for family in metric.collect() for sample in family.samples]
