"""The cluster lease's refusals name what holds the cluster by its kind: a drill, a scheduled
drill, an export, a restore or a purge is not "being backed up"."""

from __future__ import annotations

import pytest

from ringsnap.coordinator.runs.lease import ClusterHeld, ClusterLeases, Lease, RunKind


@pytest.mark.parametrize(
    ("holder", "said"),
    [
        (Lease("c", RunKind.DRILL, run_id="dr-1"), "is being drilled by drill dr-1"),
        (
            Lease("c", RunKind.DRILL, asked_by="schedule:drill-nightly", schedule="nightly"),
            "is being drilled (scheduled by nightly)",
        ),
        (
            Lease("c", RunKind.EXPORT, run_id="rs-1", backup_id="rs-1"),
            "is being exported (backup rs-1)",
        ),
        (Lease("c", RunKind.RESTORE, run_id="rr-1"), "is being restored by restore rr-1"),
        (
            Lease("c", RunKind.TABLE_RESTORE, run_id="tr-1"),
            "is being restored by table restore tr-1",
        ),
        (Lease("c", RunKind.PURGE, run_id="c"), "is having its copies on S3 purged"),
    ],
)
def test_a_backup_refused_while_something_else_holds_the_cluster_names_it(
    holder: Lease, said: str
) -> None:
    leases = ClusterLeases()
    leases.take(holder)
    with pytest.raises(ClusterHeld) as refused:
        leases.take(Lease("c", RunKind.BACKUP, asked_by="cli:ann"))
    assert f"cluster c {said}" in str(refused.value)
    assert "skipped the backup asked by cli:ann" in str(refused.value)
    assert refused.value.holder is holder


def test_a_drill_refused_while_a_backup_runs_says_it_did_not_start() -> None:
    leases = ClusterLeases()
    leases.take(Lease("c", RunKind.BACKUP, asked_by="schedule:hourly"))
    with pytest.raises(ClusterHeld) as refused:
        leases.take(Lease("c", RunKind.DRILL, run_id="dr-2"))
    message = str(refused.value)
    assert "is being backed up (by schedule:hourly)" in message
    assert "drill dr-2 did not start and nothing was changed" in message


def test_two_backups_keep_the_schedulers_own_words() -> None:
    leases = ClusterLeases()
    leases.take(Lease("c", RunKind.BACKUP, asked_by="schedule:hourly"))
    with pytest.raises(ClusterHeld, match=r"already being backed up \(by schedule:hourly") as busy:
        leases.take(Lease("c", RunKind.BACKUP, asked_by="cli:ann"))
    assert busy.value.exit_code == 75
    assert "skipped the backup asked by cli:ann" in str(busy.value)
