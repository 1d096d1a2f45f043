"""The agents' side of bench/scale_grpc.py: real agents (`AgentServer`) served by worker processes,
each with the freeze ioctls recorded instead of made, a mount table of its own (a data and a
commit-log filesystem per agent) and a Cassandra control that only answers who the node is."""

from __future__ import annotations

import asyncio
import errno
import faulthandler
import os
import resource
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

from ringsnap.agent import fsfreeze
from ringsnap.agent.app import AgentServer
from ringsnap.agent.config import AgentConfig
from ringsnap.agent.freeze import FreezeManager
from ringsnap.agent.nodetool import ClusterFacts, NodeIdentity
from ringsnap.config import validate
from ringsnap.logs import configure
from ringsnap.mountinfo import Mount
from ringsnap.sandbox.agents import COORDINATOR_IDENTITY

#: A major device number no real device here uses: the agents' fake filesystems.
_FAKE_MAJOR = 4000


@dataclass
class IoctlRecorder:
    """Stands in for FIFREEZE/FITHAW/syncfs: records each call and keeps the kernel's rules (a
    second freeze is EBUSY, a thaw of a thawed filesystem changes nothing)."""

    frozen: set[str] = field(default_factory=set)
    calls: dict[str, int] = field(default_factory=lambda: {"syncfs": 0, "freeze": 0, "thaw": 0})
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def syncfs(self, mount_point: str) -> float:
        with self._lock:
            self.calls["syncfs"] += 1
        return 0.0

    def freeze(self, mount_point: str) -> fsfreeze.IoctlResult:
        started = time.monotonic()
        with self._lock:
            self.calls["freeze"] += 1
            if mount_point in self.frozen:
                raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), mount_point)
            self.frozen.add(mount_point)
        return fsfreeze.IoctlResult(True, time.monotonic() - started)

    def thaw(self, mount_point: str) -> fsfreeze.IoctlResult:
        started = time.monotonic()
        with self._lock:
            self.calls["thaw"] += 1
            if mount_point not in self.frozen:
                return fsfreeze.IoctlResult(False, time.monotonic() - started)
            self.frozen.discard(mount_point)
        return fsfreeze.IoctlResult(True, time.monotonic() - started)


class NodeControl:
    """The node's Cassandra, as far as a backup asks it: who it is; flushes that take no time."""

    def __init__(self, index: int) -> None:
        self._facts = ClusterFacts(
            cluster_name="scale",
            cassandra_version="5.0.7",
            identity=NodeIdentity(
                host_id=f"00000000-0000-4000-8000-{index:012d}",
                datacenter="dc1",
                rack="rack1",
                tokens=(str(index * 1000),),
                gossip_active=True,
                native_transport_active=True,
            ),
            native_address="127.0.0.1",
        )

    async def info(self, *, timeout: float | None = None) -> NodeIdentity:
        return self._facts.identity

    async def facts(self) -> ClusterFacts:
        return self._facts

    async def flush(self, keyspace: str = "", tables: Sequence[str] = ()) -> float:
        return 0.0

    async def snapshot(self, tag: str, keyspaces: Sequence[str] = ()) -> float:
        return 0.0

    async def clear_snapshot(self, tag: str) -> float:
        return 0.0

    async def drain(self) -> float:
        return 0.0

    async def aclose(self) -> None:
        return None


def node_name(index: int) -> str:
    return f"n{index:04d}"


def _agent(index: int, pki_dir: Path, state_root: Path) -> AgentServer:
    root = state_root / node_name(index)
    data, commitlog = root / "data", root / "commitlog"
    data.mkdir(parents=True, exist_ok=True)
    commitlog.mkdir(exist_ok=True)
    settings = {
        "server": {"listen": "127.0.0.1:0", "allowed_clients": [COORDINATOR_IDENTITY]},
        "tls": {
            "cert_file": str(pki_dir / "agent.crt"),
            "key_file": str(pki_dir / "agent.key"),
            "ca_file": str(pki_dir / "ca.crt"),
        },
        "cassandra": {
            "data_directories": [str(data)],
            "commitlog_directory": str(commitlog),
            "nodetool": ["false"],  # never run: the control is replaced below
        },
        "freeze": {"state_directory": str(root / "state")},
        "volumes": {"state_directory": str(root / "volumes")},
        "log": {"json": True, "level": "error"},
    }
    config = validate(settings, AgentConfig, source=f"<agent {node_name(index)}>")
    server = AgentServer(config)
    node = server.agent
    root_device = os.stat("/").st_dev
    mounts = [
        Mount("/", os.major(root_device), os.minor(root_device), "ext4", "/dev/root"),
        Mount(str(data), _FAKE_MAJOR, 2 * index, "xfs", f"/dev/bench{index}a"),
        Mount(str(commitlog), _FAKE_MAJOR, 2 * index + 1, "xfs", f"/dev/bench{index}b"),
    ]
    node.freezer = FreezeManager(
        data_directories=config.cassandra.data_directories,
        commitlog_directory=config.cassandra.commitlog_directory,
        store=node.store,
        policy=node.freezer.policy,
        mounts=lambda: mounts,
    )
    node.control = NodeControl(index)
    return server


def serve_agents(indices: list[int], pki_dir: str, state_root: str, conn: Connection) -> None:
    """A worker process: serve the agents `indices` until the parent says stop."""
    configure(json=True, level="error")
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    raise_file_limit()
    recorder = IoctlRecorder()
    fsfreeze.syncfs = recorder.syncfs
    fsfreeze.freeze = recorder.freeze
    fsfreeze.thaw = recorder.thaw
    asyncio.run(_serve(indices, Path(pki_dir), Path(state_root), conn, recorder))


async def _serve(
    indices: list[int], pki_dir: Path, state_root: Path, conn: Connection, recorder: IoctlRecorder
) -> None:
    servers = [_agent(index, pki_dir, state_root) for index in indices]
    ports = [await server.start() for server in servers]
    conn.send([(i, f"127.0.0.1:{port}") for i, port in zip(indices, ports, strict=True)])
    await asyncio.get_running_loop().run_in_executor(None, conn.recv)  # "stop"
    for server in servers:
        await server.stop(grace=0.5)
    conn.send({"calls": recorder.calls, "left_frozen": sorted(recorder.frozen)})


def raise_file_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard
