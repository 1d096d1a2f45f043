"""Operators on other hosts: the coordinator API over mutual TLS beside the loopback listener, an
allow-list of client identities with the roles viewer and operator, refusals that name the identity
and the missing role, every mutating call logged with its caller, and `ringsnap` reaching it through
$RINGSNAP_REMOTE. Real gRPC servers and real certificates from a test CA."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest
import typer
from typer.testing import CliRunner, Result

from ringsnap.api.v1 import coordinator_pb2 as pb
from ringsnap.api.v1 import coordinator_pb2_grpc
from ringsnap.coordinator.api import access
from ringsnap.coordinator.api.access import Role
from ringsnap.coordinator.api.listeners import CoordinatorServer, RemoteListener
from ringsnap.coordinator.cli import commands
from ringsnap.coordinator.cli.client import ADDRESS_ENV, REMOTE_ENV, ExitCode
from ringsnap.plugins.testing.pki import TestCA

from .conftest import Harness
from .restore_rig import install

CLIENTS = {"alice@oncall": Role.OPERATOR, "bob@oncall": Role.VIEWER}


@dataclass
class Remote:
    address: str
    ca: TestCA
    dir: Path

    def client_file(self, name: str, ca: TestCA | None = None) -> Path:
        cert = (ca or self.ca).issue(name).write(self.dir, name)
        path = self.dir / f"{name}.toml"
        path.write_text(
            f'address = "{self.address}"\n'
            f'cert_file = "{cert.cert}"\n'
            f'key_file = "{cert.key}"\n'
            f'ca_file = "{self.dir / "ca.crt"}"\n'
            'server_name = "coordinator.test"\n'
        )
        return path

    def stub(
        self, name: str, ca: TestCA | None = None
    ) -> coordinator_pb2_grpc.CoordinatorServiceStub:
        issued = (ca or self.ca).issue(name)
        credentials = grpc.ssl_channel_credentials(
            root_certificates=self.ca.cert_pem,
            private_key=issued.key_pem,
            certificate_chain=issued.cert_pem,
        )
        channel = grpc.secure_channel(
            self.address, credentials, [("grpc.ssl_target_name_override", "coordinator.test")]
        )
        return coordinator_pb2_grpc.CoordinatorServiceStub(channel)


@pytest.fixture
def remote(harness: Harness) -> Iterator[Remote]:
    ca = TestCA.create()
    directory = harness.tmp / "remote"
    directory.mkdir()
    ca.write_ca(directory / "ca.crt")
    server_cert = ca.issue("coordinator.test", dns=["coordinator.test"])
    listener = RemoteListener(
        listen="127.0.0.1:0",
        cert=server_cert.cert_pem,
        key=server_cert.key_pem,
        ca=ca.cert_pem,
        clients=CLIENTS,
    )
    server = CoordinatorServer(
        harness.coordinator, "127.0.0.1:0", harness.token, str(harness.token_file), listener
    )
    harness.call(server.start())
    try:
        yield Remote(f"127.0.0.1:{server.remote_port}", ca, directory)
    finally:
        harness.call(server.stop(0))


def _refusal(call: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        assert callable(call)
        call()
    return caught.value


def test_a_viewer_reads_and_plans_but_cannot_change_anything(remote: Remote) -> None:
    bob = remote.stub("bob@oncall")
    assert bob.ListBackups(pb.ListBackupsRequest(cluster="prod"), timeout=10) is not None
    assert bob.GetStatus(pb.GetStatusRequest(), timeout=10) is not None
    bob.PlanRetention(pb.PlanRetentionRequest(cluster="prod", policy="daily"), timeout=10)

    for call in (
        lambda: bob.StartBackup(pb.StartBackupRequest(cluster="prod"), timeout=10),
        lambda: bob.DeleteBackup(pb.DeleteBackupRequest(backup_id="rs-x"), timeout=10),
        lambda: bob.PlanRetention(
            pb.PlanRetentionRequest(cluster="prod", policy="daily", apply=True), timeout=10
        ),
    ):
        error = _refusal(call)
        assert error.code() is grpc.StatusCode.PERMISSION_DENIED
        assert "bob@oncall has the role viewer" in (error.details() or "")
        assert "needs operator" in (error.details() or "")


def test_an_operator_changes_things_and_each_change_is_logged_with_its_caller(
    remote: Remote, harness: Harness, coordinator_log: Path
) -> None:
    alice = remote.stub("alice@oncall")
    operation = alice.StartBackup(pb.StartBackupRequest(cluster="prod", trigger="t"), timeout=10)
    assert operation.operation_id
    calls = [line for line in coordinator_log.read_text().splitlines() if "api call" in line]
    assert len(calls) == 1
    assert "method=StartBackup" in calls[0] and "caller=alice@oncall" in calls[0]
    # Reads are not logged as changes.
    alice.ListBackups(pb.ListBackupsRequest(cluster="prod"), timeout=10)
    after = [line for line in coordinator_log.read_text().splitlines() if "api call" in line]
    assert after == calls


def test_unlisted_identities_and_foreign_certificates_are_refused(remote: Remote) -> None:
    error = _refusal(
        lambda: remote.stub("mallory@elsewhere").ListBackups(pb.ListBackupsRequest(), timeout=10)
    )
    assert error.code() is grpc.StatusCode.PERMISSION_DENIED
    assert "mallory@elsewhere is not allowed" in (error.details() or "")

    # A listed name in a certificate from another CA never gets past the handshake.
    other = TestCA.create("another CA")
    error = _refusal(
        lambda: remote.stub("alice@oncall", other).ListBackups(pb.ListBackupsRequest(), timeout=10)
    )
    assert error.code() is grpc.StatusCode.UNAVAILABLE


def test_the_method_roles_default_to_operator_for_anything_not_named_as_a_read() -> None:
    assert access.required_role("/x.S/ListBackups", None) is Role.VIEWER
    assert access.required_role("/x.S/PlanRestore", None) is Role.VIEWER
    assert access.required_role("/grpc.health.v1.Health/Check", None) is Role.VIEWER
    assert access.required_role("/x.S/StartDrill", None) is Role.OPERATOR
    assert access.required_role("/x.S/SomethingNew", None) is Role.OPERATOR
    assert access.required_role("/x.S/PlanRetention", pb.PlanRetentionRequest(apply=True)) is (
        Role.OPERATOR
    )


# -- the CLI from a bastion ------------------------------------------------------------------------


@pytest.fixture
def app() -> typer.Typer:
    root = typer.Typer(pretty_exceptions_enable=False)

    @root.callback()
    def _root() -> None:
        """ringsnap (test root)."""

    commands.register(root)
    return root


def _run(app: typer.Typer, client_file: Path, *args: str) -> Result:
    env = {ADDRESS_ENV: "", REMOTE_ENV: str(client_file), "RINGSNAP_CONFIG": ""}
    return CliRunner().invoke(app, list(args), env=env, catch_exceptions=False)


def test_the_cli_reaches_the_remote_listener_with_the_operators_certificate(
    app: typer.Typer, remote: Remote
) -> None:
    viewer = remote.client_file("bob@oncall")
    listed = _run(app, viewer, "list", "--output", "json")
    assert listed.exit_code == 0, listed.output

    refused = _run(app, viewer, "backup", "prod", "--output", "json")
    assert refused.exit_code == ExitCode.USAGE, refused.output
    error = json.loads(refused.stdout)["error"]
    assert "bob@oncall has the role viewer; StartBackup needs operator" in error["message"]

    operator = remote.client_file("alice@oncall")
    started = _run(app, operator, "backup", "prod", "--output", "json")
    assert started.exit_code == 0, started.output


def test_a_broken_client_file_is_a_usage_error_naming_the_file_and_key(
    app: typer.Typer, tmp_path: Path
) -> None:
    bad = tmp_path / "remote.toml"
    bad.write_text('address = "no-port"\ncert_file = "/nonexistent.crt"\n')
    result = _run(app, bad, "list")
    assert result.exit_code == ExitCode.USAGE
    assert str(bad) in " ".join(result.output.split())


def test_changes_through_the_loopback_listener_are_logged_as_local(
    harness: Harness, coordinator_log: Path
) -> None:
    harness.stub().StartBackup(pb.StartBackupRequest(cluster="prod", trigger="t"), timeout=10)
    calls = [line for line in coordinator_log.read_text().splitlines() if "api call" in line]
    assert len(calls) == 1 and "caller='local (API token)'" in calls[0], calls


def test_a_remote_restore_records_the_certificate_identity_not_the_claimed_name(
    harness: Harness, remote: Remote, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness.seed_backup("rs-1", datetime.now(UTC) - timedelta(hours=2))
    install(harness, monkeypatch)
    bob, alice = remote.stub("bob@oncall"), remote.stub("alice@oncall")
    plan = bob.PlanRestore(pb.PlanRestoreRequest(backup_id="rs-1"), timeout=30)
    request = pb.StartRestoreRequest(
        backup_id="rs-1", confirm_cluster="prod", restore_id=plan.restore_id, requested_by="root"
    )
    error = _refusal(lambda: bob.StartRestore(request, timeout=30))
    assert "bob@oncall has the role viewer; StartRestore needs operator" in (error.details() or "")

    started = alice.StartRestore(request, timeout=30)
    for _ in alice.WatchOperation(
        pb.WatchOperationRequest(operation_id=started.operation_id), timeout=60
    ):
        pass
    record = alice.GetRestore(pb.GetRestoreRequest(restore_id=plan.restore_id), timeout=10)
    assert record.state == pb.RESTORE_STATE_PROVEN
    assert record.requested_by == "alice@oncall (remote)"
