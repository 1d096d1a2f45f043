"""Drills through the coordinator's API: StartDrill runs the real session and workflow (on fakes of
the drill host, the production agents and the array) as an operation that holds the cluster,
GetDrill and ListDrills read the catalog's records, and refusals carry their reasons."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import pytest

from ringsnap.api.v1 import coordinator_pb2 as pb
from ringsnap.api.v1 import types_pb2
from ringsnap.coordinator.api.drill_messages import record_of
from ringsnap.coordinator.drill import daemon
from ringsnap.coordinator.drill.cleanups import DrillHosts
from ringsnap.coordinator.drill.model import DrillState, DrillStep, DrillVerdict
from ringsnap.coordinator.drill.plan import DrillSettings
from ringsnap.coordinator.model import Verification
from ringsnap.coordinator.runs.lease import Lease, RunKind
from ringsnap.coordinator.runs.resources import Resource, ResourceType
from ringsnap.plugins.types import Volume
from tests.support.coordinator_rpc import reason_of, rpc_error
from tests.support.drill_fakes import DrillArray, FakeFacts, FakeHost, session_opener

from .conftest import CLUSTERS, Harness

RECENT = datetime.now(UTC) - timedelta(hours=2)


class Fakes:
    def __init__(self) -> None:
        self.events: list[str] = []
        self.host = FakeHost(self.events)
        self.array = DrillArray(self.events)
        self.facts = {n: FakeFacts(n) for n in CLUSTERS["prod"]}


@pytest.fixture
def fakes(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> Fakes:
    harness.seed_backup("rs-1", RECENT)
    made = Fakes()

    settings = DrillSettings(max_parallel=2, poll_seconds=0.0)
    opener = session_opener(made.host, made.facts, made.array, settings)
    monkeypatch.setattr(daemon, "open_drill_session", opener)
    return made


def _start(harness: Harness, **fields: Any) -> types_pb2.Operation:
    request = pb.StartRestoreDrillRequest(cluster="prod", requested_by="alice", **fields)
    return harness.stub().StartDrill(request, timeout=30)


def test_a_ring_drill_through_the_api_is_proven_recorded_and_held_the_cluster(
    harness: Harness, fakes: Fakes
) -> None:
    held: list[Lease | None] = []
    original = fakes.host.get_drill
    watching = threading.Event()

    async def get_drill(purpose_id: str) -> Any:
        held.append(harness.coordinator.leases.holder("prod"))
        # The drill goes on once the test's watch is attached (at most 10 s): no node's progress
        # line goes out before anyone listens.
        for _ in range(1000):
            if watching.is_set():
                break
            await asyncio.sleep(0.01)
        return await original(purpose_id)

    fakes.host.get_drill = get_drill  # type: ignore[method-assign]
    operation = _start(harness, ring=True, drill_id="dr-20261124-090000-00aa", backup_id="rs-1")
    assert operation.kind == types_pb2.OPERATION_KIND_DRILL
    stream = harness.stub().WatchOperation(
        pb.WatchOperationRequest(operation_id=operation.operation_id), timeout=30
    )
    first = next(stream)
    watching.set()
    updates = [first, *stream]
    assert updates[-1].state == types_pb2.OPERATION_STATE_SUCCEEDED, updates[-1]
    assert updates[-1].message == "drill dr-20261124-090000-00aa: proven"
    assert any(u.message.startswith("n2: ") for u in updates)
    # The drill held the cluster, as a backup does, and gave it back.
    assert held and all(
        h is not None and h.kind is RunKind.DRILL and h.run_id == "dr-20261124-090000-00aa"
        for h in held
    )
    assert harness.coordinator.leases.holder("prod") is None
    found = harness.stub().GetDrill(
        pb.GetRestoreDrillRequest(drill_id="dr-20261124-090000-00aa"), timeout=10
    )
    record = record_of(found)
    assert record.state is DrillState.PROVEN and record.requested_by == "alice"
    assert [n.verdict for n in record.nodes] == [DrillVerdict.PROVEN] * 3
    assert all(n.step is DrillStep.TORN_DOWN for n in record.nodes)
    assert all(c.deleted for c in record.clones) and fakes.array.clones == {}
    stored = harness.catalog.get_drill("dr-20261124-090000-00aa")
    assert record.nodes[0].proof == stored.nodes[0].proof
    assert harness.catalog.get_backup("rs-1").verification is Verification.PROVEN
    listed = harness.stub().ListDrills(pb.ListRestoreDrillsRequest(cluster="prod"), timeout=10)
    assert [d.drill_id for d in listed.drills] == ["dr-20261124-090000-00aa"]


def test_a_drill_refused_by_its_plan_says_why_and_gives_the_cluster_back(
    harness: Harness, fakes: Fakes
) -> None:
    fakes.array.can_clone = False
    error = rpc_error(harness.stub().StartDrill, pb.StartRestoreDrillRequest(cluster="prod"))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert reason_of(error) == "DRILL_REFUSED"
    assert "array a1: its driver (ontap) cannot clone" in (error.details() or "")
    assert harness.coordinator.leases.holder("prod") is None
    assert harness.catalog.list_drills() == [] and fakes.events == []


def test_a_busy_cluster_refuses_a_drill(harness: Harness, fakes: Fakes) -> None:
    with harness.coordinator.leases.hold(Lease("prod", RunKind.BACKUP, asked_by="schedule:yearly")):
        error = rpc_error(harness.stub().StartDrill, pb.StartRestoreDrillRequest(cluster="prod"))
    assert error.code() == grpc.StatusCode.ABORTED
    assert reason_of(error) == "CLUSTER_BUSY"
    assert fakes.events == []


@pytest.mark.parametrize(
    ("request_fields", "code", "reason"),
    [
        ({"cluster": "prod; rm"}, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT"),
        (
            {"cluster": "prod", "nodes": ["n1"], "ring": True},
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_ARGUMENT",
        ),
        (
            {"cluster": "prod", "drill_id": "../x"},
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_ARGUMENT",
        ),
        ({"cluster": "nowhere"}, grpc.StatusCode.NOT_FOUND, "UNKNOWN_CLUSTER"),
    ],
)
def test_bad_drill_requests_are_refused_by_name(
    harness: Harness,
    fakes: Fakes,
    request_fields: dict[str, Any],
    code: grpc.StatusCode,
    reason: str,
) -> None:
    error = rpc_error(harness.stub().StartDrill, pb.StartRestoreDrillRequest(**request_fields))
    assert (error.code(), reason_of(error)) == (code, reason)


def test_an_unknown_drill_is_not_found(harness: Harness) -> None:
    error = rpc_error(
        harness.stub().GetDrill, pb.GetRestoreDrillRequest(drill_id="dr-20261124-090000-ffff")
    )
    assert (error.code(), reason_of(error)) == (grpc.StatusCode.NOT_FOUND, "DRILL_NOT_FOUND")
    error = rpc_error(harness.stub().GetDrill, pb.GetRestoreDrillRequest(drill_id="rs-1"))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_the_daemon_retries_a_drill_clone_unmounting_it_first(
    harness: Harness, fakes: Fakes, monkeypatch: pytest.MonkeyPatch
) -> None:
    purpose = "dr-20261124-090000-00aa-n1"
    clone = Volume("n1-data_dr_20261124_090000_00aa_n1", "c-n1-data")
    # Left in the ledger by a drill whose coordinator was killed (named: the array answered).
    entry = harness.catalog.add_resource(
        Resource(
            type=ResourceType.CLONE,
            cluster="prod",
            run_id="dr-20261124-090000-00aa",
            run_kind="drill",
            reason="drill test",
            array="a1",
            name_hint="dr_20261124_090000_00aa_n1",
            mount_purpose=purpose,
            drill_host=True,
        )
    )
    harness.catalog.resource_made(entry.id, clone.name, clone.id)
    deleted: list[Volume] = []

    async def delete_clone(volume: Volume) -> None:
        fakes.events.append(f"array:delete:{volume.name}")
        deleted.append(volume)

    monkeypatch.setattr(harness.array, "delete_clone", delete_clone)
    monkeypatch.setattr(
        harness.coordinator, "drill_hosts", DrillHosts(lambda: {"prod": fakes.host})
    )
    # The drill host does not answer: the clone stays, never deleted under a mount.
    fakes.host.fail["unmount"] = ConnectionError("drill host unreachable")
    assert harness.call(harness.coordinator.run_pending_cleanups()) == 1
    (pending,) = harness.catalog.resources()
    assert pending.attempts == 1 and "drill host unreachable" in pending.last_error
    assert deleted == []
    # It answers again: stop the drill, unmount, then delete the clone (by name and id).
    fakes.host.fail.clear()
    assert harness.call(harness.coordinator.run_pending_cleanups()) == 0
    assert deleted == [clone] and harness.catalog.resources() == []
    assert fakes.events[-3:] == [
        f"host:stop:{purpose}",
        f"host:unmount:{purpose}",
        f"array:delete:{clone.name}",
    ]
