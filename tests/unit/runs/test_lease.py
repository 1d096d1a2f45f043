"""Cluster leases: one run per cluster, the refusal naming the holder's kind and run."""

from __future__ import annotations

import pytest

from ringsnap.coordinator.api.control import ClusterStatus, running_run
from ringsnap.coordinator.api.messages import cluster_status
from ringsnap.coordinator.runs.lease import RESTORING, ClusterHeld, ClusterLeases, Lease, RunKind


def test_one_run_holds_a_cluster_and_a_second_is_refused_naming_it() -> None:
    leases = ClusterLeases()
    export = Lease("c1", RunKind.EXPORT, "rs-1", backup_id="rs-1")
    with leases.hold(export):
        assert leases.holder("c1") is export
        assert leases.holder("c2") is None
        with pytest.raises(
            ClusterHeld,
            match=r"cluster c1 is being exported \(backup rs-1\), since .*: table restore tr-1 did"
            " not start",
        ) as refused:
            leases.take(Lease("c1", RunKind.TABLE_RESTORE, "tr-1"))
        assert refused.value.holder is export
        assert refused.value.wanted.run_id == "tr-1"
        leases.take(Lease("c2", RunKind.DRILL, "d-1"))
    assert leases.holder("c1") is None
    with pytest.raises(RuntimeError, match="not held by"):
        leases.give_back(export)


def test_the_status_message_carries_each_kind_and_its_run_typed() -> None:
    def status(lease: Lease) -> tuple[str, str, str, str]:
        running = running_run(lease, "rs-1", None, "")
        message = cluster_status(ClusterStatus("c", None, None, running, ()))
        return (
            message.running_kind,
            message.running_run_id,
            message.running_trigger,
            message.running_backup_id,
        )

    assert status(Lease("c", RunKind.BACKUP, asked_by="cli:ann")) == (
        "backup",
        "",
        "cli:ann",
        "rs-1",
    )
    assert status(Lease("c", RunKind.RESTORE, "rr-1", asked_by="cli:bob")) == (
        "restore",
        "rr-1",
        "cli:bob",
        "rs-1",
    )
    assert status(Lease("c", RunKind.DRILL, "dr-1", schedule="nightly")) == (
        "drill",
        "dr-1",
        "nightly",
        "rs-1",
    )
    assert {RunKind.RESTORE, RunKind.TABLE_RESTORE} == RESTORING
