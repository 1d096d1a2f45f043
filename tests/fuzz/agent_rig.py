"""The real agent (its gRPC server, allow-list interceptor, mTLS and health service) on a node laid
out in a temporary directory, with only the seams that would act on the host replaced by
recorders: the freeze ioctls (`ringsnap.agent.fsfreeze`) and the command runner
(`ringsnap.agent.process.run`: nodetool, the Cassandra stop and start commands, mount, umount,
blkid, hooks). A recorded command is refused (CommandFailed), so Cassandra looks stopped: the
restore RPCs' destructive paths are reachable and only the agent's own validation stands between
a hostile request and the node's files.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ringsnap.agent import fsfreeze, process
from ringsnap.agent.config import AgentConfig
from ringsnap.agent.errors import CommandFailed
from ringsnap.config import validate
from ringsnap.sandbox.agents import BackgroundAgent, TestPki, config_data

STOP = "fuzz-stop-cassandra"
START = "fuzz-start-cassandra"
NODETOOL = "fuzz-nodetool"
#: nodetool subcommands and commands that only read.
_REAL_RUN = process.run
_PROBES = frozenset(
    {"info", "version", "describecluster", "gossipinfo", "status", "ring", "blkid", "lsblk"}
)


@dataclass
class Recorder:
    """Every call that would have acted on the host, as `<what> <argument>` lines."""

    calls: list[str] = field(default_factory=list)
    probes: list[str] = field(default_factory=list)
    #: Off while the agent starts: its start-up (recovering leftovers) is no case's doing.
    armed: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self) -> tuple[list[str], list[str]]:
        with self._lock:
            calls, probes = self.calls, self.probes
            self.calls, self.probes = [], []
            return calls, probes

    def ioctl(self, what: str) -> object:
        def recorded(mount_point: str) -> fsfreeze.IoctlResult:
            with self._lock:
                self.calls.append(f"{what} {mount_point}")
            raise OSError(1, f"the fuzz rig does not {what}", mount_point)

        return recorded

    async def run(self, argv: Sequence[str], **options: Any) -> process.CommandResult:
        if not self.armed:
            return await _REAL_RUN(argv, **options)
        line = _describe(argv)
        with self._lock:
            (self.probes if line.split()[-1] in _PROBES else self.calls).append(line)
        raise CommandFailed(f"`{line}`: the fuzz rig runs no command")


def _describe(argv: Sequence[str]) -> str:
    if argv and argv[0] == NODETOOL:
        subcommand = next((arg for arg in argv[1:] if not arg.startswith("-")), "")
        return f"nodetool {subcommand}"
    if argv and argv[0] in (STOP, START):
        return "stop" if argv[0] == STOP else "start"
    return " ".join(argv[:1]) or "<empty argv>"


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file and directory under `root` (the node's directories and the agent's state) with
    its size and mtime: what a refused call must leave as it was."""
    found: dict[str, tuple[int, int]] = {}
    for directory, subdirectories, files in os.walk(root):
        for name in (*subdirectories, *files):
            info = os.lstat(os.path.join(directory, name))
            found[os.path.join(directory, name)] = (info.st_size, info.st_mtime_ns)
    return found


def _lay_out_node(root: Path) -> dict[str, Path]:
    data = root / "node" / "data"
    table = data / "shop" / "orders-1b255f4def2540a6a6e6b2c1a2b3c4d5"
    (table / "snapshots" / "rs-before").mkdir(parents=True)
    for name in ("nb-1-big-Data.db", "nb-1-big-TOC.txt", "nb-1-big-Digest.crc32"):
        (table / name).write_text("x" * 64)
        (table / "snapshots" / "rs-before" / name).write_text("x" * 64)
    (table / "nb-1-big-TOC.txt").write_text("Data.db\nTOC.txt\nDigest.crc32\n")
    places = {
        "data": data,
        "commitlog": root / "node" / "commitlog",
        "saved_caches": root / "node" / "saved_caches",
        "hints": root / "node" / "hints",
    }
    for name in ("commitlog", "saved_caches", "hints"):
        places[name].mkdir(parents=True)
    (places["commitlog"] / "CommitLog-7-1.log").write_text("c" * 128)
    (places["hints"] / "hint-1.hints").write_text("h" * 32)
    (places["saved_caches"] / "KeyCache-g.db").write_text("k" * 32)
    return places


@dataclass
class AgentRig:
    agent: BackgroundAgent
    channel: grpc.Channel
    recorder: Recorder
    node_root: Path

    def healthy(self) -> bool:
        stub = health_pb2_grpc.HealthStub(self.channel)
        answer = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)


@contextlib.contextmanager
def running_agent(root: Path) -> Iterator[AgentRig]:
    recorder = Recorder()
    places = _lay_out_node(root)
    pki = TestPki.create(root.parent / f"{root.name}-pki")
    data = config_data(
        pki,
        data_directories=[places["data"]],
        commitlog_directory=places["commitlog"],
        state_directory=root / "state",
        nodetool=[NODETOOL],
        cassandra={
            "saved_caches_directory": str(places["saved_caches"]),
            "hints_directory": str(places["hints"]),
            "stop_command": [STOP],
            "start_command": [START],
            "nodetool_timeout_seconds": 5.0,
        },
    )
    # An S3 store that refuses every connection: the S3 RPCs get past "no [s3] settings" to
    # their own validation, and a request that passes it fails at once, touching nothing.
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    keys = root / "s3-keys"
    keys.mkdir()
    for name in ("access", "secret"):
        (keys / name).write_text(f"fuzz-{name}")
        (keys / name).chmod(0o600)
    data["s3"] = {
        "bucket": "fuzz-bucket",
        "endpoint_url": f"http://127.0.0.1:{closed.getsockname()[1]}",
        "access_key_id_file": str(keys / "access"),
        "secret_access_key_file": str(keys / "secret"),
        "max_attempts": 1,
        "connect_timeout_seconds": 1.0,
        "read_timeout_seconds": 1.0,
    }
    config = validate(data, AgentConfig, source="<fuzz agent config>")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fsfreeze, "freeze", recorder.ioctl("freeze"))
        patch.setattr(fsfreeze, "thaw", recorder.ioctl("thaw"))
        patch.setattr(fsfreeze, "syncfs", recorder.ioctl("syncfs"))
        patch.setattr(process, "run", recorder.run)
        with BackgroundAgent(config) as agent, pki.channel(agent.address) as channel:
            recorder.armed = True
            yield AgentRig(agent, channel, recorder, root)
    closed.close()
