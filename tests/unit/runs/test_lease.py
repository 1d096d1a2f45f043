"""Cluster leases: one run per cluster, the refusal naming the holder's kind and run."""

from __future__ import annotations

import pytest

from ringsnap.coordinator.runs.lease import ClusterHeld, ClusterLeases, Lease


def test_one_run_holds_a_cluster_and_a_second_is_refused_naming_it() -> None:
    leases = ClusterLeases()
    export = Lease("c1", "export", "rs-1")
    with leases.hold(export):
        assert leases.holder("c1") is export
        assert leases.holder("c2") is None
        with pytest.raises(
            ClusterHeld, match=r"cluster c1 is held by export rs-1 .* table-restore"
        ):
            leases.take(Lease("c1", "table-restore", "tr-1"))
        leases.take(Lease("c2", "drill", "d-1"))
    assert leases.holder("c1") is None
    with pytest.raises(RuntimeError, match="not held by"):
        leases.give_back(export)
