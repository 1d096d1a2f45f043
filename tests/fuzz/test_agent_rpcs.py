"""Every AgentService RPC (enumerated from the generated descriptor, so new RPCs are fuzzed as they
land) against the real agent server over mTLS, with hostile requests:

- the answer is OK or a precise refusal naming the field (see `oracle`), within the deadline;
- the agent stays up: its health service answers SERVING after every case;
- a refused request acted on nothing: no freeze ioctl, no command (nodetool, stop, start, mount,
  hooks), no file of the node created, changed or deleted;
- an accepted request acted only as its RPC is for (a flush flushes, a stop stops) — and never by
  freezing (nothing in the rig may be frozen) or by touching the node's files.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

import grpc
import pytest

from ringsnap.agent.server import AgentServicer
from ringsnap.api.v1 import agent_pb2, agent_pb2_grpc
from tests.fuzz.agent_rig import AgentRig, running_agent, tree
from tests.fuzz.oracle import Tally, fuzz_rpc, problems_with
from tests.fuzz.protofuzz import Rpc, call, rpcs

SERVICE = agent_pb2.DESCRIPTOR.services_by_name["AgentService"]
RPCS = rpcs(SERVICE)
#: What an accepted request may make the agent do: the RPC's own purpose, nothing else. Names in
#: these requests are validated (keyspaces, tables, tags), so any valid one may be acted on.
PURPOSE: dict[str, frozenset[str]] = {
    "FlushMemtables": frozenset({"nodetool flush"}),
    "CreateSnapshot": frozenset({"nodetool snapshot"}),
    "ClearSnapshot": frozenset({"nodetool clearsnapshot"}),
    "StopCassandra": frozenset({"nodetool drain", "stop"}),
    "StartCassandra": frozenset({"start"}),
}
DEADLINE = 15.0
TALLY = Tally("AgentService")


def implemented(name: str) -> bool:
    return getattr(AgentServicer, name) is not getattr(agent_pb2_grpc.AgentServiceServicer, name)


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentRig]:
    with running_agent(tmp_path_factory.mktemp("fuzz-agent")) as running:
        yield running
    TALLY.write()


def check_case(
    rig: AgentRig, rpc: Rpc, payload: bytes, before: dict[str, tuple[int, int]] | None = None
) -> None:
    before = tree(rig.node_root) if before is None else before
    answer = call(rig.channel, rpc, payload, timeout=DEADLINE)
    TALLY.count(rpc, answer)
    acted, probes = rig.recorder.take()
    problems = problems_with(rpc, answer, implemented=implemented(rpc.name))
    if answer.code is grpc.StatusCode.UNAVAILABLE and (acted or probes):
        problems = []  # the rig refused to run the command: Cassandra "does not answer"
    refused = answer.code is not grpc.StatusCode.OK and not acted
    stray = [line for line in acted if line not in PURPOSE.get(rpc.name, frozenset())]
    if stray:
        problems.append(f"acted on a hostile request: {stray} (answer {answer.code.name})")
    after = tree(rig.node_root)
    if after != before:
        changed = sorted(set(after.items()) ^ set(before.items()))[:5]
        problems.append(
            f"the node's files changed ({'refused' if refused else 'accepted'}): {changed}"
        )
    if not rig.healthy():
        problems.append("the agent's health check no longer answers SERVING")
    assert not problems, f"{rpc.name}: " + "; ".join(problems)


@pytest.mark.parametrize("rpc", RPCS, ids=str)
def test_a_hostile_request_is_refused_precisely_and_changes_nothing(
    rig: AgentRig, rpc: Rpc
) -> None:
    fuzz_rpc(rpc, partial(check_case, rig, rpc), TALLY)


def test_every_rpc_of_the_service_is_fuzzed() -> None:
    assert {rpc.name for rpc in RPCS} == {method.name for method in SERVICE.methods}
    assert len(RPCS) >= 15


def test_the_oracle_catches_an_action(rig: AgentRig) -> None:
    """The checks can fail: a valid stop request reaches the (recorded) stop command; the same
    action recorded during another RPC's case fails that case."""
    by_name = {rpc.name: rpc for rpc in RPCS}
    stop = agent_pb2.StopCassandraRequest().SerializeToString()
    answer = call(rig.channel, by_name["StopCassandra"], stop, timeout=10)
    assert answer.code is grpc.StatusCode.UNAVAILABLE
    assert rig.recorder.take()[0] == ["stop"]
    rig.recorder.calls.append("stop")  # as if GetVolumeState had stopped Cassandra
    with pytest.raises(AssertionError, match=r"acted on a hostile request: \['stop'\]"):
        check_case(rig, by_name["GetVolumeState"], b"")
    before = tree(rig.node_root)
    (rig.node_root / "node" / "data" / "planted").write_text("x")  # as if the call had written it
    try:
        with pytest.raises(AssertionError, match="the node's files changed"):
            check_case(rig, by_name["GetVolumeState"], b"", before)
    finally:
        (rig.node_root / "node" / "data" / "planted").unlink()
