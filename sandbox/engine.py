"""Ensure a Docker engine answers, starting `dockerd` without any bridge network if none does.

The engine is started detached and left running: it is shared by every instance and every helper on
the machine. It gets no bridge, no iptables rules and no IP forwarding, so containers can only use the
host's network (and the tests only 127.0.0.0/8).
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import time
from pathlib import Path

from ringsnap.logs import get_logger
from ringsnap.sandbox.errors import SandboxError

log = get_logger(__name__)

DOCKERD_ARGS = (
    "dockerd",
    "--bridge=none",
    "--iptables=false",
    "--ip-forward=false",
    "--ip-masq=false",
)
DEFAULT_LOG = Path("/var/log/ringsnap-dockerd.log")
_LOCK = Path("/run/ringsnap-dockerd.lock")


def engine_running(timeout: float = 10) -> bool:
    """True when `docker info` gets an answer from the engine."""
    try:
        proc = subprocess.run(
            ["docker", "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except FileNotFoundError as exc:
        raise SandboxError("the docker CLI is not installed (run `make system-deps`)") from exc
    except subprocess.TimeoutExpired:
        return False
    return proc.returncode == 0 and bool(proc.stdout.strip())


def ensure_engine(*, timeout: float = 60, log_path: Path = DEFAULT_LOG) -> bool:
    """Make sure a Docker engine answers. Returns True when this call had to start it.

    Idempotent and safe against several processes calling it at once (a lock file serializes the
    start; whoever comes second finds the engine answering).
    """
    if engine_running():
        _warn_about_bridges()
        return False
    _LOCK.parent.mkdir(parents=True, exist_ok=True)
    with _LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if engine_running():
            return False
        _start_dockerd(timeout=timeout, log_path=log_path)
    return True


def _start_dockerd(*, timeout: float, log_path: Path) -> None:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log.info("starting dockerd", args=" ".join(DOCKERD_ARGS), log=str(log_path))
    with log_path.open("ab") as out:
        try:
            proc = subprocess.Popen(
                list(DOCKERD_ARGS),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                # Its own session: the engine outlives the test run or CLI call that started it.
                start_new_session=True,
                close_fds=True,
                env={**os.environ},
            )
        except FileNotFoundError as exc:
            raise SandboxError("dockerd is not installed (run `make system-deps`)") from exc
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if engine_running(timeout=5):
            log.info("dockerd answers", pid=proc.pid)
            return
        if proc.poll() is not None:
            raise SandboxError(
                f"dockerd exited with code {proc.returncode}; last lines of {log_path}:\n"
                + _tail(log_path)
            )
        time.sleep(0.5)
    raise SandboxError(
        f"dockerd did not answer within {timeout:.0f} s; see {log_path}:\n" + _tail(log_path)
    )


def _warn_about_bridges() -> None:
    # An engine someone else started (e.g. a package's init script) may have a bridge network. The
    # sandbox never uses it (host network only), but say so instead of silently relying on it.
    proc = subprocess.run(
        ["docker", "network", "ls", "--filter", "driver=bridge", "--format", "{{.Name}}"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    bridges = proc.stdout.split()
    if bridges:
        log.warning(
            "the running Docker engine has bridge networks; sandbox containers use the host network only",
            bridges=bridges,
        )


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
