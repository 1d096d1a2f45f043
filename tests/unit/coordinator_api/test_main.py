"""`ringsnap-coordinator` as a process: check-config, and serve under a fake systemd (sd_notify
socket, watchdog), reached by the real `ringsnap` CLI, stopped by SIGTERM."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ringsnap.coordinator.main import main
from ringsnap.plugins.testing.pki import TestCA

KEY_MARKER = "PRIVATE KEY"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def write_config(tmp: Path, *, listen: str, metrics: str = "", extra: str = "") -> Path:
    ca = TestCA.create()
    ca_file = ca.write_ca(tmp / "tls" / "ca.crt")
    client = ca.issue("ringsnap-coordinator").write(tmp / "tls", "coordinator")
    path = tmp / "coordinator.toml"
    path.write_text(
        f"""
[coordinator]
listen = "{listen}"
catalog = "{tmp}/state/catalog.db"
metrics_listen = "{metrics}"

[tls]
cert_file = "{client.cert}"
key_file = "{client.key}"
ca_file = "{ca_file}"

[[clusters]]
name = "prod"
contact_points = ["127.0.0.1"]

[[clusters.nodes]]
name = "n1"
agent = "127.0.0.1:{free_port()}"
volumes = [{{ array = "a1", volume = "rsvg/n1data", role = "data+commitlog" }}]

[arrays.a1]
driver = "lvm"
volume_groups = ["rsvg"]

[retention.daily]
daily = 7

[[schedules]]
name = "nightly"
cluster = "prod"
cron = "0 3 1 1 *"
policy = "daily"
{extra}
"""
    )
    return path


@pytest.fixture(autouse=True)
def own_logging() -> Iterator[None]:
    """`main()` configures structlog and the root logger for its process, onto the stream pytest
    captures for this test only: put them back for the tests after this one."""
    saved = structlog.get_config()
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    structlog.configure(**saved)
    root.handlers[:] = handlers
    root.setLevel(level)


# -- check-config ----------------------------------------------------------------------------------


def test_check_config_prints_the_redacted_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path, listen="127.0.0.1:7444")
    assert main(["check-config", "--config", str(config)]) == 0
    captured = capsys.readouterr()
    document = json.loads(captured.out)
    assert document["tls"]["key_file"] == "**********"
    assert KEY_MARKER not in captured.out
    assert document["clusters"][0]["nodes"][0]["name"] == "n1"
    assert "valid (1 clusters, 1 nodes, 1 arrays, 1 schedules, 1 retention policies)" in (
        captured.err
    )


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        (
            '[[schedules]]\nname = "x"\ncluster = "nope"\ncron = "0 * * * *"\npolicy = "daily"\n',
            "schedules.1.cluster",
        ),
        ('[arrays.a2]\ndriver = "lvm"\nvolume_group = "typo"\n', "arrays.a2"),
    ],
)
def test_check_config_names_the_key_at_fault(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: str, key: str
) -> None:
    config = write_config(tmp_path, listen="127.0.0.1:7444", extra=extra)
    assert main(["check-config", "--config", str(config)]) == 78
    assert key in capsys.readouterr().err


def test_check_config_refuses_a_key_that_is_not_the_certificates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path, listen="127.0.0.1:7444")
    stranger = TestCA.create().issue("someone-else").write(tmp_path / "other", "stranger")
    (tmp_path / "tls" / "coordinator.key").write_bytes(stranger.key.read_bytes())
    assert main(["check-config", "--config", str(config)]) == 78
    err = capsys.readouterr().err
    assert "tls.cert_file" in err and "the private key does not belong to the certificate" in err
    assert "renew it soon" not in err  # an error stops before warnings


def test_a_non_loopback_listen_address_is_a_config_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path, listen="0.0.0.0:7444")
    assert main(["check-config", "--config", str(config)]) == 78
    assert main(["serve", "--config", str(config), "--log-format", "console"]) == 78
    err = capsys.readouterr().err
    assert "coordinator.listen" in err and "not a loopback address" in err
    assert not (tmp_path / "state" / "catalog.db").exists(), "refused before opening anything"


# -- serve -----------------------------------------------------------------------------------------


class Notifications:
    """The datagram socket systemd would listen on for sd_notify, read as systemd does: at once
    (an unread socket fills up and blocks the sender)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.received: list[str] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while not self._closed.is_set():
            try:
                message = self.sock.recv(4096).decode()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self.received.append(message)

    def seen(self, assignment: str) -> bool:
        with self._lock:
            return any(assignment in message.split("\n") for message in self.received)

    def wait_for(self, assignment: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.seen(assignment):
            if time.monotonic() > deadline:
                raise AssertionError(f"no {assignment} within {timeout} s; got {self.received}")
            time.sleep(0.05)

    def close(self) -> None:
        self._closed.set()
        self._reader.join(5)
        self.sock.close()


@pytest.fixture
def notifications(tmp_path: Path) -> Iterator[Notifications]:
    listener = Notifications(tmp_path / "notify")
    yield listener
    listener.close()


def spawn(config: Path, tmp: Path, env: dict[str, str], name: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "ringsnap.coordinator.main", "serve", "--config", str(config)],
        env={**os.environ, **env},
        stdout=(tmp / f"{name}.out").open("wb"),
        stderr=(tmp / f"{name}.err").open("wb"),
    )


