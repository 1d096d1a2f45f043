"""The cluster lease's refusals name what holds the cluster by its kind: a drill, a scheduled
drill, an export, a restore or a purge is not "being backed up". An export does not hold its
cluster against backups (issue 20: a long upload must not make the next backups skip)."""

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


def test_an_export_lets_backups_run_and_is_named_by_what_it_excludes() -> None:
    leases = ClusterLeases()
    export = Lease("c", RunKind.EXPORT, run_id="rs-1", backup_id="rs-1")
    leases.take(export)
    backup = Lease("c", RunKind.BACKUP, asked_by="schedule:hourly")
    leases.take(backup)  # beside the export
    assert leases.holder("c") is backup and leases.exporting("c") is export
    leases.give_back(backup)
    for kind in (RunKind.DRILL, RunKind.RESTORE, RunKind.PURGE, RunKind.EXPORT):
        with pytest.raises(ClusterHeld) as refused:
            leases.take(Lease("c", kind, run_id="x-1", backup_id="rs-2"))
        assert "cluster c is being exported (backup rs-1)" in str(refused.value)
        assert refused.value.holder is export
    leases.give_back(export)
    assert leases.holder("c") is None


def test_an_export_waits_for_a_restore_but_not_for_a_backup() -> None:
    leases = ClusterLeases()
    restore = Lease("c", RunKind.RESTORE, run_id="rr-1")
    leases.take(restore)
    with pytest.raises(ClusterHeld, match="being restored by restore rr-1"):
        leases.take(Lease("c", RunKind.EXPORT, run_id="rs-1", backup_id="rs-1"))
    leases.give_back(restore)
    leases.take(Lease("c", RunKind.BACKUP, asked_by="cli:ann"))
    leases.take(Lease("c", RunKind.EXPORT, run_id="rs-1", backup_id="rs-1"))
