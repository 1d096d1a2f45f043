"""A restore from S3 run by the daemon (`ringsnap restore --from s3` while it holds the catalog):
the plan asks no array, the run downloads on every node before anything stops, and the record
read through the API says what was done. The harness's real coordinator and server,
its restore sessions real sessions on fakes of the agents (`restore_rig`) and of their S3 calls."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ringsnap.api.v1 import coordinator_pb2 as pb
from ringsnap.api.v1 import types_pb2
from ringsnap.coordinator.restore.s3_ports import S3Room
from tests.support.coordinator_rpc import watch_to_end

from .conftest import Harness
from .restore_rig import S3Rig, install_s3, start_restore


@pytest.fixture
def rig(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> S3Rig:
    return install_s3(harness, monkeypatch)


def test_the_daemon_restores_from_s3_downloading_everywhere_before_any_stop(
    harness: Harness, rig: S3Rig
) -> None:
    stub = harness.stub()
    plan = stub.PlanRestore(
        pb.PlanRestoreRequest(backup_id="rs-1", mode=pb.RESTORE_MODE_S3), timeout=30
    )
    assert plan.mode == pb.RESTORE_MODE_S3 and not plan.arrays and not plan.refusals
    assert all(not n.volumes for n in plan.nodes)

    started = start_restore(harness, restore_id=plan.restore_id, mode=pb.RESTORE_MODE_S3)
    updates = watch_to_end(harness, started.operation_id)

    assert updates[-1].state == types_pb2.OPERATION_STATE_SUCCEEDED, updates[-1]
    downloads = [e for e in rig.events if e.endswith(":download")]
    assert sorted(downloads) == ["n1:download", "n2:download", "n3:download"]
    assert max(rig.events.index(e) for e in downloads) < min(
        i for i, e in enumerate(rig.events) if e.startswith("stop ")
    )
    record = stub.GetRestore(pb.GetRestoreRequest(restore_id=plan.restore_id), timeout=10)
    assert record.mode == pb.RESTORE_MODE_S3 and record.state == pb.RESTORE_STATE_PROVEN
    assert all(n.step == pb.RESTORE_STEP_VERIFIED for n in record.nodes)
    assert {t.phase for t in record.timings} >= {"download from S3", "install from S3"}
    assert not any(e.startswith(("revert", "release", "attach")) for e in rig.events)


def test_the_daemons_plan_checks_every_nodes_copy_in_the_bucket_and_its_room(
    harness: Harness, rig: S3Rig
) -> None:
    """A node whose manifest object is gone and a node without room: the plan through the API is
    refused naming the node, the key or filesystem and the numbers; nothing is downloaded."""
    rig.s3["n2"].check = replace(rig.s3["n2"].check, manifest_found=False)
    short = S3Room("/var/lib/cassandra/data", 3 * 2**30, 2**30, "2049")
    rig.s3["n3"].check = replace(rig.s3["n3"].check, rooms=(short,))
    stub = harness.stub()

    plan = stub.PlanRestore(
        pb.PlanRestoreRequest(backup_id="rs-1", mode=pb.RESTORE_MODE_S3), timeout=30
    )

    assert sorted(e for e in rig.events if e.endswith(":check")) == [
        "n1:check",
        "n2:check",
        "n3:check",
    ]
    refusals = list(plan.refusals)
    assert len(refusals) == 2, refusals
    assert any(
        "node n2" in r and "backups/rs-1/n2.jsonl.gz" in r and "ringsnap export rs-1" in r
        for r in refusals
    )
    assert any(
        "node n3" in r
        and "/var/lib/cassandra/data" in r
        and f"{2**30} bytes free" in r
        and f"needs {3 * 2**30}" in r
        for r in refusals
    )
    assert not any(e.endswith(":download") for e in rig.events)
