"""The sandbox ring on direct-attached storage: every node's LUNs become LVs of its own lvm2.

    with running_das_stack(cluster, workdir) as das:     # one lvm2 emulator + agent per node
        config = das.coordinator_config(workdir / "coordinator")

Each node gets a volume group `das<n>` of the lvm2 2.03.16 emulator (`plugins.simulators.lvm2`)
whose LVs are the node's own LUN images, adopted as they are (formatted, mounted, under a running
Cassandra): a thick `data` LV and a thin `commitlog` LV in a thin pool. The emulator's store lives
in the ring's reflink XFS pool (`<pool>/das`), so a snapshot is a reflink of the LUN image and a
merge writes back into it. Each node's agent (in this process, as `stack.running_stack` runs
them) has an `[lvm]` section for its two LVs and runs that emulator as its lvm2; its `[volumes]`
hooks attach and detach the LVs' images (`sandbox.hooks --lvm-store`). The coordinator gets one
`agent-lvm` array per node and no lvm2 of its own.

The LUN images stay what they were when the stack goes (a revert wrote the snapshot into them;
the ring is as the restore left it); the store, its links and any snapshot left are removed.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ringsnap.agent.config import AgentConfig
from ringsnap.config import validate
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.plugins.lvm.runner import CommandResult
from ringsnap.plugins.simulators.lvm2 import Lvm2Emulator
from ringsnap.sandbox.agents import BackgroundAgent, TestPki
from ringsnap.sandbox.cluster import NodeInfo, SandboxCluster
from ringsnap.sandbox.s3proxy import free_port
from ringsnap.sandbox.stack import CLUSTER_NAME, agent_data, hook_argv

DATA_LV = "data"
COMMITLOG_LV = "commitlog"
THIN_POOL = "pool"
GiB = 1 << 30


class RecordedLvm2:
    """A node's lvm2 as its agent runs it: the emulator, every command line kept."""

    def __init__(self, emulator: Lvm2Emulator) -> None:
        self.emulator = emulator
        self.calls: list[tuple[str, ...]] = []
        #: Called with each command line once it ran (a test's fault injection), in the agent's
        #: worker thread.
        self.after: Callable[[tuple[str, ...]], None] | None = None

    def run(self, argv: Sequence[str], *, timeout: float) -> CommandResult:
        self.calls.append(tuple(argv))
        result = self.emulator.run(argv, timeout=timeout)
        if self.after is not None:
            self.after(tuple(argv))
        return result

    def ran(self, command: str) -> list[tuple[str, ...]]:
        return [argv for argv in self.calls if argv and argv[0] == command]


@dataclass
class DasNode:
    info: NodeInfo
    vg: str
    lvm2: RecordedLvm2
    agent: BackgroundAgent
    #: Its agent's settings (a fixed port: an agent started again serves where the config says).
    config: AgentConfig

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def array(self) -> str:
        """The coordinator's `agent-lvm` array of this node."""
        return f"{self.info.name}-das"

    def volume(self, lv: str) -> str:
        return f"{self.vg}/{lv}"

    @property
    def emulator(self) -> Lvm2Emulator:
        return self.lvm2.emulator


@dataclass
class DasStack:
    cluster: SandboxCluster
    pki: TestPki
    store: Path
    nodes: dict[str, DasNode]
    #: The `[s3]` table of the agents and the coordinator (exports), or None.
    s3: dict[str, Any] | None = None

    def coordinator_data(self, directory: Path) -> dict[str, Any]:
        """The coordinator's config as data, its catalog and client certificate in `directory`."""
        directory.mkdir(parents=True, exist_ok=True)
        client = self.pki.client.write(directory / "pki", "coordinator")
        ca_file = directory / "pki" / "ca.crt"
        ca_file.write_bytes(self.pki.ca_file.read_bytes())
        nodes = [
            {
                "name": node.name,
                "agent": node.agent.address,
                "volumes": [
                    {"array": node.array, "volume": node.volume(DATA_LV), "role": "data"},
                    {
                        "array": node.array,
                        "volume": node.volume(COMMITLOG_LV),
                        "role": "commitlog",
                    },
                ],
            }
            for node in self.nodes.values()
        ]
        data: dict[str, Any] = {
            "coordinator": {
                "listen": "127.0.0.1:0",
                "metrics_listen": "127.0.0.1:0",
                "catalog": str(directory / "catalog.db"),
            },
            "tls": {
                "cert_file": str(client.cert),
                "key_file": str(client.key),
                "ca_file": str(ca_file),
            },
            "clusters": [
                {
                    "name": CLUSTER_NAME,
                    "contact_points": self.cluster.addresses,
                    "nodes": nodes,
                    "seeds": [node.name for node in self.nodes.values()],
                }
            ],
            "arrays": {
                node.array: {"driver": "agent-lvm", "node": node.name}
                for node in self.nodes.values()
            },
        }
        if self.s3 is not None:
            data["s3"] = dict(self.s3)
        return data

    def kill_agent(self, name: str) -> None:
        """The node's agent goes away as a killed one does: its server stops at once, mid-call,
        and what it froze stays frozen until its lease ends (called from any thread but the
        agent's own loop)."""
        agent = self.nodes[name].agent
        server = agent.server._server
        if server is not None:
            agent.call(server.stop(0))

    def restart_agent(self, name: str) -> None:
        """The node's agent started again (after `kill_agent`): same config, same lvm2."""
        node = self.nodes[name]
        with contextlib.suppress(Exception):
            node.agent.stop()  # the old one's loop and leases; its server is gone already
        node.agent = BackgroundAgent(node.config, lvm_runner=node.lvm2).start()

    def coordinator_config(self, directory: Path) -> CoordinatorConfig:
        return validate(self.coordinator_data(directory), CoordinatorConfig, source="<sandbox das>")