def test_serve_notifies_systemd_serves_cli_and_metrics_and_stops_on_sigterm(
    tmp_path: Path, notifications: Notifications
) -> None:
    port, metrics_port = free_port(), free_port()
    config = write_config(tmp_path, listen=f"127.0.0.1:{port}", metrics=f"127.0.0.1:{metrics_port}")
    env = {"NOTIFY_SOCKET": str(notifications.path), "WATCHDOG_USEC": "400000"}
    process = spawn(config, tmp_path, env, "coordinator")
    try:
        notifications.wait_for("READY=1")
        notifications.wait_for("WATCHDOG=1")
        token = tmp_path / "state" / "api-token"
        assert token.stat().st_mode & 0o777 == 0o640

        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            answer = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=10
            )
        assert answer.status == health_pb2.HealthCheckResponse.SERVING

        cli = subprocess.run(
            [
                sys.executable,
                "-m",
                "ringsnap.coordinator.cli.entry",
                "status",
                "--config",
                str(config),
                "--output",
                "json",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert cli.returncode == 0, cli.stderr
        status = json.loads(cli.stdout)
        assert [c["cluster"] for c in status["clusters"]] == ["prod"]
        assert status["clusters"][0]["next_runs"][0]["schedule"] == "nightly"

        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
            exposition = r.read().decode()
        assert 'ringsnap_backups_total{cluster="prod",result="complete"} 0.0' in exposition
        assert "ringsnap_build_info" in exposition

        second = spawn(config, tmp_path, {}, "second")
        assert second.wait(60) == 75, "one coordinator per catalog"
        assert "in use by another coordinator" in (tmp_path / "second.err").read_text()

        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
        notifications.wait_for("STOPPING=1")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert not token.exists(), "the token goes with the coordinator"
    lines = [
        json.loads(line)
        for line in (tmp_path / "coordinator.err").read_text().splitlines()
        if line.startswith("{")
    ]
    events = [line["event"] for line in lines]
    assert "coordinator ready" in events and "coordinator stopped" in events
    assert all("timestamp" in line and "level" in line for line in lines)
    assert KEY_MARKER not in (tmp_path / "coordinator.err").read_text()

    cli = subprocess.run(
        [sys.executable, "-m", "ringsnap.coordinator.cli.entry", "status", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert cli.returncode == 69
    assert "systemctl start ringsnap-coordinator" in " ".join(cli.stderr.split())
