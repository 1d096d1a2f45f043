"""Every CoordinatorService RPC (enumerated from the generated descriptor, so new RPCs are fuzzed
as they land) against the real coordinator server, authenticated with its token, with hostile
requests:

- the answer is OK or a precise refusal naming the field (see `oracle`), within the deadline;
- the coordinator stays up: its health service answers SERVING after every case;
- nothing changed: no catalog row written or deleted, no agent asked to flush, freeze, thaw or
  snapshot, no array call, no operation left running. No hostile request names a configured
  cluster or a recorded backup, so none may start, delete or restore anything.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from functools import partial

import grpc
import pytest

from ringsnap.api.v1 import coordinator_pb2, coordinator_pb2_grpc
from ringsnap.coordinator.api.servicer import CoordinatorServicer
from tests.fuzz.coordinator_rig import CoordinatorRig, State, running_coordinator
from tests.fuzz.oracle import Tally, fuzz_rpc, problems_with
from tests.fuzz.protofuzz import Rpc, call, rpcs

SERVICE = coordinator_pb2.DESCRIPTOR.services_by_name["CoordinatorService"]
RPCS = rpcs(SERVICE)
DEADLINE = 15.0
TALLY = Tally("CoordinatorService")


def implemented(name: str) -> bool:
    base = coordinator_pb2_grpc.CoordinatorServiceServicer
    return getattr(CoordinatorServicer, name) is not getattr(base, name)


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CoordinatorRig]:
    with running_coordinator(tmp_path_factory.mktemp("fuzz-coordinator")) as running:
        yield running
    TALLY.write()


def check_case(rig: CoordinatorRig, rpc: Rpc, payload: bytes, before: State | None = None) -> None:
    before = rig.state() if before is None else before
    answer = call(rig.channel, rpc, payload, timeout=DEADLINE)
    TALLY.count(rpc, answer)
    problems = problems_with(rpc, answer, implemented=implemented(rpc.name))
    after = rig.state()
    if after != before:
        problems.append(f"state changed (answer {answer.code.name}): {before} -> {after}")
    if not rig.healthy():
        problems.append("the coordinator's health check no longer answers SERVING")
    assert not problems, f"{rpc.name}: " + "; ".join(problems)


@pytest.mark.parametrize("rpc", RPCS, ids=str)
def test_a_hostile_request_is_refused_precisely_and_changes_nothing(
    rig: CoordinatorRig, rpc: Rpc
) -> None:
    fuzz_rpc(rpc, partial(check_case, rig, rpc), TALLY)


def test_every_rpc_of_the_service_is_fuzzed() -> None:
    assert {rpc.name for rpc in RPCS} == {method.name for method in SERVICE.methods}
    assert len(RPCS) >= 10


def test_a_negative_drill_list_limit_is_invalid_argument(rig: CoordinatorRig) -> None:
    """Regression: ListDrills passed a negative int32 limit to the catalog (INTERNAL)."""
    by_name = {rpc.name: rpc for rpc in RPCS}
    request = coordinator_pb2.ListRestoreDrillsRequest(limit=-1).SerializeToString()
    answer = call(rig.channel, by_name["ListDrills"], request, timeout=10)
    assert answer.code is grpc.StatusCode.INVALID_ARGUMENT
    assert answer.details.startswith("limit -1 is negative")


def test_the_oracle_catches_a_state_change(rig: CoordinatorRig) -> None:
    """The checks can fail: a valid request that deletes a recorded backup changes the catalog
    and is reported as a state change."""
    by_name = {rpc.name: rpc for rpc in RPCS}
    before = rig.state()
    delete = coordinator_pb2.DeleteBackupRequest(backup_id="rs-seed-failed")
    answer = call(rig.channel, by_name["DeleteBackup"], delete.SerializeToString(), timeout=10)
    assert answer.code is grpc.StatusCode.OK
    deadline = time.monotonic() + 10
    while rig.state() == before and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(AssertionError, match="state changed"):
        check_case(rig, by_name["GetStatus"], b"", before)