def volume_group(
    node: NodeInfo, store: Path, latency: Mapping[str, float] | None
) -> tuple[str, Lvm2Emulator]:
    """The node's VG in its own emulator, its LVs the node's LUN images (see the module doc)."""
    vg = f"das{node.index}"
    emulator = Lvm2Emulator(store, latency=latency)
    data, commitlog = node.data_lun, node.commitlog_lun
    # Room for the LVs, the thin pool and thick copy-on-write space to spare.
    emulator.add_vg(vg, 4 * (data.size_bytes + commitlog.size_bytes))
    emulator.add_linear(vg, DATA_LV, data.size_bytes, image=data.image_path)
    emulator.add_thin_pool(vg, THIN_POOL, 2 * commitlog.size_bytes)
    emulator.add_thin(vg, COMMITLOG_LV, commitlog.size_bytes, THIN_POOL, image=commitlog.image_path)
    return vg, emulator


def das_agent_config(
    cluster: SandboxCluster,
    node: NodeInfo,
    pki: TestPki,
    workdir: Path,
    *,
    vg: str,
    store: Path,
    s3: dict[str, Any] | None = None,
) -> AgentConfig:
    """The sandbox agent of `node` (`stack.agent_data`) with `[lvm]` and hooks for its LVs."""
    data = agent_data(
        cluster,
        node,
        pki,
        state_directory=workdir / "agent-state" / node.name,
        listen=f"127.0.0.1:{free_port()}",
    )
    lvm_store = ["--lvm-store", str(store)]
    data["volumes"] |= {
        "detach_command": [*hook_argv("detach", cluster.pool_dir), *lvm_store],
        "attach_command": [*hook_argv("attach", cluster.pool_dir), *lvm_store],
    }
    if s3 is not None:
        data["s3"] = dict(s3)  # exports upload from the node (docs/s3.md)
    data["lvm"] = {
        "volumes": [
            {"volume": f"{vg}/{DATA_LV}", "kind": "thick", "directories": [str(node.data_dir)]},
            {
                "volume": f"{vg}/{COMMITLOG_LV}",
                "kind": "thin",
                "directories": [str(node.commitlog_dir)],
            },
        ],
    }
    return validate(data, AgentConfig, source=f"<das agent {node.name}>")


def _stop_agent(node: DasNode) -> None:
    node.agent.stop()


@contextlib.contextmanager
def running_das_stack(
    cluster: SandboxCluster,
    workdir: Path,
    *,
    latency: Mapping[str, float] | None = None,
    s3: dict[str, Any] | None = None,
) -> Iterator[DasStack]:
    """An lvm2 (emulated, `latency` per command) and an agent for every node of `cluster`;
    `s3`: the `[s3]` table of the agents and the coordinator (exports to that bucket)."""
    workdir.mkdir(parents=True, exist_ok=True)
    store = cluster.pool_dir / "das"
    if store.exists():
        shutil.rmtree(store)  # a run killed before its cleanup: links and snapshots only
    pki = TestPki.create(workdir / "pki")
    try:
        with contextlib.ExitStack() as stack:
            nodes: dict[str, DasNode] = {}
            for info in cluster.nodes:
                vg, emulator = volume_group(info, store, latency)
                lvm2 = RecordedLvm2(emulator)
                config = das_agent_config(cluster, info, pki, workdir, vg=vg, store=store, s3=s3)
                nodes[info.name] = DasNode(
                    info, vg, lvm2, BackgroundAgent(config, lvm_runner=lvm2).start(), config
                )
                # The node's agent then, whichever it is (a test may have started it again).
                stack.callback(_stop_agent, nodes[info.name])
            yield DasStack(cluster, pki, store, nodes, s3)
    finally:
        # Links to the LUN images (never the images) and snapshot images.
        shutil.rmtree(store, ignore_errors=True)
