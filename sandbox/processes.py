"""The background processes of a sandbox instance: start them detached, record them, stop them.

`ringsnap sandbox up` starts the agents, the array simulator and the coordinator as processes that
outlive it; `ringsnap sandbox down` stops them, also after a crash. Each is recorded in the
instance's `services.json` with its pid *and* its start time (field 22 of /proc/<pid>/stat): a pid
alone may name another process by the time `down` runs (a reboot, a crash long ago), so a pid whose
start time differs is never signalled. `down` also finds, by their command line, the processes of
the instance that no record names (a crash between starting one and recording it): the sandbox's
services are the only processes whose arguments name a path under the instance's `services/`.

Stopping is SIGTERM, a grace period, then SIGKILL: the coordinator first (it cancels running
backups and thaws their nodes), then the agents (each thaws what it froze), then the simulator.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ringsnap.logs import get_logger
from ringsnap.sandbox.errors import SandboxError

log = get_logger(__name__)

PROC = Path("/proc")
KINDS = ("coordinator", "agent", "simulator", "prometheus")
#: SIGTERM first; after this long, SIGKILL. The coordinator cancels backups and thaws nodes, an
#: agent thaws its filesystems, a simulator has nothing to finish, Prometheus closes its database.
GRACE_SECONDS = {"coordinator": 60.0, "agent": 30.0, "simulator": 5.0, "prometheus": 10.0}
#: After SIGKILL, how long to wait for the kernel to take the process away.
KILL_WAIT_SECONDS = 10.0


@dataclass(frozen=True)
class ServiceProcess:
    """One background process of an instance, as recorded."""

    name: str  # "coordinator", "agent-node1", "simulator"
    kind: str  # one of KINDS
    pid: int
    #: Clock ticks after boot at which the process started: with the pid, its identity.
    start_time: int
    argv: tuple[str, ...]
    log: Path | None = None
    address: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "pid": self.pid,
            "start_time": self.start_time,
            "argv": list(self.argv),
            "log": str(self.log) if self.log else None,
            "address": self.address,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> ServiceProcess:
        kind = str(raw["kind"])
        if kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r}")
        return cls(
            name=str(raw["name"]),
            kind=kind,
            pid=int(raw["pid"]),
            start_time=int(raw["start_time"]),
            argv=tuple(str(a) for a in raw.get("argv", [])),
            log=Path(raw["log"]) if raw.get("log") else None,
            address=str(raw.get("address", "")),
        )


# -- /proc -----------------------------------------------------------------------------------------


def parse_stat(text: str) -> tuple[str, int]:
    """(state, start time) from /proc/<pid>/stat. The command name (field 2) is in parentheses
    and may itself hold spaces and parentheses: the fields that follow start after the last ')'."""
    rest = text[text.rindex(")") + 2 :].split()
    # rest[0] is field 3 (state); field 22 (starttime) is rest[19].
    return rest[0], int(rest[19])


def read_stat(pid: int, proc: Path = PROC) -> tuple[str, int] | None:
    try:
        return parse_stat((proc / str(pid) / "stat").read_text())
    except (OSError, ValueError, IndexError):
        return None


def process_start_time(pid: int, proc: Path = PROC) -> int | None:
    stat = read_stat(pid, proc)
    return stat[1] if stat else None


def is_running(record: ServiceProcess, proc: Path = PROC) -> bool:
    """Whether the recorded process still runs: same pid, same start time, not a zombie."""
    stat = read_stat(record.pid, proc)
    return stat is not None and stat[1] == record.start_time and stat[0] not in ("Z", "X")


def _cmdline(pid: int, proc: Path) -> tuple[str, ...]:
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return ()
    return tuple(part.decode(errors="replace") for part in raw.split(b"\0") if part)


def kind_of(argv: Sequence[str]) -> str | None:
    """Which sandbox service an argv is, or None when it is none of them."""
    text = " ".join(argv)
    if "ringsnap.plugins.simulators" in text:
        return "simulator"
    if argv and Path(argv[0]).name == "prometheus":
        return "prometheus"
    if "serve" not in argv:
        return None
    if "ringsnap-coordinator" in text or "ringsnap.coordinator.main" in text:
        return "coordinator"
    if "ringsnap-agent" in text or "ringsnap.agent.main" in text:
        return "agent"
    return None


def find_service_processes(services_dir: Path, proc: Path = PROC) -> list[ServiceProcess]:
    """Live processes whose arguments name a path under `services_dir` and that are sandbox
    services (agent, coordinator, simulator, prometheus): what a crashed `up` may have left
    unrecorded."""
    prefix = str(services_dir).rstrip("/") + "/"
    found = []
    for entry in proc.iterdir() if proc.is_dir() else ():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        pid = int(entry.name)
        argv = _cmdline(pid, proc)
        if not any(arg.startswith(prefix) for arg in argv):
            continue
        kind = kind_of(argv)
        stat = read_stat(pid, proc)
        if kind is None or stat is None or stat[0] in ("Z", "X"):
            continue
        found.append(ServiceProcess(f"{kind} (unrecorded)", kind, pid, stat[1], argv))
    return found


# -- records ---------------------------------------------------------------------------------------


@dataclass
class ServicesState:
    """The instance's `services.json`: its processes and what they were started with."""

    processes: list[ServiceProcess] = field(default_factory=list)
    #: Facts for people and for `up` (the array vendor, the coordinator config, ...).
    details: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {**self.details, "processes": [p.to_json() for p in self.processes]}


