"""A real N-node Cassandra cluster in Docker, each node's data and commit log on its own LUN.

`SandboxCluster` starts the nodes through testcontainers (host network, one loopback address and one
JMX port per node), waits for `Startup complete` and then until every node sees every node Up/Normal.
It gives tests nodetool, a driver session, per-node facts and stop/start of one node. Leaving the
context (or `close()`) removes everything through `down()`, also when starting failed half way.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Literal

from ringsnap.logs import get_logger
from ringsnap.sandbox import instance as instances
from ringsnap.sandbox.at_once import each_at_once
from ringsnap.sandbox.commands import run
from ringsnap.sandbox.cql_session import RingSession
from ringsnap.sandbox.errors import SandboxError
from ringsnap.sandbox.image import ensure_image
from ringsnap.sandbox.instance import DEFAULT_INSTANCE, InstanceLayout
from ringsnap.sandbox.node_container import STARTUP_MESSAGE, run_node_container
from ringsnap.sandbox.node_info import (
    JOLOKIA_PORT,
    NATIVE_PORT,
    NodeInfo,
    NodeState,
    node_from_json,
    node_to_json,
)
from ringsnap.sandbox.nodetool import RingMember, nodetool, parse_status
from ringsnap.sandbox.pool import (
    DEFAULT_LUN_SIZES,
    Pool,
    create_lun,
    create_pool,
    current_loop_device,
    mount_lun,
)
from ringsnap.sandbox.teardown import (
    DownReport,
    down,
    find_leftovers,
    instance_containers,
)

if TYPE_CHECKING:
    from cassandra.cluster import Session

log = get_logger(__name__)

# The reaper image cannot be pulled here; teardown removes containers by their label instead.
os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")

Reporter = Callable[[str], None]


class SandboxCluster:
    """An N-node sandbox cluster of one instance. Use as a context manager, or start()/close()."""

    def __init__(
        self,
        instance: str = DEFAULT_INSTANCE,
        nodes: int = 3,
        *,
        heap: str = "512M",
        num_tokens: int = 16,
        start_timeout: float = 300,
        lun_sizes: dict[str, int] | None = None,
        report: Reporter | None = None,
        jit: Literal["quick", "full"] = "quick",
    ) -> None:
        instances.validate_instance_name(instance)
        if not 1 <= nodes <= instances.MAX_NODES:
            raise SandboxError(f"a sandbox cluster has 1..{instances.MAX_NODES} nodes, not {nodes}")
        self.instance = instance
        self.node_count = nodes
        self.heap = heap
        self.num_tokens = num_tokens
        self.start_timeout = start_timeout
        # quick (C1 only) halves the CPU a node needs to start (about 5 s instead of 10 here):
        # sandbox nodes restart often and serve little. Benchmarks of Cassandra under load ask
        # for full.
        self.jit = jit
        self.lun_sizes = dict(lun_sizes or DEFAULT_LUN_SIZES)
        self.cluster_name = f"ringsnap-{instance}"
        self.image_tag = ""
        self.timings: dict[str, float] = {}
        self._report = report or (lambda _msg: None)
        self._layout: InstanceLayout | None = None
        self._pool: Pool | None = None
        self._nodes: list[NodeInfo] = []
        self._cql = RingSession(lambda: self.addresses)

    # ----------------------------------------------------------------- lifecycle

    def __enter__(self) -> SandboxCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def start(self) -> SandboxCluster:
        """Build what is missing, start every node, wait until all are Up/Normal.

        On any failure everything of the instance is removed again before the error propagates.
        """
        if instance_containers(self.instance):
            # Checked before the try: failing here must not tear down someone's running instance.
            raise SandboxError(
                f"sandbox instance {self.instance!r} already has containers; "
                f"use SandboxCluster.attach({self.instance!r}) or `ringsnap sandbox down --instance {self.instance}`"
            )
        leftovers = find_leftovers(self.instance)
        if not leftovers.empty or leftovers.root_exists:
            log.warning(
                "removing leftovers of an earlier run of this instance", instance=self.instance
            )
            down(self.instance)
        started = time.monotonic()
        try:
            self._start()
        except BaseException:
            log.error("sandbox start failed, tearing down", instance=self.instance)
            self.close()
            raise
        self.timings["total"] = time.monotonic() - started
        return self

    def _start(self) -> None:
        phase = time.monotonic()
        self._report("checking the Docker engine and the Cassandra image")
        build = ensure_image(report=self._report)
        self.image_tag = build.tag
        self.timings["image"] = time.monotonic() - phase

        phase = time.monotonic()
        self._layout = layout = instances.acquire(self.instance)
        self._report(f"making the XFS pool and {2 * self.node_count} LUNs under {layout.root}")
        self._pool = create_pool(layout.pool_image, layout.pool_dir)
        self._nodes = [self._prepare_node(layout, index) for index in range(1, self.node_count + 1)]
        self._save_state()
        self.timings["storage"] = time.monotonic() - phase

        phase = time.monotonic()
        self._report(f"starting {self.node_count} Cassandra nodes")
        with ThreadPoolExecutor(max_workers=self.node_count) as pool:
            for future in [pool.submit(self._run_container, node) for node in self._nodes]:
                future.result()
        self.timings["startup"] = time.monotonic() - phase

        phase = time.monotonic()
        self._report("waiting until every node sees every node Up/Normal")
        self.wait_until_up_normal()
        self.timings["ring"] = time.monotonic() - phase
        log.info(
            "sandbox cluster up",
            instance=self.instance,
            nodes=self.node_count,
            **{f"{k}_s": round(v, 1) for k, v in self.timings.items()},
        )

    def _prepare_node(self, layout: InstanceLayout, index: int) -> NodeInfo:
        assert self._pool is not None
        luns = {}
        for kind in instances.LUN_KINDS:
            lun = create_lun(
                self._pool,
                layout.volume_name(index, kind),
                layout.mount_point(index, kind),
                self.lun_sizes[kind],
            )
            luns[kind] = mount_lun(lun)
        data_root = luns["data"].mount_point
        node = NodeInfo(
            name=instances.node_name(index),
            index=index,
            address=layout.address(index),
            jmx_port=layout.jmx_port(index),
            container_name=layout.container_name(index),
            data_dir=data_root / "data",
            commitlog_dir=luns["commitlog"].mount_point / "commitlog",
            saved_caches_dir=data_root / "saved_caches",
            hints_dir=data_root / "hints",
            data_lun=luns["data"],
            commitlog_lun=luns["commitlog"],
        )
        for path in (node.data_dir, node.commitlog_dir, node.saved_caches_dir, node.hints_dir):
            path.mkdir(parents=True, exist_ok=True)
        from ringsnap.sandbox.pitr import prepare_archiving  # needs NodeInfo from here

        prepare_archiving(luns["commitlog"].mount_point)
        return node

    def node_environment(self, node: NodeInfo) -> dict[str, str]:
        """The entrypoint's CASSANDRA_* settings for one node."""
        seeds = ",".join(n.address for n in self._nodes)
        return {
            "CASSANDRA_CLUSTER_NAME": self.cluster_name,
            "CASSANDRA_LISTEN_ADDRESS": node.address,
            "CASSANDRA_RPC_ADDRESS": node.address,
            "CASSANDRA_SEEDS": seeds,
            "CASSANDRA_DATA_DIR": str(node.data_dir),
            "CASSANDRA_COMMITLOG_DIR": str(node.commitlog_dir),
            "CASSANDRA_SAVED_CACHES_DIR": str(node.saved_caches_dir),
            "CASSANDRA_HINTS_DIR": str(node.hints_dir),
            "CASSANDRA_JMX_PORT": str(node.jmx_port),
            "CASSANDRA_HEAP": self.heap,
            "CASSANDRA_NUM_TOKENS": str(self.num_tokens),
            "CASSANDRA_AUTO_BOOTSTRAP": "false",
            "CASSANDRA_NATIVE_PORT": str(NATIVE_PORT),
            "CASSANDRA_JOLOKIA_PORT": str(JOLOKIA_PORT),
            "CASSANDRA_JIT": self.jit,
            # commitlog_archiving.properties (ringsnap.sandbox.pitr) is read from the classpath.
            "CASSANDRA_EXTRA_CLASSPATH": str(node.commitlog_lun.mount_point / "ringsnap-conf"),
        }

    def _run_container(self, node: NodeInfo) -> None:
        assert self._layout is not None
        run_node_container(
            self.image_tag,
            node,
            self.node_environment(node),
            self._layout.labels(node.index),
            self.start_timeout,
        )

    def close(self) -> DownReport:
        """Close the driver and remove every container, mount, loop device and file of the instance."""
        self.close_session()
        return down(self.instance)

    @classmethod
    def attach(cls, instance: str = DEFAULT_INSTANCE) -> SandboxCluster:
        """A handle on an instance started earlier (e.g. by `ringsnap sandbox up`), from its state file."""
        layout = instances.lookup(instance)
        if layout is None or not layout.state_file.is_file():
            raise SandboxError(
                f"sandbox instance {instance!r} is not up (no state under {instances.sandbox_root()})"
            )
        state = json.loads(layout.state_file.read_text())
        cluster = cls(
            instance, nodes=len(state["nodes"]), heap=state["heap"], num_tokens=state["num_tokens"]
        )
        cluster.image_tag = state["image_tag"]
        cluster._layout = layout
        cluster._nodes = [node_from_json(raw) for raw in state["nodes"]]
        return cluster

    def _save_state(self) -> None:
        assert self._layout is not None
        state = {
            "instance": self.instance,
            "slot": self._layout.slot,
            "cluster_name": self.cluster_name,
            "image_tag": self.image_tag,
            "heap": self.heap,
            "num_tokens": self.num_tokens,
            "nodes": [node_to_json(node) for node in self._nodes],
        }
        self._layout.state_file.write_text(json.dumps(state, indent=2) + "\n")

    # ----------------------------------------------------------------- facts

    @property
    def layout(self) -> InstanceLayout:
        if self._layout is None:
            raise SandboxError("the sandbox cluster is not started")
        return self._layout

    @property
    def nodes(self) -> list[NodeInfo]:
        return list(self._nodes)

    @property
    def addresses(self) -> list[str]:
        return [n.address for n in self._nodes]

    @property
    def pool_dir(self) -> Path:
        return self.layout.pool_dir

    def node(self, node: str | int | NodeInfo) -> NodeInfo:
        """A node by name ("node2"), 1-based index, or its NodeInfo."""
        if isinstance(node, NodeInfo):
            return node
        index = node if isinstance(node, int) else instances.node_index(node)
        for info in self._nodes:
            if info.index == index:
                return info
        raise SandboxError(f"instance {self.instance!r} has no node {node!r}")

    # ----------------------------------------------------------------- using it

    def nodetool(self, node: str | int | NodeInfo, *args: str, timeout: float = 180) -> str:
        """Run nodetool against one node; returns its stdout, raises SandboxError on failure."""
        return nodetool(self.node(node).jmx_port, *args, timeout=timeout)

    def ring(self, node: str | int | NodeInfo) -> dict[str, RingMember]:
        """The ring as one node sees it (`nodetool status`)."""
        return parse_status(self.nodetool(node, "status"))

    def session(self, keyspace: str | None = None) -> Session:
        """A cassandra-driver session that only ever talks to this cluster's nodes."""
        return self._cql.session(keyspace)

    def wait_until_up_normal(
        self,
        nodes: Sequence[str | int | NodeInfo] | None = None,
        *,
        timeout: float = 240,
        poll: float = 2.0,
    ) -> None:
        """Wait until each of `nodes` (default: all) sees all of them Up/Normal in `nodetool status`
        and takes CQL connections, and until an open driver session sees them up again.

        Usable after the nodes were stopped and started by someone else (an agent's restore, a
        test): it first refreshes every node's LUN facts (`refresh()`), and it fails at once,
        naming the node, when a node's container is not running (nobody will start it).
        """
        self.refresh()
        expected = [self.node(n if not isinstance(n, NodeInfo) else n.index) for n in nodes or []]
        expected = expected or list(self._nodes)
        wanted = {n.address for n in expected}
        deadline = time.monotonic() + timeout

        def observe(observer: NodeInfo, stop: threading.Event) -> None:
            seen: dict[str, RingMember] = {}
            while not stop.is_set():
                self._check_running(expected)
                try:
                    seen = self.ring(observer)
                except SandboxError as exc:
                    last_error = str(exc)
                else:
                    last_error = ""
                    if all(a in seen and seen[a].up_normal for a in wanted):
                        return
                if time.monotonic() > deadline:
                    view = (
                        ", ".join(f"{m.status}{m.state} {a}" for a, m in sorted(seen.items()))
                        or "nothing"
                    )
                    raise SandboxError(
                        f"{observer.name} did not see {sorted(wanted)} Up/Normal within {timeout:.0f} s; "
                        f"it sees {view}. {last_error}"
                    )
                stop.wait(poll)

        # Every node's view at once (a nodetool JVM each), not one after the other.
        each_at_once(expected, observe)
        # Up/Normal in gossip comes before the native transport: wait for CQL too.
        for node in expected:
            while not _accepts(node.address, NATIVE_PORT):
                self._check_running(expected)
                if time.monotonic() > deadline:
                    raise SandboxError(
                        f"{node.name} is Up/Normal but takes no CQL connections on"
                        f" {node.address}:{NATIVE_PORT} within {timeout:.0f} s"
                    )
                time.sleep(min(poll, 0.5))
        self._cql.wait(wanted, deadline, timeout)

    def refresh(self) -> list[NodeInfo]:
        """Read every node's LUN facts (which loop device each LUN is mounted from) from the
        system again: after someone else (an agent's restore, a test) unmounted and mounted them."""
        for info in list(self._nodes):
            self._refresh_luns(info)
        return self.nodes

    def _check_running(self, nodes: Sequence[NodeInfo]) -> None:
        for node in nodes:
            state = self.container_state(node)
            if state != "running":
                raise SandboxError(
                    f"{node.name}'s container {node.container_name} is {state}, not running;"
                    f" see `docker logs {node.container_name}`"
                )

    def wait_for_session(self, *, timeout: float = 120) -> None:
        """Wait until the open driver session queries every node again: after a restore restarted
        the ring, the nodes answer CQL before the session has reconnected to them."""
        self._cql.wait({n.address for n in self._nodes}, time.monotonic() + timeout, timeout)

    def close_session(self) -> None:
        """Shut the driver session down; the next `session()` opens a new one."""
        self._cql.close()

    def stop_node(self, node: str | int | NodeInfo, *, timeout: int = 60) -> None:
        """Stop one node's container (SIGTERM, then SIGKILL after timeout); its LUNs stay mounted."""
        info = self.node(node)
        log.info("stopping sandbox node (requested)", node=info.name, container=info.container_name)
        run(["docker", "stop", "--time", str(timeout), info.container_name], timeout=timeout + 60)

    def start_node(self, node: str | int | NodeInfo, *, timeout: float | None = None) -> None:
        """Start a stopped node's container again and wait until the cluster sees it Up/Normal.

        Its LUNs must be mounted (see `pool.mount_lun`); the container binds the mount points anew.
        """
        info = self.node(node)
        for lun in info.luns:
            if current_loop_device(lun) is None:
                raise SandboxError(
                    f"cannot start {info.name}: {lun.volume_name} is not mounted at {lun.mount_point}"
                )
        limit = timeout or self.start_timeout
        before = self._startup_count(info)
        log.info("starting sandbox node", node=info.name, container=info.container_name)
        run(["docker", "start", info.container_name])
        deadline = time.monotonic() + limit
        while self._startup_count(info) <= before:
            if not self.node_running(info):
                raise SandboxError(
                    f"{info.name} exited while starting; see `docker logs {info.container_name}`"
                )
            if time.monotonic() > deadline:
                raise SandboxError(
                    f"{info.name} did not log {STARTUP_MESSAGE!r} within {limit:.0f} s"
                )
            time.sleep(1.0)
        self._refresh_luns(info)
        self.wait_until_up_normal([n for n in self._nodes if self.node_running(n)])

    def _refresh_luns(self, info: NodeInfo) -> NodeInfo:
        # A LUN mounted again may sit on another loop device: keep the NodeInfo current.
        fresh = replace(
            info,
            data_lun=replace(info.data_lun, loop_device=current_loop_device(info.data_lun)),
            commitlog_lun=replace(
                info.commitlog_lun, loop_device=current_loop_device(info.commitlog_lun)
            ),
        )
        self._nodes = [fresh if n.index == info.index else n for n in self._nodes]
        return fresh

    def node_running(self, node: str | int | NodeInfo) -> bool:
        return self.container_state(node) == "running"

    def container_state(self, node: str | int | NodeInfo) -> str:
        info = self.node(node)
        proc = run(
            ["docker", "inspect", "--format", "{{.State.Status}}", info.container_name], check=False
        )
        return proc.stdout.strip() if proc.returncode == 0 else "missing"

    def _startup_count(self, info: NodeInfo) -> int:
        logs = run(["docker", "logs", info.container_name], timeout=60)
        return (logs.stdout + logs.stderr).count(STARTUP_MESSAGE)

    def status(self) -> list[NodeState]:
        """Per node: container state, ring state (seen from the first running node), mounts."""
        ring: dict[str, RingMember] = {}
        for node in self._nodes:
            if self.node_running(node):
                try:
                    ring = self.ring(node)
                    break
                except SandboxError as exc:
                    log.warning("nodetool status failed", node=node.name, error=str(exc))
        return [
            NodeState(
                node=node,
                container=self.container_state(node),
                ring=ring.get(node.address),
                devices=(
                    current_loop_device(node.data_lun),
                    current_loop_device(node.commitlog_lun),
                ),
            )
            for node in self._nodes
        ]


def _accepts(address: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((address, port), timeout):
            return True
    except OSError:
        return False


__all__ = ["NodeInfo", "NodeState", "SandboxCluster", "down"]
