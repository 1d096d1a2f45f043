"""Retention keeps exactly what the policy says.

The property tests build histories of up to two years of hourly backups (with gaps, several backups
in one hour, failed, partial and running ones) and compare `apply_policy` with an oracle written
here independently, the obvious way: group by period with different key functions, sort the
periods, take the first N.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable, Hashable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from ringsnap.coordinator.model import BackupState, BackupSummary, QuiesceMode
from ringsnap.coordinator.retention import (
    BEYOND_BUCKETS,
    NEWEST_COMPLETE,
    RetentionPlan,
    RetentionPolicy,
    apply_policy,
)

HOUR = timedelta(hours=1)


def backup(
    id_: str,
    started_at: datetime,
    state: BackupState = BackupState.COMPLETE,
    finished_at: datetime | None = None,
) -> BackupSummary:
    if finished_at is None and state is not BackupState.RUNNING:
        finished_at = started_at + timedelta(seconds=30)
    return BackupSummary(
        id=id_,
        cluster="c1",
        state=state,
        quiesce_mode=QuiesceMode.FREEZE,
        trigger="schedule:hourly",
        policy="p",
        started_at=started_at,
        finished_at=finished_at,
        error="boom" if state is BackupState.FAILED else "",
    )


def hourly_history(end: datetime, hours: int) -> list[BackupSummary]:
    return [backup(f"b{i:06d}", end - i * HOUR) for i in range(hours)]


# -- the oracle ----------------------------------------------------------------------------------


def _short(reason: str) -> str:
    """'hourly #3 (2026-11-21T10:00Z)' -> 'hourly #3'; 'within max_age (30d)' -> 'within max_age'."""
    return reason.split(" (", 1)[0]


def expected_reasons(
    backups: list[BackupSummary], policy: RetentionPolicy, now: datetime
) -> dict[str, set[str]]:
    """Short reasons for every backup the policy keeps; absent ids are removed."""
    keep: dict[str, set[str]] = defaultdict(set)
    usable = [b for b in backups if b.state in (BackupState.COMPLETE, BackupState.PARTIAL)]
    newest_first = sorted(usable, key=lambda b: (b.started_at, b.id), reverse=True)
    completes = [b for b in newest_first if b.state is BackupState.COMPLETE]
    if completes:
        keep[completes[0].id].add(_short(NEWEST_COMPLETE))
    for rank, b in enumerate(newest_first[: policy.min_count], start=1):
        keep[b.id].add(f"min_count #{rank}")
    if policy.max_age is not None:
        for b in usable:
            if b.started_at > now - policy.max_age:
                keep[b.id].add("within max_age")
    keys: list[tuple[str, int, Callable[[datetime], Hashable]]] = [
        ("hourly", policy.hourly, lambda t: t.astimezone(UTC).strftime("%Y-%m-%d %H")),
        ("daily", policy.daily, lambda t: t.astimezone(UTC).date()),
        ("weekly", policy.weekly, lambda t: tuple(t.astimezone(UTC).isocalendar())[:2]),
        ("monthly", policy.monthly, lambda t: (t.astimezone(UTC).year, t.astimezone(UTC).month)),
    ]
    for kind, count, key in keys:
        groups: dict[Hashable, list[BackupSummary]] = defaultdict(list)
        for b in usable:
            groups[key(b.started_at)].append(b)
        for rank, period in enumerate(sorted(groups, reverse=True)[:count], start=1):  # type: ignore[type-var]
            members = groups[period]
            complete = [b for b in members if b.state is BackupState.COMPLETE]
            winner = max(complete or members, key=lambda b: (b.started_at, b.id))
            keep[winner.id].add(f"{kind} #{rank}")
    for b in backups:
        if b.state is BackupState.RUNNING:
            keep[b.id].add("running")
        elif b.state is BackupState.FAILED:
            assert b.finished_at is not None
            if now < b.finished_at + policy.failed_grace:
                keep[b.id].add("failed, kept for inspection until")
    return dict(keep)


def check_plan(
    plan: RetentionPlan, backups: list[BackupSummary], policy: RetentionPolicy, now: datetime
) -> None:
    expected = expected_reasons(backups, policy, now)
    assert len(plan.decisions) == len(backups)
    assert {d.backup.id for d in plan.decisions} == {b.id for b in backups}
    got_keep = {d.backup.id for d in plan.decisions if d.keep}
    assert got_keep == set(expected)
    for decision in plan.decisions:
        shorts = {_short(r) for r in decision.reasons}
        if decision.keep:
            if decision.backup.state is BackupState.FAILED:
                assert decision.reason.startswith("failed, kept for inspection until ")
            elif decision.backup.state is BackupState.RUNNING:
                assert shorts == {"running"}
            else:
                assert shorts == expected[decision.backup.id], decision.backup.id
        elif decision.backup.state is BackupState.FAILED:
            assert decision.reason.startswith("failed, past its")
        else:
            assert decision.reasons == (BEYOND_BUCKETS,)
    complete = [b for b in backups if b.state is BackupState.COMPLETE]
    if complete:
        newest = max(complete, key=lambda b: (b.started_at, b.id))
        assert plan.decision(newest.id).keep
    # Newest first, deterministic order.
    order = [(d.backup.started_at, d.backup.id) for d in plan.decisions]
    assert order == sorted(order, reverse=True)


# -- properties ----------------------------------------------------------------------------------

policies = st.builds(
    RetentionPolicy,
    hourly=st.integers(0, 48),
    daily=st.integers(0, 31),
    weekly=st.integers(0, 10),
    monthly=st.integers(0, 30),
    max_age=st.none() | st.integers(1, 24 * 120).map(lambda h: timedelta(hours=h)),
    min_count=st.integers(0, 12),
    failed_grace=st.integers(0, 24 * 14).map(lambda h: timedelta(hours=h)),
)


@st.composite
def histories(
    draw: st.DrawFn, max_hours: int, min_hours: int = 1
) -> tuple[list[BackupSummary], datetime]:
    """A synthetic history: one backup per hour, with gaps, extra backups in an hour (some at the
    very same second), failures, partial runs and a running one; and a `now` after it."""
    start = draw(
        st.datetimes(
            min_value=datetime(2019, 1, 1), max_value=datetime(2030, 1, 1), timezones=st.just(UTC)
        )
    )
    hours = draw(st.integers(min_hours, max_hours))
    seed = draw(st.integers(0, 2**32 - 1))
    gap = draw(st.sampled_from([0.0, 0.05, 0.4, 0.9]))
    extra = draw(st.sampled_from([0.0, 0.1, 0.5]))
    failed = draw(st.sampled_from([0.0, 0.05, 0.3, 1.0]))
    partial = draw(st.sampled_from([0.0, 0.05, 0.5]))
    rng = random.Random(seed)
    out: list[BackupSummary] = []
    for hour in range(hours):
        if rng.random() < gap:
            continue
        base = start + hour * HOUR
        times = [base + timedelta(seconds=rng.randrange(3600))]
        while rng.random() < extra:
            times.append(rng.choice([times[0], base + timedelta(seconds=rng.randrange(3600))]))
        for moment in times:
            roll = rng.random()
            if roll < failed:
                state = BackupState.FAILED
            elif roll < failed + partial:
                state = BackupState.PARTIAL
            else:
                state = BackupState.COMPLETE
            out.append(backup(f"b{len(out):06d}", moment, state))
    add_running = draw(st.booleans())
    if out and add_running:
        out.append(backup("running", out[-1].started_at + HOUR, BackupState.RUNNING))
    end = start + hours * HOUR
    now = end + draw(st.integers(0, 24 * 45).map(lambda h: timedelta(hours=h)))
    return out, now


@settings(max_examples=200, deadline=None)
@given(histories(max_hours=24 * 60), policies)
def test_small_histories_keep_exactly_what_the_policy_says(
    history: tuple[list[BackupSummary], datetime], policy: RetentionPolicy
) -> None:
    backups, now = history
    check_plan(apply_policy(backups, policy, now), backups, policy, now)


# No shrinking: shrinking a year-long history takes minutes; the small-history test above
# reports minimal counterexamples of the same properties.
@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
@given(histories(max_hours=2 * 365 * 24, min_hours=365 * 24), policies)
def test_two_year_histories_keep_exactly_what_the_policy_says(
    history: tuple[list[BackupSummary], datetime], policy: RetentionPolicy
) -> None:
    backups, now = history
    check_plan(apply_policy(backups, policy, now), backups, policy, now)


@settings(max_examples=30, deadline=None)
@given(histories(max_hours=24 * 30), policies, st.randoms(use_true_random=False))
def test_the_plan_does_not_depend_on_input_order(
    history: tuple[list[BackupSummary], datetime], policy: RetentionPolicy, rnd: random.Random
) -> None:
    backups, now = history
    shuffled = list(backups)
    rnd.shuffle(shuffled)
    assert apply_policy(shuffled, policy, now) == apply_policy(backups, policy, now)


# -- the documented example and edge cases -------------------------------------------------------


def test_two_years_of_hourly_backups_with_the_usual_policy() -> None:
    end = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)  # a Saturday, ISO week 47
    backups = hourly_history(end, 2 * 365 * 24)
    assert len(backups) == 17_520
    policy = RetentionPolicy(hourly=24, daily=7, weekly=4, monthly=12)
    plan = apply_policy(backups, policy, end)
    check_plan(plan, backups, policy, end)
    by_time = {d.backup.started_at: d for d in plan.decisions}

    def reasons_at(year: int, month: int, day: int, hour: int) -> tuple[str, ...]:
        return by_time[datetime(year, month, day, hour, tzinfo=UTC)].reasons

    assert reasons_at(2026, 11, 21, 10) == (
        NEWEST_COMPLETE,
        "hourly #1 (2026-11-21T10:00Z)",
        "daily #1 (2026-11-21)",
        "weekly #1 (2026-W47)",
        "monthly #1 (2026-11)",
    )
    assert reasons_at(2026, 11, 20, 11) == ("hourly #24 (2026-11-20T11:00Z)",)
    assert reasons_at(2026, 11, 20, 23) == (
        "hourly #12 (2026-11-20T23:00Z)",
        "daily #2 (2026-11-20)",
    )
    # Sunday 15 November closes ISO week 46 and is the 7th day kept.
    assert reasons_at(2026, 11, 15, 23) == ("daily #7 (2026-11-15)", "weekly #2 (2026-W46)")
    assert reasons_at(2026, 11, 1, 23) == ("weekly #4 (2026-W44)",)
    assert reasons_at(2026, 10, 31, 23) == ("monthly #2 (2026-10)",)
    assert reasons_at(2025, 12, 31, 23) == ("monthly #12 (2025-12)",)
    assert not by_time[datetime(2025, 11, 30, 23, tzinfo=UTC)].keep
    # 24 hourly + 5 more days + 2 more weeks + 11 more months.
    assert len(plan.keep) == 42
    assert len(plan.remove) == 17_520 - 42


def test_periods_without_backups_do_not_use_up_the_count() -> None:
    end = datetime(2026, 3, 1, tzinfo=UTC)
    backups = [backup(f"b{i:03d}", end - i * 3 * HOUR) for i in range(100)]  # every 3 hours
    plan = apply_policy(backups, RetentionPolicy(hourly=24), end)
    assert [b.id for b in plan.keep] == [f"b{i:03d}" for i in range(24)]  # spans 72 hours


def test_several_backups_in_one_hour_keep_the_newest_and_ties_break_by_id() -> None:
    hour = datetime(2026, 5, 5, 7, tzinfo=UTC)
    backups = [
        backup("a", hour + timedelta(minutes=5)),
        backup("b", hour + timedelta(minutes=50)),
        backup("c", hour + timedelta(minutes=50)),  # same second as "b": the larger id wins
        backup("d", hour - timedelta(minutes=1)),
    ]
    plan = apply_policy(backups, RetentionPolicy(hourly=2), hour + 2 * HOUR)
    assert [b.id for b in plan.keep] == ["c", "d"]
    assert plan.decision("c").reasons[0] == NEWEST_COMPLETE
    assert plan.decision("b").reason == BEYOND_BUCKETS


def test_all_failed_keeps_only_those_within_their_grace_period() -> None:
    base = datetime(2026, 1, 10, tzinfo=UTC)
    backups = [backup(f"f{i}", base - i * timedelta(days=1), BackupState.FAILED) for i in range(10)]
    now = base + timedelta(minutes=1)  # f3 ended 3 days and 30 s before `now`
    policy = RetentionPolicy(hourly=24, daily=7, failed_grace=timedelta(days=3))
    plan = apply_policy(backups, policy, now)
    assert [b.id for b in plan.keep] == ["f0", "f1", "f2"]
    assert plan.decision("f0").reason.startswith("failed, kept for inspection until 2026-01-13")
    assert plan.decision("f5").reason == "failed, past its 3d grace period"


def test_the_newest_complete_backup_survives_any_policy() -> None:
    now = datetime(2026, 1, 10, tzinfo=UTC)
    old = backup("old", now - timedelta(days=400))
    plan = apply_policy([old], RetentionPolicy(max_age=timedelta(days=1)), now)
    assert plan.keep == (old,)
    assert plan.decision("old").reasons == (NEWEST_COMPLETE,)


def test_a_complete_backup_wins_its_period_over_a_newer_partial_one() -> None:
    hour = datetime(2026, 5, 5, 7, tzinfo=UTC)
    backups = [
        backup("complete", hour + timedelta(minutes=5)),
        backup("partial-newer", hour + timedelta(minutes=40), BackupState.PARTIAL),
        backup("partial-alone", hour - timedelta(minutes=30), BackupState.PARTIAL),
        backup("complete-older", hour - 2 * HOUR),
    ]
    plan = apply_policy(backups, RetentionPolicy(hourly=3), hour + HOUR)
    assert plan.decision("complete").reasons == (NEWEST_COMPLETE, "hourly #1 (2026-05-05T07:00Z)")
    assert plan.decision("partial-newer").reason == BEYOND_BUCKETS
    # Hour 06 has only a partial backup: it fills that period.
    assert plan.decision("partial-alone").reasons == ("hourly #2 (2026-05-05T06:00Z)",)
    assert plan.decision("complete-older").reasons == ("hourly #3 (2026-05-05T05:00Z)",)


def test_a_running_backup_is_kept_and_counts_for_nothing() -> None:
    now = datetime(2026, 5, 5, 7, tzinfo=UTC)
    backups = [backup("run", now, BackupState.RUNNING), backup("done", now - HOUR)]
    plan = apply_policy(backups, RetentionPolicy(hourly=1), now)
    assert plan.decision("run").keep and plan.decision("run").reason.startswith("running")
    assert plan.decision("done").reasons == (NEWEST_COMPLETE, "hourly #1 (2026-05-05T06:00Z)")


def lost(summary: BackupSummary, at: datetime) -> BackupSummary:
    return replace(summary, lost_reason="restore rr-1 reverted to backup b3", lost_at=at)


def test_lost_backups_never_take_the_place_of_a_restorable_one() -> None:
    hour = datetime(2026, 5, 5, 7, tzinfo=UTC)
    now = hour + HOUR
    # A revert to b3 destroyed the snapshots of every newer backup; b0 came after the restore.
    history = [
        backup("b0", hour + timedelta(minutes=30)),
        lost(backup("b1", hour + timedelta(minutes=10)), hour + timedelta(minutes=20)),
        lost(backup("b2", hour - HOUR), hour + timedelta(minutes=20)),
        lost(backup("b2p", hour - HOUR + timedelta(minutes=5), BackupState.PARTIAL), hour),
        backup("b3", hour - 2 * HOUR),
        backup("b4", hour - 3 * HOUR),
        backup("b5", hour - 4 * HOUR),
    ]
    policy = RetentionPolicy(hourly=3, min_count=2, max_age=timedelta(minutes=90))
    plan = apply_policy(history, policy, now)
    # Hour 07 goes to b0 (the lost b1 is newer in it); hour 06 holds only lost backups, so it is
    # no period at all: the three hourly slots go to 07, 05 and 04.
    assert plan.decision("b0").reasons == (
        NEWEST_COMPLETE,
        "min_count #1",
        "within max_age (90m)",
        "hourly #1 (2026-05-05T07:00Z)",
    )
    assert plan.decision("b3").reasons == ("min_count #2", "hourly #2 (2026-05-05T05:00Z)")
    assert plan.decision("b4").reasons == ("hourly #3 (2026-05-05T04:00Z)",)
    assert plan.decision("b5").reason == BEYOND_BUCKETS
    for backup_id in ("b1", "b2", "b2p"):
        decision = plan.decision(backup_id)
        assert decision.keep, "kept a while for inspection, like a failed backup"
        assert decision.reason.startswith(
            "snapshots lost (restore rr-1 reverted to backup b3), kept for inspection until"
        ), decision.reason
    # Past the grace period (counted from the loss), a lost backup goes whatever the policy.
    later = hour + timedelta(days=7, minutes=10)
    plan = apply_policy(history, RetentionPolicy(hourly=1000, min_count=1000), later)
    assert {b.id for b in plan.remove} == {"b2p"}  # lost at 07:00: its grace ended at 07:00 + 7 d
    assert plan.decision("b2p").reason == (
        "snapshots lost (restore rr-1 reverted to backup b3), past its 1w grace period"
    )
    assert plan.decision("b1").keep  # lost at 07:20: kept until 07:20 + 7 d
    assert plan.decision("b0").reasons[0] == NEWEST_COMPLETE


def test_when_every_complete_backup_is_lost_none_is_the_newest_complete() -> None:
    now = datetime(2026, 5, 5, 7, tzinfo=UTC)
    history = [
        lost(backup("gone", now - HOUR), now),
        backup("partial", now - 2 * HOUR, BackupState.PARTIAL),
    ]
    plan = apply_policy(history, RetentionPolicy(hourly=1), now)
    assert NEWEST_COMPLETE not in plan.decision("gone").reasons
    assert plan.decision("partial").reasons == ("hourly #1 (2026-05-05T05:00Z)",)


def test_time_zones_and_daylight_saving_do_not_matter() -> None:
    berlin = ZoneInfo("Europe/Berlin")
    # 25 October 2026: clocks go back at 03:00 CEST; 02:30 local happens twice, an hour apart.
    first = datetime(2026, 10, 25, 2, 30, tzinfo=berlin, fold=0)
    second = datetime(2026, 10, 25, 2, 30, tzinfo=berlin, fold=1)
    local = [backup("first", first), backup("second", second)]
    in_utc = [backup("first", first.astimezone(UTC)), backup("second", second.astimezone(UTC))]
    now = datetime(2026, 10, 25, 6, tzinfo=UTC)
    policy = RetentionPolicy(hourly=2, daily=1)
    plan = apply_policy(local, policy, now)
    assert [d.reasons for d in plan.decisions] == [
        d.reasons for d in apply_policy(in_utc, policy, now).decisions
    ]
    # Two distinct UTC hours (00:30Z and 01:30Z), one UTC day.
    assert plan.decision("second").reasons == (
        NEWEST_COMPLETE,
        "hourly #1 (2026-10-25T01:00Z)",
        "daily #1 (2026-10-25)",
    )
    assert plan.decision("first").reasons == ("hourly #2 (2026-10-25T00:00Z)",)


def test_max_age_and_min_count() -> None:
    now = datetime(2026, 1, 10, tzinfo=UTC)
    backups = hourly_history(now - 10 * HOUR, 48)
    plan = apply_policy(backups, RetentionPolicy(max_age=timedelta(hours=12), min_count=5), now)
    within = [d.backup.id for d in plan.decisions if "within max_age (12h)" in d.reasons]
    assert within == ["b000000", "b000001"]  # 10 h and 11 h old; 12 h is not "within"
    assert [b.id for b in plan.keep] == [f"b00000{i}" for i in range(5)]
    assert plan.decision("b000004").reasons == ("min_count #5",)


def test_bad_input_is_refused() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    with pytest.raises(ValueError, match="listed twice"):
        apply_policy([backup("x", now), backup("x", now - HOUR)], RetentionPolicy(hourly=1), now)
    with pytest.raises(ValueError, match="aware"):
        apply_policy([], RetentionPolicy(hourly=1), datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="hourly"):
        RetentionPolicy(hourly=-1)
    with pytest.raises(ValueError, match="max_age"):
        RetentionPolicy(max_age=timedelta(0))