def load_state(path: Path) -> ServicesState:
    """The recorded state; an absent file is an empty state, an unreadable one an error."""
    try:
        raw = json.loads(path.read_text())
        processes = [ServiceProcess.from_json(item) for item in raw.get("processes", [])]
        details = {k: str(v) for k, v in raw.items() if k != "processes"}
    except FileNotFoundError:
        return ServicesState()
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise SandboxError(f"cannot read the sandbox's process records {path}: {exc}") from None
    return ServicesState(processes, details)


def save_state(path: Path, state: ServicesState) -> None:
    """Write atomically: a crash leaves the old records or the new ones, never half of them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    temporary.write_text(json.dumps(state.to_json(), indent=2) + "\n")
    os.replace(temporary, path)


# -- starting --------------------------------------------------------------------------------------


def spawn(
    name: str,
    kind: str,
    argv: Sequence[str],
    log_file: Path,
    *,
    cwd: Path,
    address: str = "",
) -> tuple[ServiceProcess, subprocess.Popen[bytes]]:
    """Start `argv` detached from the caller (own session, no terminal, output to `log_file`; an
    earlier log becomes `<log>.previous`): it keeps running after `ringsnap sandbox up` returns
    and ignores the caller's Ctrl-C."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}")
    log_file.parent.mkdir(parents=True, exist_ok=True)
    if log_file.exists():  # one earlier generation is kept, for "why did it stop?"
        log_file.replace(log_file.with_name(log_file.name + ".previous"))
    with log_file.open("wb") as output:
        process = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            start_new_session=True,
            close_fds=True,
        )
    start_time = process_start_time(process.pid)
    if start_time is None:  # exited at once; its exit status tells why
        process.wait()
        start_time = 0
    record = ServiceProcess(name, kind, process.pid, start_time, tuple(argv), log_file, address)
    log.info("sandbox service started", service=name, pid=process.pid, log=str(log_file))
    return record, process


def log_tail(path: Path | None, lines: int = 15) -> str:
    if path is None:
        return ""
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""


# -- stopping --------------------------------------------------------------------------------------


def stop_processes(
    records: Iterable[ServiceProcess],
    *,
    grace: dict[str, float] | None = None,
    proc: Path = PROC,
    kill: Callable[[int, int], None] = os.kill,
    poll: float = 0.1,
) -> list[ServiceProcess]:
    """Stop the records' processes that still run, kind by kind in KINDS order: SIGTERM, wait
    up to the kind's grace, SIGKILL. Returns those that were running. Raises SandboxError naming
    any that outlived SIGKILL (stuck in the kernel: a frozen filesystem, a hung device)."""
    graces = {**GRACE_SECONDS, **(grace or {})}
    pending = list(records)
    stopped: list[ServiceProcess] = []
    survivors: list[ServiceProcess] = []
    for kind in KINDS:
        batch = [r for r in pending if r.kind == kind and is_running(r, proc)]
        if not batch:
            continue
        for record in batch:
            _signal(record, signal.SIGTERM, kill)
        remaining = _wait_gone(batch, graces[kind], proc, poll)
        for record in remaining:
            log.warning(
                "sandbox service ignored SIGTERM, killing it",
                service=record.name,
                pid=record.pid,
                grace_s=graces[kind],
            )
            _signal(record, signal.SIGKILL, kill)
        survivors += _wait_gone(remaining, KILL_WAIT_SECONDS, proc, poll)
        stopped += batch
    if survivors:
        raise SandboxError(
            "could not stop "
            + ", ".join(f"{r.name} (pid {r.pid})" for r in survivors)
            + ": it outlived SIGKILL (stuck in the kernel?); see `cat /proc/PID/stack`"
        )
    return stopped


def _signal(record: ServiceProcess, signum: int, kill: Callable[[int, int], None]) -> None:
    with contextlib.suppress(ProcessLookupError):
        kill(record.pid, signum)


def _wait_gone(
    records: list[ServiceProcess], seconds: float, proc: Path, poll: float
) -> list[ServiceProcess]:
    deadline = time.monotonic() + seconds
    remaining = [r for r in records if is_running(r, proc)]
    while remaining and time.monotonic() < deadline:
        time.sleep(poll)
        remaining = [r for r in remaining if is_running(r, proc)]
    return remaining


def instance_processes(services_file: Path, services_dir: Path) -> list[ServiceProcess]:
    """Every live process of the instance: the recorded ones that still run, and the
    unrecorded ones found by their command line. An unreadable record file counts as none."""
    try:
        recorded = load_state(services_file).processes
    except SandboxError as exc:
        log.warning("ignoring unreadable process records", error=str(exc))
        recorded = []
    live = [r for r in recorded if is_running(r)]
    known = {r.pid for r in live}
    return live + [p for p in find_service_processes(services_dir) if p.pid not in known]


def stop_instance_processes(services_file: Path, services_dir: Path) -> list[ServiceProcess]:
    """Stop every live process of the instance, then drop the records."""
    stopped = stop_processes(instance_processes(services_file, services_dir))
    services_file.unlink(missing_ok=True)
    return stopped
