"""The per-cluster guard's refusals name what holds the cluster: a drill, a scheduled drill, an
export or a restore is not "being backed up"."""

from __future__ import annotations

import pytest

from ringsnap.coordinator.restore.daemon import ClusterHeldError, RestoreAwareGuard
from ringsnap.coordinator.scheduler import BackupRequest, ClusterBusyError


@pytest.mark.parametrize(
    ("holder", "said"),
    [
        ("drill:dr-1", "is being drilled by drill dr-1"),
        ("schedule:drill-nightly", "is being drilled (scheduled by nightly)"),
        ("export:rs-1", "is being exported (backup rs-1)"),
        ("restore:rr-1", "is being restored by restore rr-1"),
    ],
)
def test_a_backup_refused_while_something_else_holds_the_cluster_names_it(
    holder: str, said: str
) -> None:
    guard = RestoreAwareGuard()
    guard.acquire(BackupRequest("c", trigger=holder))
    with pytest.raises(ClusterHeldError) as refused:
        guard.acquire(BackupRequest("c", trigger="cli:ann"))
    assert f"cluster c {said}" in str(refused.value)
    assert "skipped the backup asked by cli:ann" in str(refused.value)


def test_a_drill_refused_while_a_backup_runs_says_it_did_not_start() -> None:
    guard = RestoreAwareGuard()
    guard.acquire(BackupRequest("c", trigger="schedule:hourly"))
    with pytest.raises(ClusterHeldError) as refused:
        guard.acquire(BackupRequest("c", trigger="drill:dr-2"))
    message = str(refused.value)
    assert "is being backed up (by schedule:hourly)" in message
    assert "drill dr-2 did not start and nothing was changed" in message


def test_two_backups_keep_the_schedulers_own_words() -> None:
    guard = RestoreAwareGuard()
    guard.acquire(BackupRequest("c", trigger="schedule:hourly"))
    with pytest.raises(ClusterBusyError, match=r"already being backed up \(by schedule:hourly"):
        guard.acquire(BackupRequest("c", trigger="cli:ann"))
