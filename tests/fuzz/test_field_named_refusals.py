"""Regressions from the fuzzing: refusals that named no field of the request, and a refusal of the
node's layout that was INVALID_ARGUMENT instead of FAILED_PRECONDITION."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from ringsnap import names
from ringsnap.api.v1 import agent_pb2
from ringsnap.errors import ValidationError
from tests.fuzz.agent_rig import AgentRig, running_agent
from tests.fuzz.protofuzz import call, rpcs

RPCS = {rpc.name: rpc for rpc in rpcs(agent_pb2.DESCRIPTOR.services_by_name["AgentService"])}


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentRig]:
    with running_agent(tmp_path_factory.mktemp("named")) as running:
        yield running


def _refusal(rig: AgentRig, name: str, request: object) -> tuple[grpc.StatusCode, str]:
    payload = request.SerializeToString()  # type: ignore[attr-defined]
    answer = call(rig.channel, RPCS[name], payload, timeout=10)
    assert rig.recorder.take()[0] == [], "refused before acting"
    return answer.code, answer.details


def test_a_bad_tag_or_id_names_its_field() -> None:
    with pytest.raises(ValidationError, match=r"invalid name '\.\./x' \(restore_id\)"):
        names.snapshot_tag("../x", what="restore_id")
    with pytest.raises(ValidationError, match=r"\(a snapshot tag or backup id\)"):
        names.backup_id("")


def test_freezing_root_names_the_mount_points(rig: AgentRig) -> None:
    request = agent_pb2.FreezeFilesystemsRequest(run_id="op-1", mount_points=["/"])
    code, details = _refusal(rig, "FreezeFilesystems", request)
    assert code is grpc.StatusCode.INVALID_ARGUMENT
    assert "refusing to freeze '/'" in details and "mount point" in details


def test_releasing_root_names_the_mount_point(rig: AgentRig) -> None:
    request = agent_pb2.ReleaseVolumesRequest(run_id="op-1", mount_points=["/"])
    code, details = _refusal(rig, "ReleaseVolumes", request)
    assert code is grpc.StatusCode.INVALID_ARGUMENT
    assert "refusing to release mount point '/'" in details


def test_data_on_the_root_filesystem_is_a_failed_precondition_not_a_bad_request(
    rig: AgentRig,
) -> None:
    # The rig's data directory is on the test host's root filesystem: releasing "everything" is
    # refused because of the node's layout, whatever the request says.
    request = agent_pb2.ReleaseVolumesRequest(run_id="op-1")
    code, details = _refusal(rig, "ReleaseVolumes", request)
    assert code is grpc.StatusCode.FAILED_PRECONDITION, details
    assert "never releases" in details and str(Path("/")) in details


def test_a_bad_drill_run_id_names_run_id(rig: AgentRig) -> None:
    """Regression: GetDrill/StopDrill refused a bad drill id naming no field of the request."""
    for name in ("GetDrill", "StopDrill"):
        code, details = _refusal(rig, name, agent_pb2.DrillRequest(run_id="../x"))
        assert code is grpc.StatusCode.INVALID_ARGUMENT
        assert "(run_id)" in details, details
