"""The agent on real loop-mounted ext4 filesystems, called through its real gRPC server over
127.0.0.1 with mutual TLS. No Cassandra: the freeze contract is about filesystems.

Whether a filesystem is frozen is observed the only way the kernel allows: a writer that creates
and fsyncs a file in it stalls until the thaw.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from ringsnap.api.v1 import agent_pb2, agent_pb2_grpc
from ringsnap.plugins.testing.pki import TestCA
from ringsnap.sandbox.agents import (
    BackgroundAgent,
    TestPki,
    agent_config,
    config_data,
    secure_channel,
    write_config,
)
from ringsnap.sandbox.loopfs import LoopFilesystem, loop_filesystem, unavailable_reason
from tests.support.write_probe import write_and_fsync

pytestmark = pytest.mark.integration

AGENT_BIN = Path(sys.executable).with_name("ringsnap-agent")
#: A thaw counts as "on time" if it happens within this much of the lease's end (scheduling on a
#: busy 2-core machine; the agent's own timer is exact to the millisecond).
SLACK = 0.75


@pytest.fixture(scope="module", autouse=True)
def _loop_devices() -> None:
    missing = unavailable_reason()
    if missing:
        pytest.skip(f"loop-mounted filesystems unavailable: {missing}")


@dataclass
class Node:
    """Two real filesystems laid out like a Cassandra node's data and commit-log LUNs."""

    data: LoopFilesystem
    commitlog: LoopFilesystem
    state: Path
    nodetool_log: Path
    nodetool: list[str]

    @property
    def data_dir(self) -> Path:
        return self.data.mount_point / "data"

    @property
    def commitlog_dir(self) -> Path:
        return self.commitlog.mount_point / "commitlog"

    def settings(self) -> dict[str, Any]:
        return {
            "data_directories": [self.data_dir],
            "commitlog_directory": self.commitlog_dir,
            "state_directory": self.state,
            "nodetool": self.nodetool,
        }

    def records(self) -> list[str]:
        return sorted(path.name for path in self.state.glob("freeze-*.json"))

    def records_once_removed(self, within: float = 10.0) -> list[str]:
        """The freeze records as soon as none is left, else those left after `within` seconds:
        the agent removes an operation's record just after its thaw, so writers unblocked by
        the thaw may look before the removal."""
        deadline = time.monotonic() + within
        while (left := self.records()) and time.monotonic() < deadline:
            time.sleep(0.02)
        return left


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TestPki:
    return TestPki.create(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    # A stand-in nodetool that only records that it was called: hostile requests must never reach it.
    nodetool_log = tmp_path / "nodetool.calls"
    script = tmp_path / "nodetool"
    script.write_text(f'#!/bin/sh\necho "$@" >> {nodetool_log}\nexit 1\n')
    script.chmod(0o755)
    with (
        loop_filesystem(tmp_path, "data") as data,
        loop_filesystem(tmp_path, "commitlog") as commitlog,
    ):
        (data.mount_point / "data").mkdir()
        (commitlog.mount_point / "commitlog").mkdir()
        yield Node(data, commitlog, tmp_path / "state", nodetool_log, [str(script)])


@pytest.fixture
def agent(node: Node, pki: TestPki) -> Iterator[BackgroundAgent]:
    with BackgroundAgent(agent_config(pki, **node.settings())) as running:
        yield running


def stub_for(channel: grpc.Channel) -> agent_pb2_grpc.AgentServiceStub:
    return agent_pb2_grpc.AgentServiceStub(channel)


@dataclass
class Writer:
    """Creates and fsyncs a file in `directory` in a thread; `done` is set when that returned."""

    directory: Path
    started: float = field(default_factory=time.monotonic)
    finished: float | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        threading.Thread(target=self._write, daemon=True).start()

    def _write(self) -> None:
        write_and_fsync(self.directory / f"probe-{time.monotonic_ns()}")
        self.finished = time.monotonic()
        self.done.set()

    def stalled(self, seconds: float = 0.5) -> bool:
        return not self.done.wait(seconds)


def lease(seconds: float) -> duration_pb2.Duration:
    value = duration_pb2.Duration()
    value.FromNanoseconds(int(seconds * 1e9))
    return value


def freeze(
    stub: agent_pb2_grpc.AgentServiceStub,
    operation: str,
    seconds: float,
    *,
    sync_first: bool = False,
) -> agent_pb2.FreezeFilesystemsResponse:
    request = agent_pb2.FreezeFilesystemsRequest(
        run_id=operation, lease=lease(seconds), sync_first=sync_first
    )
    response: agent_pb2.FreezeFilesystemsResponse = stub.FreezeFilesystems(request, timeout=30)
    return response


# -- freezing ---------------------------------------------------------------------------------------


def test_freeze_blocks_writes_until_thaw(node: Node, agent: BackgroundAgent, pki: TestPki) -> None:
    stub = stub_for(pki.channel(agent.address))
    response = freeze(stub, "op-block", 20, sync_first=True)
    assert sorted(fs.mount_point for fs in response.filesystems) == sorted(
        [str(node.data.mount_point), str(node.commitlog.mount_point)]
    )
    assert node.records() == ["freeze-op-block.json"]
    writers = [Writer(node.data_dir), Writer(node.commitlog_dir)]
    assert all(writer.stalled(0.5) for writer in writers), (
        "a write went through a frozen filesystem"
    )

    thawed = stub.ThawFilesystems(agent_pb2.ThawFilesystemsRequest(run_id="op-block"), timeout=30)
    assert all(writer.done.wait(10) for writer in writers), "thaw did not release the writers"
    assert {fs.mount_point for fs in thawed.filesystems if fs.was_frozen} == {
        str(node.data.mount_point),
        str(node.commitlog.mount_point),
    }
    assert all(fs.frozen_for.ToTimedelta().total_seconds() >= 0.5 for fs in thawed.filesystems)
    assert not thawed.lease_expired
    assert node.records() == []

    again = stub.ThawFilesystems(agent_pb2.ThawFilesystemsRequest(run_id="op-block"), timeout=30)
    assert [fs.was_frozen for fs in again.filesystems] == [False, False]


def test_client_that_disappears_is_thawed_by_the_lease_on_time(
    node: Node, agent: BackgroundAgent, pki: TestPki
) -> None:
    channel = pki.channel(agent.address)
    requested = time.monotonic()
    freeze(stub_for(channel), "op-vanish", 1.0)
    channel.close()  # the coordinator is gone
    writers = [Writer(node.data_dir), Writer(node.commitlog_dir)]
    assert all(writer.done.wait(1.0 + SLACK + 5) for writer in writers)
    for writer in writers:
        assert writer.finished is not None
        held = writer.finished - requested
        assert 1.0 - 0.1 <= held <= 1.0 + SLACK, f"thawed after {held:.3f} s for a 1 s lease"
    assert node.records_once_removed() == []
    result = stub_for(pki.channel(agent.address)).ThawFilesystems(
        agent_pb2.ThawFilesystemsRequest(run_id="op-vanish"), timeout=30
    )
    assert result.lease_expired and not any(fs.was_frozen for fs in result.filesystems)


def _scraped(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {
        sample.name + str(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_a_lease_that_runs_out_shows_in_the_agents_own_scrape(node: Node, pki: TestPki) -> None:
    """The agent's `[metrics]` listener, as Prometheus scrapes it: the expiry of a real freeze's
    lease, the renewal before it, the freeze and each filesystem's time frozen."""
    config = agent_config(pki, **node.settings())
    config = config.model_copy(
        update={
            "metrics": config.metrics.model_copy(update={"enabled": True, "listen": "127.0.0.1:0"})
        }
    )
    with BackgroundAgent(config) as agent:
        metrics = agent.server.metrics_server
        assert metrics is not None and metrics.host == "127.0.0.1"
        assert _scraped(metrics.port)["ringsnap_agent_lease_expirations_total[]"] == 0
        stub = stub_for(pki.channel(agent.address))
        freeze(stub, "op-metrics", 0.6)
        stub.RenewLease(
            agent_pb2.RenewLeaseRequest(run_id="op-metrics", lease=lease(0.6)), timeout=5
        )
        writer = Writer(node.data_dir)
        assert writer.done.wait(0.6 + SLACK + 5), "the lease did not thaw"
        scraped = _scraped(metrics.port)
    assert scraped["ringsnap_agent_lease_expirations_total[]"] == 1
    assert scraped["ringsnap_agent_lease_renewals_total[]"] == 1
    assert scraped["ringsnap_agent_freezes_total[('result', 'ok')]"] == 1
    assert scraped["ringsnap_agent_frozen_duration_seconds_count[]"] == 2
    assert scraped["ringsnap_agent_frozen_duration_seconds_sum[]"] >= 2 * 0.6
    assert scraped["ringsnap_agent_thaw_all_runs_total[]"] == 1  # at its start


def test_renewing_client_keeps_it_frozen_exactly_as_long_as_it_renews(
    node: Node, agent: BackgroundAgent, pki: TestPki
) -> None:
    stub = stub_for(pki.channel(agent.address))
    freeze(stub, "op-renew", 0.6)
    writer = Writer(node.commitlog_dir)
    renewed_until = time.monotonic() + 2.5
    last_renewal = time.monotonic()
    while time.monotonic() < renewed_until:
        time.sleep(0.2)
        stub.RenewLease(agent_pb2.RenewLeaseRequest(run_id="op-renew", lease=lease(0.6)), timeout=5)
        last_renewal = time.monotonic()
        assert not writer.done.is_set(), "thawed although the lease was renewed"
    assert writer.done.wait(0.6 + SLACK + 5)
    assert writer.finished is not None
    after = writer.finished - last_renewal
    assert 0.6 - 0.1 <= after <= 0.6 + SLACK, f"thawed {after:.3f} s after the last renewal"
    with pytest.raises(grpc.RpcError) as late:
        stub.RenewLease(agent_pb2.RenewLeaseRequest(run_id="op-renew", lease=lease(0.6)), timeout=5)
    assert late.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_second_operation_is_refused_while_frozen(
    node: Node, agent: BackgroundAgent, pki: TestPki
) -> None:
    stub = stub_for(pki.channel(agent.address))
    first = freeze(stub, "op-first", 10)
    assert freeze(stub, "op-first", 10).filesystems == first.filesystems  # idempotent
    with pytest.raises(grpc.RpcError) as refused:
        freeze(stub, "op-second", 10)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "op-first" in (refused.value.details() or "")
    stub.ThawFilesystems(agent_pb2.ThawFilesystemsRequest(run_id="op-first"), timeout=30)
    assert not Writer(node.data_dir).stalled(5)


# -- an agent killed while filesystems are frozen ----------------------------------------------------


def start_agent_process(config: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as output:
        return subprocess.Popen(
            [str(AGENT_BIN), "serve", "--config", str(config)], stdout=output, stderr=output
        )


def wait_serving(address: str, pki: TestPki, process: subprocess.Popen[bytes], log: Path) -> None:
    health = health_pb2_grpc.HealthStub(pki.channel(address))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"agent exited with {process.returncode}:\n{log.read_text()}")
        try:
            answer = health.Check(health_pb2.HealthCheckRequest(), timeout=1)
            if answer.status == health_pb2.HealthCheckResponse.SERVING:
                return
        except grpc.RpcError:
            pass
        time.sleep(0.1)
    pytest.fail(f"agent not serving after 30 s:\n{log.read_text()}")


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.mark.parametrize("recovery", ["thaw-all", "next-start"])
def test_agent_killed_while_frozen_is_thawed_by_thaw_all_or_next_start(
    node: Node, pki: TestPki, tmp_path: Path, recovery: str
) -> None:
    port = free_port()
    config = write_config(
        tmp_path / "agent.toml",
        config_data(pki, listen=f"127.0.0.1:{port}", **node.settings()),
    )
    log = tmp_path / "agent.log"
    address = f"127.0.0.1:{port}"
    process = start_agent_process(config, log)
    restarted: subprocess.Popen[bytes] | None = None
    try:
        wait_serving(address, pki, process, log)
        freeze(stub_for(pki.channel(address)), "op-killed", 30)
        process.send_signal(signal.SIGKILL)
        process.wait(10)
        writer = Writer(node.data_dir)
        assert writer.stalled(1.0), "the filesystem thawed without anyone asking"
        assert node.records() == ["freeze-op-killed.json"]

        if recovery == "thaw-all":
            result = subprocess.run(
                [str(AGENT_BIN), "thaw-all", "--config", str(config)],
                check=False,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert result.returncode == 0, result.stdout + result.stderr
            assert "thawed" in result.stdout
        else:
            restarted = start_agent_process(config, log)
            wait_serving(address, pki, restarted, log)
        assert writer.done.wait(10), "still frozen after recovery"
        assert node.records() == []
        assert "thawed" in log.read_text() or recovery == "thaw-all"
    finally:
        for running in (process, restarted):
            if running is not None and running.poll() is None:
                running.send_signal(signal.SIGTERM)
                running.wait(30)


def test_graceful_stop_thaws_what_it_froze(node: Node, pki: TestPki, tmp_path: Path) -> None:
    port = free_port()
    config = write_config(
        tmp_path / "agent.toml",
        config_data(pki, listen=f"127.0.0.1:{port}", **node.settings()),
    )
    log = tmp_path / "agent.log"
    process = start_agent_process(config, log)
    try:
        wait_serving(f"127.0.0.1:{port}", pki, process, log)
        freeze(stub_for(pki.channel(f"127.0.0.1:{port}")), "op-stop", 30)
        writer = Writer(node.commitlog_dir)
        assert writer.stalled(0.3)
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
        assert writer.done.wait(10)
        assert node.records() == []
    finally:
        if process.poll() is None:
            process.kill()


# -- mutual TLS --------------------------------------------------------------------------------------


def assert_nothing_frozen(node: Node) -> None:
    assert node.records() == []
    assert not Writer(node.data_dir).stalled(5)
    assert not Writer(node.commitlog_dir).stalled(5)


def test_client_without_certificate_is_refused(
    node: Node, agent: BackgroundAgent, pki: TestPki
) -> None:
    channel = secure_channel(agent.address, pki.ca.cert_pem, None)
    with pytest.raises(grpc.RpcError) as refused:
        freeze(stub_for(channel), "op-nocert", 10)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE  # the TLS handshake fails
    assert_nothing_frozen(node)


def test_certificate_from_another_ca_is_refused(
    node: Node, agent: BackgroundAgent, pki: TestPki
) -> None:
    stranger = TestCA.create("some other CA").issue("ringsnap-coordinator")  # right name, wrong CA
    channel = secure_channel(agent.address, pki.ca.cert_pem, stranger)
    with pytest.raises(grpc.RpcError) as refused:
        freeze(stub_for(channel), "op-otherca", 10)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert_nothing_frozen(node)


@pytest.mark.parametrize(
    "identity", [{"common_name": "intruder"}, {"common_name": None, "dns": ["intruder.example"]}]
)
def test_identity_not_on_the_allow_list_is_refused(
    node: Node, agent: BackgroundAgent, pki: TestPki, identity: dict[str, Any]
) -> None:
    client = pki.ca.issue(**identity)
    channel = pki.channel(agent.address, client)
    with pytest.raises(grpc.RpcError) as refused:
        freeze(stub_for(channel), "op-intruder", 10)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.RpcError) as health:
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert health.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert_nothing_frozen(node)


def test_certificate_without_any_identity_is_unauthenticated(
    node: Node, agent: BackgroundAgent, pki: TestPki
) -> None:
    anonymous = pki.ca.issue(None)  # our CA, but neither a subject name nor an alternative name
    with pytest.raises(grpc.RpcError) as refused:
        freeze(stub_for(pki.channel(agent.address, anonymous)), "op-anonymous", 10)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert_nothing_frozen(node)


def test_allowed_identity_in_a_subject_alternative_name(node: Node, pki: TestPki) -> None:
    config = agent_config(pki, allowed_clients=["spiffe://ringsnap/coordinator"], **node.settings())
    client = pki.ca.issue(None, uris=["spiffe://ringsnap/coordinator"])
    with BackgroundAgent(config) as agent:
        health = health_pb2_grpc.HealthStub(pki.channel(agent.address, client))
        answer = health.Check(
            health_pb2.HealthCheckRequest(service="ringsnap.api.v1.AgentService"), timeout=10
        )
        assert answer.status == health_pb2.HealthCheckResponse.SERVING


# -- hostile input -----------------------------------------------------------------------------------


def _hostile_calls(node: Node, tmp_path: Path) -> list[tuple[str, object]]:
    return [
        (
            "FreezeFilesystems",
            agent_pb2.FreezeFilesystemsRequest(run_id="op-h", mount_points=["/"]),
        ),
        (
            "FreezeFilesystems",
            agent_pb2.FreezeFilesystemsRequest(run_id="op-h", mount_points=[str(tmp_path)]),
        ),
        (
            "FreezeFilesystems",
            agent_pb2.FreezeFilesystemsRequest(run_id="op-h", mount_points=[str(node.data_dir)]),
        ),
        (
            "FreezeFilesystems",
            agent_pb2.FreezeFilesystemsRequest(
                run_id="op-h", mount_points=[f"{node.data.mount_point}/../data"]
            ),
        ),
        (
            "FreezeFilesystems",
            agent_pb2.FreezeFilesystemsRequest(run_id="op-h", mount_points=["relative/path"]),
        ),
        (
            "FreezeFilesystems",
            agent_pb2.FreezeFilesystemsRequest(run_id="op-h", lease=lease(3600)),
        ),
        (
            "FreezeFilesystems",
            agent_pb2.FreezeFilesystemsRequest(
                run_id="op-h", lease=duration_pb2.Duration(seconds=-5)
            ),
        ),
        (
            "FreezeFilesystems",
            agent_pb2.FreezeFilesystemsRequest(
                run_id="op-h", lease=duration_pb2.Duration(seconds=315576000000)
            ),
        ),
        (
            "FreezeFilesystems",
            agent_pb2.FreezeFilesystemsRequest(
                run_id="op-h", lease=duration_pb2.Duration(seconds=1, nanos=-5)
            ),
        ),
        ("FreezeFilesystems", agent_pb2.FreezeFilesystemsRequest(run_id="../../etc/passwd")),
        ("FreezeFilesystems", agent_pb2.FreezeFilesystemsRequest(run_id="")),
        ("RenewLease", agent_pb2.RenewLeaseRequest(run_id="op/../x", lease=lease(1))),
        ("ThawFilesystems", agent_pb2.ThawFilesystemsRequest(run_id="op\x00x")),
        ("CreateSnapshot", agent_pb2.CreateSnapshotRequest(tag="../../etc")),
        ("CreateSnapshot", agent_pb2.CreateSnapshotRequest(tag="snap/../../x")),
        ("CreateSnapshot", agent_pb2.CreateSnapshotRequest(tag="")),
        ("CreateSnapshot", agent_pb2.CreateSnapshotRequest(tag="ok", keyspaces=["ks; DROP"])),
        ("ClearSnapshot", agent_pb2.ClearSnapshotRequest(tag="..")),
        ("ClearSnapshot", agent_pb2.ClearSnapshotRequest(tag="-all")),
        ("FlushMemtables", agent_pb2.FlushMemtablesRequest(keyspace="../system")),
        ("FlushMemtables", agent_pb2.FlushMemtablesRequest(keyspace="ks", tables=["t-1"])),
        ("FlushMemtables", agent_pb2.FlushMemtablesRequest(tables=["orphan"])),
        ("FlushMemtables", agent_pb2.FlushMemtablesRequest(keyspace="k" * 49)),
        ("GetManifest", agent_pb2.GetManifestRequest(snapshot_tag="../../../")),
        ("GetManifest", agent_pb2.GetManifestRequest(keyspaces=["system/../../x"])),
        ("StartCassandra", agent_pb2.StartCassandraRequest(wait=duration_pb2.Duration(seconds=-1))),
    ]


def test_hostile_input_is_invalid_argument_and_changes_nothing(
    node: Node, agent: BackgroundAgent, pki: TestPki, tmp_path: Path
) -> None:
    stub = stub_for(pki.channel(agent.address))
    for method, request in _hostile_calls(node, tmp_path):
        with pytest.raises(grpc.RpcError) as refused:
            answer = getattr(stub, method)(request, timeout=30)
            if method == "GetManifest":
                list(answer)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (
            f"{method}({request}) gave {refused.value.code()}: {refused.value.details()}"
        )
        assert refused.value.details()
    assert not node.nodetool_log.exists(), "a hostile request reached nodetool"
    assert_nothing_frozen(node)
