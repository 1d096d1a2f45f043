"""Retention: which backups to keep, and why. A pure function of the history, the policy and `now`.

The rules, in the order a backup earns its reasons (a backup is kept if it has any):
- the newest complete backup is never removed;
- the newest proven backup (a restore or a restore drill proved it) is never removed: when every
  newer backup turns out unrestorable, it is the one known to work;
- `min_count`: the newest N usable backups (complete or partial);
- `max_age`: every usable backup started less than `max_age` before `now`;
- buckets, as restic's `--keep-hourly/daily/weekly/monthly`: for each of the N most recent hours
  (days, ISO weeks, months) that hold a usable backup, the newest backup of that period is kept.
  Periods without backups do not use up the count (a coordinator that was down does not lose its
  history). A complete backup always wins its period over a partial one; a partial backup fills a
  period only where no complete backup exists, so a cluster that can only take partial backups
  still gets a bounded, useful history;
- a running backup is kept (it is not the policy's to judge);
- a failed backup is kept for `failed_grace` after it ended (for inspection), then removed;
- a lost backup (a restore destroyed its snapshots) can restore nothing: it never counts for any
  rule above, so it never takes the place of a restorable backup; its record is kept for
  `failed_grace` after the loss was recorded (for inspection), then removed.

Only restorable backups (complete or partial, snapshots not lost) are "usable" for the rules.

Everything is in UTC, so daylight-saving changes never merge or split a period. Ties (same start)
are broken by backup id, so the result is deterministic whatever the input order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from ringsnap.coordinator.model import BackupState, BackupSummary, Verification

NEWEST_COMPLETE = "newest complete backup (never removed)"
NEWEST_PROVEN = "newest proven backup (never removed)"
BEYOND_BUCKETS = "beyond all buckets"
RUNNING = "running (never judged by retention)"


@dataclass(frozen=True)
class RetentionPolicy:
    hourly: int = 0
    daily: int = 0
    weekly: int = 0
    monthly: int = 0
    #: Keep every usable backup younger than this.
    max_age: timedelta | None = None
    #: Keep at least this many of the newest usable backups.
    min_count: int = 0
    #: How long the record of a failed backup, or of one whose snapshots are lost, stays for
    #: inspection.
    failed_grace: timedelta = timedelta(days=7)

    def __post_init__(self) -> None:
        for name in ("hourly", "daily", "weekly", "monthly", "min_count"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be 0 or more")
        if self.max_age is not None and self.max_age <= timedelta(0):
            raise ValueError("max_age must be positive")
        if self.failed_grace < timedelta(0):
            raise ValueError("failed_grace must be 0 or more")

    @property
    def keeps_history(self) -> bool:
        """False when the policy keeps nothing beyond the newest complete backup."""
        return bool(
            self.hourly
            or self.daily
            or self.weekly
            or self.monthly
            or self.max_age
            or self.min_count
        )


@dataclass(frozen=True)
class RetentionDecision:
    backup: BackupSummary
    keep: bool
    #: Why, most important first: every rule that keeps it, or the one reason it goes.
    reasons: tuple[str, ...]

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)


@dataclass(frozen=True)
class RetentionPlan:
    #: One decision per backup, newest first.
    decisions: tuple[RetentionDecision, ...]

    @property
    def keep(self) -> tuple[BackupSummary, ...]:
        return tuple(d.backup for d in self.decisions if d.keep)

    @property
    def remove(self) -> tuple[BackupSummary, ...]:
        return tuple(d.backup for d in self.decisions if not d.keep)

    def decision(self, backup_id: str) -> RetentionDecision:
        for decision in self.decisions:
            if decision.backup.id == backup_id:
                return decision
        raise KeyError(backup_id)


Period = tuple[int, ...]


def _hour(moment: datetime) -> Period:
    return (moment.year, moment.month, moment.day, moment.hour)


def _day(moment: datetime) -> Period:
    return (moment.year, moment.month, moment.day)


def _week(moment: datetime) -> Period:
    iso = moment.isocalendar()
    return (iso.year, iso.week)


def _month(moment: datetime) -> Period:
    return (moment.year, moment.month)


def _hour_label(p: Period) -> str:
    return f"{p[0]:04d}-{p[1]:02d}-{p[2]:02d}T{p[3]:02d}:00Z"


def _day_label(p: Period) -> str:
    return f"{p[0]:04d}-{p[1]:02d}-{p[2]:02d}"


def _week_label(p: Period) -> str:
    return f"{p[0]:04d}-W{p[1]:02d}"


def _month_label(p: Period) -> str:
    return f"{p[0]:04d}-{p[1]:02d}"


_BUCKETS: tuple[tuple[str, Callable[[datetime], Period], Callable[[Period], str]], ...] = (
    ("hourly", _hour, _hour_label),
    ("daily", _day, _day_label),
    ("weekly", _week, _week_label),
    ("monthly", _month, _month_label),
)


def format_duration(span: timedelta) -> str:
    """`timedelta(days=30)` -> "30d"; the largest exact unit, as config files write it."""
    seconds = span.total_seconds()
    for unit, size in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def _buckets(
    usable: Sequence[tuple[BackupSummary, datetime]],
    count: int,
    period_of: Callable[[datetime], Period],
) -> Iterable[tuple[int, Period, BackupSummary]]:
    """(rank, period, chosen backup) for the `count` most recent periods holding a usable backup.

    `usable` is newest first, so a period's backups are consecutive and periods come newest first.
    """
    rank = 0
    index = 0
    while index < len(usable) and rank < count:
        period = period_of(usable[index][1])
        chosen: BackupSummary | None = None
        first = usable[index][0]
        while index < len(usable) and period_of(usable[index][1]) == period:
            if chosen is None and usable[index][0].state is BackupState.COMPLETE:
                chosen = usable[index][0]
            index += 1
        rank += 1
        yield rank, period, chosen or first


def apply_policy(
    backups: Iterable[BackupSummary], policy: RetentionPolicy, now: datetime
) -> RetentionPlan:
    """Decide keep/remove, with reasons, for every backup in `backups` (one cluster and policy)."""
    if now.tzinfo is None:
        raise ValueError("now must be an aware datetime")
    now = now.astimezone(UTC)
    # Newest first; the id breaks ties so that the order, and so the result, never depends on input.
    ordered = sorted(
        ((b, b.started_at.astimezone(UTC)) for b in backups),
        key=lambda pair: (pair[1], pair[0].id),
        reverse=True,
    )
    reasons: dict[str, list[str]] = {}
    for backup, _ in ordered:
        if backup.id in reasons:
            raise ValueError(f"backup {backup.id} is listed twice")
        reasons[backup.id] = []

    usable = [(b, at) for b, at in ordered if b.restorable]
    newest_complete = next((b for b, _ in usable if b.state is BackupState.COMPLETE), None)
    if newest_complete is not None:
        reasons[newest_complete.id].append(NEWEST_COMPLETE)
    newest_proven = next((b for b, _ in usable if b.verification is Verification.PROVEN), None)
    if newest_proven is not None:
        reasons[newest_proven.id].append(NEWEST_PROVEN)
    for rank, (backup, _) in enumerate(usable[: policy.min_count], start=1):
        reasons[backup.id].append(f"min_count #{rank}")
    if policy.max_age is not None:
        oldest = now - policy.max_age
        label = f"within max_age ({format_duration(policy.max_age)})"
        for backup, at in usable:
            if at <= oldest:
                break
            reasons[backup.id].append(label)
    for kind, period_of, label_of in _BUCKETS:
        count = getattr(policy, kind)
        for rank, period, chosen in _buckets(usable, count, period_of):
            reasons[chosen.id].append(f"{kind} #{rank} ({label_of(period)})")

    decisions: list[RetentionDecision] = []
    for backup, _ in ordered:
        kept_for = reasons[backup.id]
        if backup.state is BackupState.RUNNING:
            decisions.append(RetentionDecision(backup, True, (RUNNING,)))
        elif backup.state is BackupState.FAILED:
            ended = (backup.finished_at or backup.started_at).astimezone(UTC)
            until = ended + policy.failed_grace
            if now < until:
                reason = f"failed, kept for inspection until {until:%Y-%m-%dT%H:%M:%SZ}"
                decisions.append(RetentionDecision(backup, True, (reason,)))
            else:
                reason = f"failed, past its {format_duration(policy.failed_grace)} grace period"
                decisions.append(RetentionDecision(backup, False, (reason,)))
        elif backup.lost:
            decisions.append(_lost(backup, policy, now))
        elif kept_for:
            decisions.append(RetentionDecision(backup, True, tuple(kept_for)))
        else:
            decisions.append(RetentionDecision(backup, False, (BEYOND_BUCKETS,)))
    return RetentionPlan(tuple(decisions))


def _lost(backup: BackupSummary, policy: RetentionPolicy, now: datetime) -> RetentionDecision:
    """A backup whose snapshots are gone: its record stays a while for inspection, like a failed
    one's, counted from when the loss was recorded."""
    since = (backup.lost_at or backup.finished_at or backup.started_at).astimezone(UTC)
    until = since + policy.failed_grace
    if now < until:
        reason = (
            f"snapshots lost ({backup.lost_reason}), kept for inspection until"
            f" {until:%Y-%m-%dT%H:%M:%SZ}"
        )
        return RetentionDecision(backup, True, (reason,))
    reason = (
        f"snapshots lost ({backup.lost_reason}), past its {format_duration(policy.failed_grace)}"
        " grace period"
    )
    return RetentionDecision(backup, False, (reason,))
