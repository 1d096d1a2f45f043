"""The shared simulator infrastructure: LUN pool on real reflinks, HTTP(S) base, faults, CLI."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from ringsnap.plugins.simulators.faults import Fault
from ringsnap.plugins.simulators.lunpool import (
    LunExistsError,
    LunInUseError,
    LunNotFoundError,
    LunPool,
    LunPoolError,
    loop_devices_of,
    supports_reflink,
    temporary_xfs_pool,
)
from ringsnap.plugins.simulators.server import (
    HttpError,
    Request,
    Response,
    Router,
    SimulatorApp,
    SimulatorServer,
    serving,
)
from ringsnap.plugins.simulators.tls import make_test_ca
from ringsnap.plugins.testing import mounts


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[LunPool]:
    missing = mounts.missing_preconditions()
    if missing:
        pytest.skip("missing precondition: " + "; ".join(missing))
    with temporary_xfs_pool(tmp_path, size_bytes=1 << 30) as made:
        yield made


def test_snapshot_revert_and_clone_keep_exact_bytes(pool: LunPool) -> None:
    lun = pool.create_lun("vol1", 8 << 20)
    with open(lun, "r+b") as handle:
        handle.write(b"A" * 4096)
    pool.snapshot("vol1", "s1")
    with open(lun, "r+b") as handle:
        handle.write(b"B" * 4096)
    inode = lun.stat().st_ino
    pool.revert("vol1", "s1")
    assert lun.read_bytes()[:4096] == b"A" * 4096
    assert lun.stat().st_ino == inode, "revert must keep the LUN's inode (same file)"
    clone = pool.clone("vol1", "s1", "vol1_clone")
    assert clone.read_bytes()[:4096] == b"A" * 4096
    assert pool.list_luns() == ["vol1", "vol1_clone"]
    assert pool.list_snapshots("vol1") == ["s1"]
    with pytest.raises(LunExistsError):
        pool.snapshot("vol1", "s1")
    assert pool.delete_snapshot("vol1", "s1")
    assert not pool.delete_snapshot("vol1", "s1")


def test_group_snapshot_is_all_or_nothing(pool: LunPool) -> None:
    pool.create_lun("vol1", 1 << 20)
    with pytest.raises(LunNotFoundError):
        pool.snapshot_group([("vol1", "g1"), ("absent", "g1")])
    assert pool.snapshot_count() == 0


def test_revert_refuses_a_lun_held_by_a_loop_device(pool: LunPool) -> None:
    lun = pool.create_lun("vol1", 8 << 20)
    pool.snapshot("vol1", "s1")
    device = subprocess.run(
        ["losetup", "--find", "--show", str(lun)], check=True, capture_output=True, text=True
    ).stdout.strip()
    try:
        assert loop_devices_of(lun) == [device]
        with pytest.raises(LunInUseError) as caught:
            pool.revert("vol1", "s1")
        assert device in str(caught.value)
        with pytest.raises(LunInUseError):
            pool.delete_lun("vol1")
    finally:
        subprocess.run(["losetup", "-d", device], check=True)
    pool.revert("vol1", "s1")


def test_names_must_be_file_names(pool: LunPool) -> None:
    for bad in ("../escape", ".hidden", "a/b", ""):
        with pytest.raises(LunPoolError):
            pool.create_lun(bad, 1024)


def test_a_pool_without_reflinks_is_refused_with_the_fix(tmp_path: Path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("missing precondition: /dev/shm (a tmpfs without reflinks)")
    scratch = shm / f"ringsnap-test-{os.getpid()}"
    scratch.mkdir()
    try:
        assert not supports_reflink(scratch)
        plain = LunPool(scratch)
        plain.create_lun("vol1", 1024)
        with pytest.raises(LunPoolError) as caught:
            plain.snapshot("vol1", "s1")
        assert "mkfs.xfs -m reflink=1" in str(caught.value)
    finally:
        subprocess.run(["rm", "-rf", str(scratch)], check=True)


class EchoApp(SimulatorApp):
    vendor = "echo"

    def __init__(self) -> None:
        super().__init__()
        self.router = Router()
        self.router.add("GET", "/api/things/{id}", self._thing)
        self.router.add("POST", "/api/things", lambda request: Response(201, request.json()))
        self.handled = 0

    def _thing(self, request: Request) -> Response:
        self.handled += 1
        if request.params["id"] == "missing":
            raise HttpError(404, "no such thing", code="E404")
        return Response(200, {"id": request.params["id"], "q": request.arg("q")})

    def handle(self, request: Request) -> Response:
        return self.router.dispatch(request)

    def error_response(self, error: HttpError) -> Response:
        return Response(error.status, {"oops": error.message, "code": error.code})


def test_routing_and_the_vendor_error_envelope() -> None:
    with serving(EchoApp()) as server:
        assert requests.get(f"{server.url}/api/things/7?q=x", timeout=5).json() == {
            "id": "7",
            "q": "x",
        }
        missing = requests.get(f"{server.url}/api/things/missing", timeout=5)
        assert (missing.status_code, missing.json()) == (
            404,
            {"oops": "no such thing", "code": "E404"},
        )
        assert requests.delete(f"{server.url}/api/things/7", timeout=5).status_code == 405
        assert requests.get(f"{server.url}/nowhere", timeout=5).status_code == 404


def test_faults_from_python_and_over_http() -> None:
    app = EchoApp()
    with serving(app) as server:
        armed = server.faults.add(
            Fault(
                "status", path=r"^/api/things/", status=503, count=2, headers={"Retry-After": "3"}
            )
        )
        for _ in range(2):
            answer = requests.get(f"{server.url}/api/things/1", timeout=5)
            assert answer.status_code == 503
            assert answer.headers["Retry-After"] == "3"
        assert requests.get(f"{server.url}/api/things/1", timeout=5).status_code == 200
        assert server.faults.fired(armed.id) == 2

        posted = requests.post(
            f"{server.url}/_sim/faults",
            json=[{"kind": "reset", "method": "GET", "path": "/things/2"}],
            timeout=5,
        )
        assert posted.status_code == 201
        listed = requests.get(f"{server.url}/_sim/faults", timeout=5).json()["faults"]
        assert [fault["kind"] for fault in listed] == ["reset"]
        with pytest.raises(requests.ConnectionError):
            requests.get(f"{server.url}/api/things/2", timeout=5)
        bad = requests.post(
            f"{server.url}/_sim/faults", json={"kind": "status", "count": 0}, timeout=5
        )
        assert bad.status_code == 400
        requests.post(
            f"{server.url}/_sim/faults", json={"kind": "status", "path": "/things"}, timeout=5
        )
        assert requests.delete(f"{server.url}/_sim/faults", timeout=5).json() == {"faults": []}
        assert requests.get(f"{server.url}/api/things/3", timeout=5).status_code == 200


def test_hang_then_proceed_does_the_work_after_the_client_gave_up() -> None:
    app = EchoApp()
    with serving(app) as server:
        server.faults.add(Fault("hang", path="/things/", seconds=0.6, then="proceed"))
        with pytest.raises(requests.exceptions.ReadTimeout):
            requests.get(f"{server.url}/api/things/1", timeout=0.2)
        server.faults.add(Fault("hang", path="/things/", seconds=0.3, then="drop"))
        with pytest.raises(requests.ConnectionError):
            requests.get(f"{server.url}/api/things/2", timeout=5)
        deadline = 50
        while app.handled < 1 and deadline:
            deadline -= 1
            requests.get(f"{server.url}/_sim/state", timeout=5)
            threading.Event().wait(0.05)
        assert app.handled == 1  # the hung request finished; the dropped one never ran


def test_stopping_wakes_hung_requests() -> None:
    server = SimulatorServer(EchoApp()).start()
    server.faults.add(Fault("hang", path="/things/", seconds=30))
    with pytest.raises(requests.exceptions.ReadTimeout):
        requests.get(f"{server.url}/api/things/1", timeout=0.2)
    server.stop()  # returns promptly although a request is still hanging


def test_tls_with_the_test_ca(tmp_path: Path) -> None:
    certificates = make_test_ca(tmp_path / "ca")
    stranger = make_test_ca(tmp_path / "other", name="someone else")
    with serving(EchoApp(), tls=certificates.server_tls) as server:
        assert server.url.startswith("https://127.0.0.1:")
        ok = requests.get(f"{server.url}/api/things/1", verify=str(certificates.ca_file), timeout=5)
        assert ok.status_code == 200
        localhost = server.url.replace("127.0.0.1", "localhost")
        assert requests.get(
            f"{localhost}/api/things/1", verify=str(certificates.ca_file), timeout=5
        ).ok
        with pytest.raises(requests.exceptions.SSLError):
            requests.get(f"{server.url}/api/things/1", verify=str(stranger.ca_file), timeout=5)


def test_simulators_listen_on_loopback_only() -> None:
    with pytest.raises(ValueError):
        SimulatorServer(EchoApp(), host="0.0.0.0")


def test_command_line_runs_an_ontap_simulator(pool: LunPool, tmp_path: Path) -> None:
    password = tmp_path / "password"
    password.write_text("cli-secret\n")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ringsnap.plugins.simulators",
            "ontap",
            "--pool",
            str(pool.root),
            "--lun",
            "cli_vol:16M",
            "--password-file",
            str(password),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert process.stdout is not None
        banner = process.stdout.readline()
        assert banner.startswith("ontap simulator on http://127.0.0.1:"), banner
        url = banner.split()[3]
        volumes = requests.get(
            f"{url}/api/storage/volumes", auth=("admin", "cli-secret"), timeout=10
        ).json()
        assert [record["name"] for record in volumes["records"]] == ["cli_vol"]
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=20) == 0
