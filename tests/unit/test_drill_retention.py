"""Retention never removes the newest proven backup (proven by a restore or a restore drill): when
every newer backup turns out unrestorable, it is the one known to work."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from ringsnap.coordinator.model import BackupState, BackupSummary, QuiesceMode, Verification
from ringsnap.coordinator.retention import (
    BEYOND_BUCKETS,
    NEWEST_COMPLETE,
    NEWEST_PROVEN,
    RetentionPolicy,
    apply_policy,
)

NOW = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)


def _backup(index: int, **fields: object) -> BackupSummary:
    started = NOW - timedelta(hours=index)
    summary = BackupSummary(
        id=f"rs-{index:03d}",
        cluster="c1",
        state=BackupState.COMPLETE,
        quiesce_mode=QuiesceMode.FREEZE,
        trigger="schedule:hourly",
        policy="p",
        started_at=started,
        finished_at=started + timedelta(seconds=30),
    )
    return replace(summary, **fields)  # type: ignore[arg-type]


def test_the_newest_proven_backup_survives_a_policy_that_would_remove_it() -> None:
    history = [_backup(i) for i in range(10)]
    history[7] = _backup(7, verification=Verification.PROVEN, verified_by="dr-1")
    history[9] = _backup(9, verification=Verification.PROVEN, verified_by="dr-0")
    plan = apply_policy(history, RetentionPolicy(hourly=3), NOW)
    assert plan.decision("rs-007").keep
    assert plan.decision("rs-007").reasons == (NEWEST_PROVEN,)
    # Only the newest proven one: an older proven backup goes as the policy says.
    assert plan.decision("rs-009").reasons == (BEYOND_BUCKETS,)
    assert not plan.decision("rs-009").keep
    assert plan.decision("rs-000").reasons[0] == NEWEST_COMPLETE
    assert {b.id for b in plan.keep} == {"rs-000", "rs-001", "rs-002", "rs-007"}


def test_a_proven_backup_whose_snapshots_are_lost_is_not_the_newest_proven() -> None:
    history = [_backup(i) for i in range(6)]
    history[3] = _backup(
        3,
        verification=Verification.PROVEN,
        lost_reason="restore rr-1 reverted to an older backup",
        lost_at=NOW - timedelta(days=30),
    )
    history[5] = _backup(5, state=BackupState.PARTIAL, verification=Verification.PROVEN)
    plan = apply_policy(history, RetentionPolicy(hourly=1), NOW)
    assert not plan.decision("rs-003").keep
    assert plan.decision("rs-005").reasons == (NEWEST_PROVEN,)


def test_a_failed_drill_does_not_protect_a_backup() -> None:
    history = [_backup(i) for i in range(4)]
    history[3] = _backup(3, verification=Verification.FAILED, verified_by="dr-2")
    plan = apply_policy(history, RetentionPolicy(hourly=1), NOW)
    assert not plan.decision("rs-003").keep
