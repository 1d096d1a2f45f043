"""The sandbox's background processes: records (pid + start time), finding, stopping."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ringsnap.sandbox import processes
from ringsnap.sandbox.errors import SandboxError
from ringsnap.sandbox.processes import ServiceProcess, ServicesState

IGNORES_SIGTERM = (
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "time.sleep(120)\n"
)


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test started; killed and reaped whatever happens."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for child in started:
        if child.poll() is None:
            child.kill()
        child.wait(10)


def _child(
    children: list[subprocess.Popen[bytes]], *argv: str, ready: bool = False
) -> subprocess.Popen[bytes]:
    child = subprocess.Popen(list(argv), stdout=subprocess.PIPE if ready else None)
    children.append(child)
    if ready:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == b"ready"
    return child


def _record(child: subprocess.Popen[bytes], kind: str = "agent", name: str = "") -> ServiceProcess:
    start_time = processes.process_start_time(child.pid)
    assert start_time is not None
    return ServiceProcess(name or f"{kind}-{child.pid}", kind, child.pid, start_time, ("x",))


# -- /proc/<pid>/stat ----------------------------------------------------------------------------


def test_parse_stat_reads_past_a_command_name_with_spaces_and_parentheses() -> None:
    fields = " ".join(str(n) for n in range(4, 30))  # field 4 (ppid) onwards: field 22 is "22"
    assert processes.parse_stat(f"4242 (a) b (c) S {fields}") == ("S", 22)
    assert processes.parse_stat(f"7 (ringsnap-agent) Z {fields}") == ("Z", 22)


def test_start_time_of_this_process_is_stable_and_of_a_missing_pid_none() -> None:
    mine = processes.process_start_time(os.getpid())
    assert mine is not None and mine == processes.process_start_time(os.getpid())
    assert processes.process_start_time(2**22 + 1) is None  # above pid_max's ceiling


def test_is_running_needs_the_same_start_time(children: list[subprocess.Popen[bytes]]) -> None:
    child = _child(children, "sleep", "60")
    record = _record(child)
    assert processes.is_running(record)
    # The same pid with another start time is another process (the pid was reused).
    reused = ServiceProcess(record.name, record.kind, record.pid, record.start_time + 1, ())
    assert not processes.is_running(reused)
    child.kill()
    time.sleep(0.2)
    # Killed but not reaped yet: a zombie does not run.
    assert not processes.is_running(record)
    child.wait()
    assert not processes.is_running(record)


# -- records -------------------------------------------------------------------------------------


def test_state_round_trips_through_the_file(tmp_path: Path) -> None:
    path = tmp_path / "services.json"
    record = ServiceProcess(
        "agent-node1", "agent", 123, 456, ("a", "b c"), tmp_path / "a.log", "127.0.3.1:7443"
    )
    processes.save_state(path, ServicesState([record], {"array": "ontap", "config": "/x.toml"}))
    loaded = processes.load_state(path)
    assert loaded.processes == [record]
    assert loaded.details == {"array": "ontap", "config": "/x.toml"}
    assert [p.name for p in path.parent.iterdir()] == ["services.json"]  # no temporary left


def test_absent_records_are_none_and_unreadable_ones_an_error(tmp_path: Path) -> None:
    assert processes.load_state(tmp_path / "none.json").processes == []
    bad = tmp_path / "bad.json"
    for text in ("{not json", '{"processes": [{"name": "x"}]}', '{"processes": 3}', "[]"):
        bad.write_text(text)
        with pytest.raises(SandboxError, match="cannot read the sandbox's process records"):
            processes.load_state(bad)
    bad.write_text('{"processes": [{"name": "x", "kind": "shell", "pid": 1, "start_time": 1}]}')
    with pytest.raises(SandboxError, match="unknown kind"):
        processes.load_state(bad)


# -- finding unrecorded processes ----------------------------------------------------------------


def _fake_proc(tmp_path: Path, entries: dict[int, tuple[list[str], str]]) -> Path:
    proc = tmp_path / "proc"
    fields = " ".join(["1"] * 18) + " 777 " + " ".join(["0"] * 10)  # fields 4-21, 22 = 777
    for pid, (argv, state) in entries.items():
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
        (proc / str(pid) / "stat").write_text(f"{pid} (python3) {state} {fields}\n")
    (proc / "self").mkdir()
    return proc


def test_finds_the_services_of_this_instance_only(tmp_path: Path) -> None:
    mine = tmp_path / "play" / "services"
    other = tmp_path / "play2" / "services"
    py = "/venv/bin/python"
    proc = _fake_proc(
        tmp_path,
        {
            10: (
                [py, "/venv/bin/ringsnap-agent", "serve", "--config", f"{mine}/agent-node1.toml"],
                "S",
            ),
            11: (
                [
                    py,
                    "-m",
                    "ringsnap.coordinator.main",
                    "serve",
                    "--config",
                    f"{mine}/coordinator.toml",
                ],
                "S",
            ),
            12: (
                [
                    py,
                    "-m",
                    "ringsnap.plugins.simulators",
                    "ontap",
                    "--pool",
                    "/p",
                    "--tls-dir",
                    f"{mine}/simulator/tls",
                ],
                "R",
            ),
            # another instance's agent
            20: (
                [py, "/venv/bin/ringsnap-agent", "serve", "--config", f"{other}/agent-node1.toml"],
                "S",
            ),
            # an operator's `ringsnap list --config <mine>/coordinator.toml`: not a service
            21: ([py, "/venv/bin/ringsnap", "list", "--config", f"{mine}/coordinator.toml"], "S"),
            # a directory whose name merely starts like ours
            22: (
                [py, "/venv/bin/ringsnap-agent", "serve", "--config", f"{mine}-old/agent.toml"],
                "S",
            ),
            # an exited agent nobody reaped yet
            23: (
                [py, "/venv/bin/ringsnap-agent", "serve", "--config", f"{mine}/agent-node2.toml"],
                "Z",
            ),
            24: ([], "S"),  # a kernel thread
        },
    )
    found = processes.find_service_processes(mine, proc)
    assert sorted((p.pid, p.kind, p.start_time) for p in found) == [
        (10, "agent", 777),
        (11, "coordinator", 777),
        (12, "simulator", 777),
    ]


@pytest.mark.parametrize(
    ("argv", "kind"),
    [
        (["/v/bin/ringsnap-coordinator", "serve", "--config", "c"], "coordinator"),
        (["python", "-m", "ringsnap.agent.main", "serve", "--config", "c"], "agent"),
        (["python", "-m", "ringsnap.plugins.simulators", "eseries"], "simulator"),
        (["/usr/bin/prometheus", "--config.file", "/x/services/prometheus.yml"], "prometheus"),
        (["/usr/bin/promtool", "check", "rules"], None),
        (["/v/bin/ringsnap-agent", "check", "--config", "c"], None),
        (["/v/bin/ringsnap", "status"], None),
        (["vim", "serve"], None),
    ],
)
def test_kind_of(argv: list[str], kind: str | None) -> None:
    assert processes.kind_of(argv) == kind


# -- starting and stopping -----------------------------------------------------------------------


def test_spawn_detaches_and_logs(tmp_path: Path, children: list[subprocess.Popen[bytes]]) -> None:
    record, process = processes.spawn(
        "agent-node1",
        "agent",
        [sys.executable, "-c", "import time; print('hello', flush=True); time.sleep(60)"],
        tmp_path / "logs" / "agent-node1.log",
        cwd=tmp_path,
        address="127.0.0.1:1",
    )
    children.append(process)
    assert record.pid == process.pid and processes.is_running(record)
    assert os.getsid(process.pid) == process.pid  # its own session: the caller's Ctrl-C misses it
    deadline = time.monotonic() + 10
    while "hello" not in processes.log_tail(record.log) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes.log_tail(record.log) == "hello"


def test_stop_terminates_then_kills_coordinator_first(
    children: list[subprocess.Popen[bytes]],
) -> None:
    simulator = _record(_child(children, "sleep", "60"), "simulator")
    stubborn = _record(_child(children, sys.executable, "-c", IGNORES_SIGTERM, ready=True))
    coordinator = _record(_child(children, "sleep", "60"), "coordinator")
    sent: list[tuple[int, int]] = []

    def kill(pid: int, signum: int) -> None:
        sent.append((pid, signum))
        os.kill(pid, signum)

    stopped = processes.stop_processes(
        [simulator, stubborn, coordinator], grace={"agent": 0.5}, kill=kill
    )
    assert [r.pid for r in stopped] == [coordinator.pid, stubborn.pid, simulator.pid]
    assert sent == [
        (coordinator.pid, signal.SIGTERM),
        (stubborn.pid, signal.SIGTERM),
        (stubborn.pid, signal.SIGKILL),
        (simulator.pid, signal.SIGTERM),
    ]
    assert not any(processes.is_running(r) for r in (simulator, stubborn, coordinator))


def test_stop_leaves_a_reused_pid_and_gone_processes_alone(
    children: list[subprocess.Popen[bytes]],
) -> None:
    bystander = _child(children, "sleep", "60")
    record = _record(bystander)
    reused = ServiceProcess("agent-node1", "agent", record.pid, record.start_time - 1, ())
    gone = ServiceProcess("agent-node2", "agent", 2**22 + 1, 5, ())
    sent: list[tuple[int, int]] = []
    stopped = processes.stop_processes([reused, gone], kill=lambda p, s: sent.append((p, s)))
    assert stopped == [] and sent == []
    assert bystander.poll() is None


def test_a_process_outliving_sigkill_is_named(
    monkeypatch: pytest.MonkeyPatch, children: list[subprocess.Popen[bytes]]
) -> None:
    record = _record(_child(children, "sleep", "60"), name="agent-node3")
    monkeypatch.setattr(processes, "KILL_WAIT_SECONDS", 0.3)
    with pytest.raises(SandboxError, match=rf"could not stop agent-node3 \(pid {record.pid}\)"):
        processes.stop_processes([record], grace={"agent": 0.2}, kill=lambda _p, _s: None)


def test_instance_processes_joins_records_and_unrecorded_ones(
    tmp_path: Path, children: list[subprocess.Popen[bytes]]
) -> None:
    services = tmp_path / "services"
    services.mkdir()
    recorded = _record(_child(children, "sleep", "60"), "simulator", "simulator")
    dead = ServiceProcess("agent-node1", "agent", 2**22 + 1, 5, ())
    state_file = tmp_path / "services.json"
    processes.save_state(state_file, ServicesState([recorded, dead], {}))
    # An agent a crashed `up` started but never recorded (its argv names the services dir).
    script = services / "ringsnap-agent"
    script.write_text("import time; time.sleep(60)\n")
    unrecorded = _child(children, sys.executable, str(script), "serve", "--config", "x")
    deadline = time.monotonic() + 5
    while not (Path("/proc") / str(unrecorded.pid) / "cmdline").read_bytes().count(b"serve"):
        assert time.monotonic() < deadline
        time.sleep(0.05)

    live = processes.instance_processes(state_file, services)
    assert sorted((p.pid, p.kind) for p in live) == sorted(
        [(recorded.pid, "simulator"), (unrecorded.pid, "agent")]
    )
    stopped = processes.stop_instance_processes(state_file, services)
    assert {p.pid for p in stopped} == {recorded.pid, unrecorded.pid}
    assert not state_file.exists()
    assert unrecorded.wait(5) == -signal.SIGTERM
