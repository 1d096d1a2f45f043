"""Benchmark: freeze + thaw round trips through gRPC, per node, on real loop-mounted filesystems.

Starts N agent processes (`ringsnap-agent serve`, mutual TLS on 127.0.0.1), each with its own data
and commit-log ext4 filesystem on loop devices, optionally under a steady write load (dirty pages
that FIFREEZE must write back), then repeats: freeze every node in parallel (sync_first), thaw
every node in parallel. Reports per node the FreezeFilesystems and ThawFilesystems round trips, the
ioctl times the agent measured, and the whole window (first freeze sent to last thaw answered).

    sudo .venv/bin/python -m bench.freeze [--nodes 3] [--rounds 30] [--load-mib-s 20]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from google.protobuf import duration_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ringsnap.api.v1 import agent_pb2, agent_pb2_grpc
from ringsnap.sandbox.agents import TestPki, config_data, write_config
from ringsnap.sandbox.loopfs import LoopFilesystem, loop_filesystem, unavailable_reason

AGENT = Path(sys.executable).with_name("ringsnap-agent")


@dataclass
class BenchNode:
    name: str
    data: LoopFilesystem
    commitlog: LoopFilesystem
    address: str
    process: subprocess.Popen[bytes]
    stub: agent_pb2_grpc.AgentServiceStub
    freeze_rtt: list[float] = field(default_factory=list)
    thaw_rtt: list[float] = field(default_factory=list)
    ioctl_freeze: list[float] = field(default_factory=list)
    ioctl_thaw: list[float] = field(default_factory=list)
    frozen_for: list[float] = field(default_factory=list)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_serving(channel: grpc.Channel, process: subprocess.Popen[bytes]) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"agent exited with {process.returncode}")
        with contextlib.suppress(grpc.RpcError):
            if health.Check(health_pb2.HealthCheckRequest(), timeout=1).status == 1:
                return
        time.sleep(0.1)
    raise SystemExit("agent did not start within 30 s")


def load(stop: threading.Event, directory: Path, mib_per_second: float) -> None:
    """Keep dirty pages in the filesystem: 1 MiB writes at the given rate, files recycled."""
    chunk = os.urandom(1 << 20)
    pause = 1.0 / mib_per_second
    index = 0
    while not stop.is_set():
        path = directory / f"load-{index % 64}"
        with path.open("wb") as handle:
            handle.write(chunk)
        index += 1
        time.sleep(pause)


def percentiles(values: list[float]) -> str:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return (
        f"median {statistics.median(ordered) * 1000:7.2f} ms   p95 {p95 * 1000:7.2f} ms"
        f"   max {ordered[-1] * 1000:7.2f} ms"
    )


def one_round(nodes: list[BenchNode], pool: ThreadPoolExecutor, operation: str) -> float:
    lease = duration_pb2.Duration(seconds=5)

    def freeze(node: BenchNode) -> None:
        started = time.perf_counter()
        answer = node.stub.FreezeFilesystems(
            agent_pb2.FreezeFilesystemsRequest(run_id=operation, lease=lease, sync_first=True),
            timeout=30,
        )
        node.freeze_rtt.append(time.perf_counter() - started)
        node.ioctl_freeze.append(
            max(fs.freeze_duration.ToNanoseconds() for fs in answer.filesystems) / 1e9
        )

    def thaw(node: BenchNode) -> None:
        started = time.perf_counter()
        answer = node.stub.ThawFilesystems(
            agent_pb2.ThawFilesystemsRequest(run_id=operation), timeout=30
        )
        node.thaw_rtt.append(time.perf_counter() - started)
        assert all(fs.was_frozen for fs in answer.filesystems), answer
        node.ioctl_thaw.append(
            max(fs.thaw_duration.ToNanoseconds() for fs in answer.filesystems) / 1e9
        )
        node.frozen_for.append(
            max(fs.frozen_for.ToNanoseconds() for fs in answer.filesystems) / 1e9
        )

    started = time.perf_counter()
    list(pool.map(freeze, nodes))
    list(pool.map(thaw, nodes))
    return time.perf_counter() - started


@contextlib.contextmanager
def agents(root: Path, state_root: Path, count: int, pki: TestPki) -> Iterator[list[BenchNode]]:
    with contextlib.ExitStack() as stack:
        nodes: list[BenchNode] = []
        for index in range(1, count + 1):
            name = f"node{index}"
            data = stack.enter_context(loop_filesystem(root, f"{name}-data", size_mb=512))
            commitlog = stack.enter_context(loop_filesystem(root, f"{name}-commitlog", size_mb=512))
            port = free_port()
            config = write_config(
                root / f"{name}.toml",
                config_data(
                    pki,
                    data_directories=[data.mount_point],
                    commitlog_directory=commitlog.mount_point,
                    state_directory=state_root / f"{name}-state",
                    listen=f"127.0.0.1:{port}",
                ),
            )
            log = (root / f"{name}.log").open("wb")
            stack.callback(log.close)
            process = subprocess.Popen(
                [str(AGENT), "serve", "--config", str(config)], stdout=log, stderr=log
            )

            def stop(process: subprocess.Popen[bytes] = process) -> None:
                process.send_signal(signal.SIGTERM)
                process.wait(30)

            stack.callback(stop)
            channel = pki.channel(f"127.0.0.1:{port}")
            wait_serving(channel, process)
            nodes.append(
                BenchNode(
                    name,
                    data,
                    commitlog,
                    f"127.0.0.1:{port}",
                    process,
                    agent_pb2_grpc.AgentServiceStub(channel),
                )
            )
        yield nodes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--load-mib-s", type=float, default=0.0, help="write load per filesystem")
    parser.add_argument(
        "--state-dir",
        default="/dev/shm" if Path("/dev/shm").is_dir() else None,
        help="parent of the agents' state directories (default: /dev/shm, a tmpfs like /run)",
    )
    args = parser.parse_args()
    missing = unavailable_reason()
    if missing:
        raise SystemExit(f"cannot run: {missing}")
    root = Path(tempfile.mkdtemp(prefix="ringsnap-bench-freeze-"))
    # Freeze records go where /run is in production: a tmpfs (fsync there costs nothing).
    state_root = Path(tempfile.mkdtemp(prefix="ringsnap-bench-state-", dir=args.state_dir))
    pki = TestPki.create(root / "pki")
    stop = threading.Event()
    with agents(root, state_root, args.nodes, pki) as nodes, ThreadPoolExecutor(len(nodes)) as pool:
        writers = []
        if args.load_mib_s:
            for node in nodes:
                for fs in (node.data, node.commitlog):
                    writer = threading.Thread(
                        target=load, args=(stop, fs.mount_point, args.load_mib_s), daemon=True
                    )
                    writer.start()
                    writers.append(writer)
            time.sleep(2)
        one_round(nodes, pool, "warm-up")
        for node in nodes:
            for values in (
                node.freeze_rtt,
                node.thaw_rtt,
                node.ioctl_freeze,
                node.ioctl_thaw,
                node.frozen_for,
            ):
                values.clear()
        windows = [one_round(nodes, pool, f"round-{i}") for i in range(args.rounds)]
        stop.set()
        for writer in writers:
            writer.join()
    load_text = (
        f", write load {args.load_mib_s:g} MiB/s per filesystem" if args.load_mib_s else ", idle"
    )
    print(
        f"{args.nodes} nodes x 2 loop ext4 filesystems, {args.rounds} rounds, sync_first{load_text}"
    )
    for node in nodes:
        print(f"{node.name}: FreezeFilesystems RPC   {percentiles(node.freeze_rtt)}")
        print(f"{node.name}:   FIFREEZE (slowest fs) {percentiles(node.ioctl_freeze)}")
        print(f"{node.name}: ThawFilesystems RPC     {percentiles(node.thaw_rtt)}")
        print(f"{node.name}:   FITHAW (slowest fs)   {percentiles(node.ioctl_thaw)}")
        print(f"{node.name}: frozen for              {percentiles(node.frozen_for)}")
    print(f"window, first freeze sent -> last thaw answered: {percentiles(windows)}")
    shutil.rmtree(root, ignore_errors=True)  # the filesystems are unmounted by now
    shutil.rmtree(state_root, ignore_errors=True)


if __name__ == "__main__":
    main()
