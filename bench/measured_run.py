"""A benchmark step run as a process and measured: its wall time, the peak RSS of its process and
of its whole tree (sampled from /proc), the CPU of the tree it waited for, and S3Proxy's CPU
meanwhile (bench/s3_vs_medusa.py splits every step's cost between the tool and the store)."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import threading
import time
from dataclasses import dataclass

from bench.s3_export import S3ProxyCpu


@dataclass(frozen=True)
class Run:
    seconds: float
    tree_peak_rss: int
    own_peak_rss: int
    stdout: str
    #: CPU seconds (user + system) of the tool's process tree, and of S3Proxy meanwhile.
    cpu_seconds: float = 0.0
    s3proxy_cpu_seconds: float = 0.0


#: Attached once S3Proxy runs: every step's CPU is split between the tool and the store.
S3PROXY = S3ProxyCpu()


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class TreeSampler(threading.Thread):
    """Peak RSS of a process and of its whole tree (sum over descendants), sampled from /proc."""

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.interval = interval
        self.tree_peak = 0
        self.own_peak = 0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            own = rss(self.pid)
            tree = own + sum(rss(child) for child in descendants(self.pid))
            self.own_peak = max(self.own_peak, own)
            self.tree_peak = max(self.tree_peak, tree)
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join()


def rss(pid: int) -> int:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def descendants(pid: int) -> list[int]:
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            with open(f"/proc/{entry}/stat", encoding="ascii") as stat:
                ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
            parents.setdefault(ppid, []).append(int(entry))
    found: list[int] = []
    todo = [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found.extend(children)
        todo.extend(children)
    return found


#: A step that takes longer is stopped: a hung tool must not hold the Cassandra lock for ever.
STEP_TIMEOUT = 600.0


def run_measured(argv: list[str], env: dict[str, str] | None = None) -> Run:
    cpu_before = children_cpu()
    s3proxy_before = S3PROXY.seconds()
    started = time.perf_counter()
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True,
    )  # fmt: skip
    sampler = TreeSampler(process.pid)
    sampler.start()
    try:
        out, err = process.communicate(timeout=STEP_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # its own session: the tool and its children
        out, err = process.communicate()
        sampler.stop()
        raise SystemExit(
            f"{' '.join(argv[:4])} ... did not finish in {STEP_TIMEOUT:.0f} s; stopped:\n{err[-3000:]}"
        ) from None
    seconds = time.perf_counter() - started
    s3proxy_cpu = S3PROXY.seconds() - s3proxy_before
    sampler.stop()
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])} ... failed ({process.returncode}):\n{err[-3000:]}")
    # The tree's CPU: the tool and every child it waited for (medusa's nodetool JVM).
    cpu = children_cpu() - cpu_before
    return Run(seconds, sampler.tree_peak, sampler.own_peak, out, cpu, s3proxy_cpu)
