"""Coordination overhead of the freeze barrier with up to 1,000 agents over the real transport.

Every agent is the real one (`ringsnap.agent.app.AgentServer`: the gRPC service, mutual TLS, the
allow-list, the freeze manager with its leases and its fsynced freeze records), each on its own
port on 127.0.0.1, spread over a few processes. Only what would touch the host is replaced, at
the agent's own seams: the freeze ioctls (`ringsnap.agent.fsfreeze`) by a recorder, the mount
table the freeze manager reads (`FreezeManager(mounts=...)`) by one that gives each agent a data
and a commit-log filesystem of its own, and the Cassandra control (`NodeAgent.control`) by one
that answers with the node's identity. The coordinator is the real `BackupWorkflow` over
`GrpcNodeAgent` channels (TLS handshakes, fan-out, lease renewal, thaw) with an array in memory
whose snapshot takes `--array-ms`.

Per ring size it prints, on the coordinator's clock (see docs/backup-protocol.md):
- cold: the freeze barrier alone on channels never used (TLS handshakes inside the window);
- first: the first whole backup run (its plan phase opened the channels);
- warm: the median and max of the following runs;
each with the window, the agents' slowest freeze and thaw, the array call and the overhead
(window - those three), and the coordinator's CPU time over the barrier. At the largest size, the
coordinator process's open file descriptors and RSS. Every recorded freeze is checked thawed at
the end (a leftover is printed as an error).

    .venv/bin/python -m bench.scale_grpc [--agents 3 100 300 1000] [--processes 4] [--runs 10]

The agents share this machine's cores with the coordinator (on real nodes each has its own), so
their own CPU time serving the calls counts in the overhead here. Freeze records go to
`--state-root` (default /dev/shm: 1,000 agents fsyncing on one shared disk would measure that
disk, not coordination; a real agent fsyncs on its own host).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import faulthandler
import multiprocessing
import os
import resource
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from bench.scale_agents import node_name, raise_file_limit, serve_agents
from ringsnap.coordinator.agents.connection import ClientTls, GrpcNodeAgent
from ringsnap.coordinator.backup import BackupSettings, BackupWorkflow, NodeTarget
from ringsnap.coordinator.backup.freeze import FreezeBarrier, renew_leases
from ringsnap.coordinator.backup.model import (
    BackupFailed,
    BackupRefused,
    BackupRun,
    new_backup_id,
)
from ringsnap.coordinator.model import FreezeWindow, NodeVolume, VolumeRole
from ringsnap.coordinator.ports import AgentPort
from ringsnap.logs import configure
from ringsnap.sandbox.agents import TestPki
from tests.support.fakes import FakeArray, volumes_of

ARRAY = "sim"
_ROLES = {"data": VolumeRole.DATA, "cl": VolumeRole.COMMITLOG}


# -- the coordinator's side -------------------------------------------------------------------------


def _targets(agents: dict[str, AgentPort]) -> list[NodeTarget]:
    return [
        NodeTarget(
            name,
            agent,
            tuple(
                NodeVolume(array=ARRAY, volume=f"{name}-{suffix}", role=role)
                for suffix, role in _ROLES.items()
            ),
        )
        for name, agent in agents.items()
    ]


@dataclass
class Sample:
    window: FreezeWindow | None
    cpu: float
    #: CPU time of every agent process over the same span.
    agents_cpu: float
    #: Why the run failed ("" if it did not), shortened.
    error: str = ""


#: Runs ended so far (the stuck-run report watches it).
_RUNS_ENDED = [0]
#: The agent processes (their CPU time is read from /proc around each barrier).
_AGENT_PIDS: list[int] = []


def _agents_cpu() -> float:
    ticks = 0
    for pid in _AGENT_PIDS:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def _short(error: BaseException) -> str:
    text = str(error)
    return text if len(text) <= 240 else text[:240] + "..."


async def _cold_barrier(
    names: list[str],
    addresses: dict[str, str],
    tls: ClientTls,
    settings: BackupSettings,
    array_s: float,
) -> Sample:
    """The barrier alone on new channels: every TLS handshake falls inside the window."""
    agents = {name: GrpcNodeAgent(name, addresses[name], tls) for name in names}
    barrier = FreezeBarrier(
        dict(agents), new_backup_id(), settings.freeze_budget, settings.lease, renew_leases
    )
    cpu, agents_cpu = time.process_time(), _agents_cpu()
    error = ""
    try:
        await barrier.hold(lambda _left: asyncio.sleep(array_s), on_frozen=lambda: None)
    except BackupFailed as exc:
        error = _short(exc)
    finally:
        cpu, agents_cpu = time.process_time() - cpu, _agents_cpu() - agents_cpu
        for agent in agents.values():
            await agent.close()
    _RUNS_ENDED[0] += 1
    return Sample(barrier.window, cpu, agents_cpu, error)


class _CpuOfFreeze:
    """Coordinator CPU time over the freeze phase of a run (the workflow's progress callback)."""

    def __init__(self) -> None:
        self.cpu = self.agents_cpu = 0.0
        self._started: tuple[float, float] | None = None

    def __call__(self, phase: str, message: str) -> None:
        if phase == "freeze+snapshot+thaw":
            self._started = (time.process_time(), _agents_cpu())
        elif phase == "finish":
            self.stop()

    def stop(self) -> None:
        if self._started is not None:
            self.cpu = time.process_time() - self._started[0]
            self.agents_cpu = _agents_cpu() - self._started[1]
            self._started = None


async def _workflow_runs(
    names: list[str],
    addresses: dict[str, str],
    tls: ClientTls,
    settings: BackupSettings,
    array_s: float,
    runs: int,
) -> list[Sample]:
    agents = {name: GrpcNodeAgent(name, addresses[name], tls) for name in names}
    array = FakeArray(ARRAY, volumes_of(names))
    array.delay = array_s
    # The agents' disks are fake mounts with no SAN identity, which the backup's identity check
    # rightly reads as local disks under array volumes; the array here stands for one without SAN
    # ids (as LVM), so the runs measure the barrier, not a refusal.
    array.identifies_volumes = False
    cpu = _CpuOfFreeze()
    workflow = BackupWorkflow("scale", _targets(dict(agents)), {ARRAY: array}, None, progress=cpu)
    samples: list[Sample] = []
    try:
        started: list[BackupRun] = []

        async def keep(run: BackupRun) -> None:
            started.append(run)

        for _ in range(runs):
            _RUNS_ENDED[0] += 1
            try:
                run = await workflow.run(settings, trigger="bench", on_start=keep)
                samples.append(Sample(run.window, cpu.cpu, cpu.agents_cpu))
            except (BackupFailed, BackupRefused) as exc:
                cpu.stop()
                samples.append(Sample(started[-1].window, cpu.cpu, cpu.agents_cpu, _short(exc)))
    finally:
        for agent in agents.values():
            await agent.close()
    return samples


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


def _line(label: str, samples: Sequence[Sample], agents: int) -> str:
    def fig(name: str, values: list[float], unit: float = 1.0) -> str:
        if not values:
            return f"{name}=-"
        if len(values) == 1:
            return f"{name}={_ms(values[0] * unit)}"
        return f"{name}={_ms(statistics.median(values) * unit)}/{_ms(max(values) * unit)}"

    windows = [s.window for s in samples if s.window is not None]
    failed = [s.error for s in samples if s.error]
    text = (
        f"  {label:5s} "
        + " ".join(
            (
                fig("window", [w.total for w in windows]),
                fig("freezing", [w.freezing or 0.0 for w in windows]),
                fig("agents_freeze", [w.slowest_freeze for w in windows]),
                fig("array", [w.array_call for w in windows]),
                fig("thawing", [w.thawing or 0.0 for w in windows]),
                fig("agents_thaw", [w.slowest_thaw for w in windows]),
                fig("overhead", [w.overhead for w in windows]),
                fig("coordinator_cpu", [s.cpu for s in samples]),
                # The coordinator's own CPU per agent, in microseconds (x1000 of `_ms`).
                fig("coordinator_cpu_us_per_agent", [s.cpu for s in samples], 1000 / agents),
                fig("agents_cpu", [s.agents_cpu for s in samples]),
            )
        )
        + (" (ms; median/max)" if len(samples) > 1 else " (ms)")
    )
    if failed:
        text += f"\n        {len(failed)} of {len(samples)} failed, e.g.: {failed[0]}"
    return text


def _fds_and_rss() -> tuple[int, float]:
    fds = len(os.listdir("/proc/self/fd"))
    rss_kb = 0
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss_kb = int(line.split()[1])
    return fds, rss_kb / 1024


async def _measure(
    sizes: list[int],
    addresses: dict[str, str],
    tls: ClientTls,
    args: argparse.Namespace,
) -> None:
    settings = BackupSettings(freeze_budget=args.budget, lease=args.lease)
    array_s = args.array_ms / 1000
    every = sorted(addresses)
    stuck = asyncio.create_task(_report_stuck(args.stuck_after))
    try:
        await _sizes(sizes, every, addresses, tls, settings, array_s, args)
    finally:
        stuck.cancel()


async def _report_stuck(after: float) -> None:
    """A run that takes `after` seconds is stuck (every call it makes has a deadline far below):
    print where every task of the coordinator waits, for the report; the run is not touched."""
    seen = -1
    while True:
        await asyncio.sleep(after)
        if _RUNS_ENDED[0] != seen:
            seen = _RUNS_ENDED[0]
            continue
        print(f"STUCK? no run ended for {after:g} s; the coordinator's tasks:", flush=True)
        for task in asyncio.all_tasks():
            task.print_stack(limit=6, file=sys.stdout)
        sys.stdout.flush()


async def _sizes(
    sizes: list[int],
    every: list[str],
    addresses: dict[str, str],
    tls: ClientTls,
    settings: BackupSettings,
    array_s: float,
    args: argparse.Namespace,
) -> None:
    for size in sizes:
        # Spread over the worker processes: agent i is served by process i % processes.
        names = every[:size]
        cold = await _cold_barrier(names, addresses, tls, settings, array_s)
        profile = cProfile.Profile() if args.profile and size == max(sizes) else None
        if profile is not None:
            profile.enable()
        samples = await _workflow_runs(names, addresses, tls, settings, array_s, args.runs + 1)
        if profile is not None:
            profile.disable()
            profile.dump_stats(args.profile)
        load = os.getloadavg()
        print(
            f"agents={size} runs={args.runs} array_ms={args.array_ms:g} lease_s={args.lease:g}"
            f" load_average={load[0]:.2f},{load[1]:.2f},{load[2]:.2f}"
        )
        print(_line("cold", [cold], size))
        print(_line("first", samples[:1], size))
        print(_line("warm", samples[1:], size), flush=True)
        if size == max(sizes):
            fds, rss = _fds_and_rss()
            print(
                f"  coordinator process at {size} agents (channels closed after each size):"
                f" open fds now {fds}, VmRSS now {rss:.0f} MB, peak RSS"
                f" {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB"
            )


async def _peak_fds(names: list[str], addresses: dict[str, str], tls: ClientTls) -> int:
    """Open descriptors with one connected channel to each of `names` (as during a backup)."""
    agents = [GrpcNodeAgent(name, addresses[name], tls) for name in names]
    try:
        await asyncio.gather(*(agent.node_info() for agent in agents))
        return _fds_and_rss()[0]
    finally:
        for agent in agents:
            await agent.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--agents", type=int, nargs="*", default=[3, 100, 300, 1000])
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--runs", type=int, default=10, help="warm runs per size")
    parser.add_argument("--array-ms", type=float, default=10.0)
    parser.add_argument("--lease", type=float, default=1.0)
    parser.add_argument("--budget", type=float, default=1.5)
    parser.add_argument(
        "--profile", type=Path, help="cProfile the coordinator's runs at the largest size into it"
    )
    parser.add_argument("--stuck-after", type=float, default=120.0)
    parser.add_argument("--state-root", type=Path, default=Path("/dev/shm"))
    args = parser.parse_args()
    # Failed runs are reported by the benchmark itself (one line), not by a log line per node.
    configure(json=True, level="critical")
    # `kill -USR1 <pid>` prints where a stuck run is.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    limit = raise_file_limit()
    total = max(args.agents)
    print(f"RLIMIT_NOFILE {limit} (soft raised to the hard limit in every process)")
    spawn = multiprocessing.get_context("spawn")
    with (
        tempfile.TemporaryDirectory(prefix="ringsnap-scale-") as scratch,
        tempfile.TemporaryDirectory(prefix="ringsnap-scale-", dir=args.state_root) as state,
    ):
        pki = TestPki.create(Path(scratch) / "pki")
        tls = ClientTls(pki.client.cert_pem, pki.client.key_pem, pki.ca.cert_pem)
        workers: list[tuple[Any, Connection]] = []
        started = time.monotonic()
        try:
            for p in range(args.processes):
                indices = list(range(p, total, args.processes))
                parent, child = spawn.Pipe()
                process = spawn.Process(
                    target=serve_agents, args=(indices, str(pki.directory), state, child)
                )
                process.start()
                workers.append((process, parent))
                assert process.pid is not None
                _AGENT_PIDS.append(process.pid)
            addresses: dict[str, str] = {}
            for _, conn in workers:
                addresses.update((node_name(i), address) for i, address in conn.recv())
            print(
                f"{total} agents serving in {args.processes} processes"
                f" ({time.monotonic() - started:.1f} s to start)",
                flush=True,
            )
            asyncio.run(_measure(sorted(args.agents), addresses, tls, args))
            peak = asyncio.run(_peak_fds(sorted(addresses)[:total], addresses, tls))
            print(f"  coordinator open fds with {total} connected channels: {peak}")
        finally:
            for _, conn in workers:
                conn.send("stop")
            for process, conn in workers:
                report = conn.recv() if conn.poll(60) else {"calls": "no answer", "left_frozen": []}
                process.join(30)
                if report["left_frozen"]:
                    print(f"ERROR: left frozen: {report['left_frozen']}")
                print(f"  worker {process.pid}: ioctls {report['calls']}")


if __name__ == "__main__":
    main()
