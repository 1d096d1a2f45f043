"""The headline figures that the Prometheus metrics (so the dashboards and alerts) and
`ringsnap status` both show, computed here once so that the terminal and the dashboard never
disagree: the newest proven backup of a cluster and its age, the longest gap a schedule leaves
between two runs, the complete backups whose S3 copy is overdue.

Pure functions of what the catalog and the configuration hold; nothing here reads a clock.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from datetime import datetime, timedelta

from ringsnap.coordinator.model import BackupState, BackupSummary, Verification
from ringsnap.coordinator.scheduler import Schedule, cron_trigger

#: Fire times looked at to find a schedule's longest gap: covers a weekly pattern of hourly runs.
_FIRES_LOOKED_AT = 200
_TICK = timedelta(microseconds=1)


def newest_proven(summaries: Iterable[BackupSummary]) -> BackupSummary | None:
    """The newest restorable backup that a restore or drill proved (the point in time known to
    come back), or None when none was ever proven."""
    proven = [s for s in summaries if s.restorable and s.verification is Verification.PROVEN]
    return max(proven, key=lambda s: s.started_at, default=None)


def proven_age_seconds(started_at: datetime, now: datetime) -> float:
    """How old the data of a proven backup is: from its start (its point in time) to `now`.
    The metric computes it at each scrape, `ringsnap status` when it prints."""
    return (now - started_at).total_seconds()


def longest_interval_seconds(schedule: Schedule, after: datetime) -> float:
    """The longest time between two consecutive runs of `schedule` after `after` (a weekday-only
    schedule's weekend gap, not its usual day): the alert on a missing backup waits that long."""
    trigger = cron_trigger(schedule)
    previous = trigger.get_next_fire_time(None, after)
    longest = 0.0
    for _ in range(_FIRES_LOOKED_AT):
        if previous is None:
            break
        following = trigger.get_next_fire_time(None, previous + _TICK)
        if following is None:
            break
        longest = max(longest, (following - previous).total_seconds())
        previous = following
    return longest


def missing_s3_copies(
    summaries: Iterable[BackupSummary],
    exported: Collection[str],
    deadlines: dict[str, timedelta],
    now: datetime,
) -> list[BackupSummary]:
    """Complete backups of an exporting policy (`deadlines`: policy → how long its export may
    take) that have no S3 copy although their deadline has passed."""
    late = []
    for summary in summaries:
        deadline = deadlines.get(summary.policy)
        if deadline is None or summary.state is not BackupState.COMPLETE or summary.lost:
            continue
        finished = summary.finished_at or summary.started_at
        if now - finished > deadline and summary.id not in exported:
            late.append(summary)
    return late
