"""The whole ringsnap stack around a sandbox cluster: an agent per node, an array simulator over
the cluster's LUN pool, and the coordinator configuration that ties them together.

Used by `ringsnap sandbox demo` and by the integration tests, so that both run exactly what an
operator would: real agents over mutual TLS, a driver speaking the vendor's REST API, the real
coordinator.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ringsnap.agent.config import AgentConfig
from ringsnap.config import validate
from ringsnap.coordinator.api.token import token_path
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.plugins.registry import open_driver
from ringsnap.plugins.simulators import fabric
from ringsnap.plugins.simulators.flasharray import FlashArrayOptions, FlashArraySimulator
from ringsnap.plugins.simulators.lunpool import LunPool
from ringsnap.plugins.simulators.ontap import OntapSimulator
from ringsnap.plugins.simulators.server import SimulatorApp, SimulatorServer, serving
from ringsnap.plugins.simulators.tls import make_test_ca
from ringsnap.plugins.testing.pki import TlsPaths
from ringsnap.sandbox import services
from ringsnap.sandbox.agents import BackgroundAgent, TestPki, config_data, write_config
from ringsnap.sandbox.cluster import NodeInfo, SandboxCluster
from ringsnap.sandbox.image import cassandra_home, java17_flags
from ringsnap.sandbox.pitr import disarm, pitr_table

ARRAY_NAME = "array1"
#: The drill host's host object on the sandbox's array.
DRILL_HOST = "drill-host"


def host_objects(cluster: SandboxCluster) -> dict[str, str]:
    """The array's host objects of the sandbox (named as its nodes, and the drill host), each
    with its iSCSI initiator: what an administrator creates on a real array once, and what the
    coordinator's `array_host` names. Presenting a clone maps it to one of them."""
    names = [node.name for node in cluster.nodes] + [DRILL_HOST]
    return {name: f"iqn.2026-11.net.ringsnap.sandbox:{name}" for name in names}


CLUSTER_NAME = services.CLUSTER_NAME
VENDORS = ("ontap", "flasharray", "eseries")
_SECRET = "sandbox-secret"  # noqa: S105 - the simulators' throwaway login


@dataclass
class ArraySimulator:
    vendor: str
    app: SimulatorApp
    server: SimulatorServer
    #: The `[arrays.<name>]` table a coordinator needs to reach it.
    table: dict[str, Any]


@contextlib.contextmanager
def array_simulator(vendor: str, pool: LunPool, workdir: Path) -> Iterator[ArraySimulator]:
    """Serve one vendor's simulator over TLS (a fresh test CA) on 127.0.0.1."""
    certificates = make_test_ca(workdir / "tls")
    secret = workdir / f"{vendor}.secret"
    secret.write_text(_SECRET + "\n")
    secret.chmod(0o600)
    app: SimulatorApp
    if vendor == "ontap":
        app = OntapSimulator(pool, username="ringsnap", password=_SECRET)
        extra: dict[str, Any] = {
            "svm": "svm0",
            "username": "ringsnap",
            "password_file": str(secret),
        }
    elif vendor == "flasharray":
        app = FlashArraySimulator(
            pool, FlashArrayOptions(array_name="sandbox-fa", api_tokens={_SECRET: "pureuser"})
        )
        extra = {"api_token_file": str(secret)}
    elif vendor == "eseries":
        from ringsnap.plugins.simulators.eseries import ESeriesSimulator

        app = ESeriesSimulator(pool, username="ringsnap", password=_SECRET)
        extra = {"username": "ringsnap", "password_file": str(secret)}
    else:
        raise ValueError(f"unknown simulator {vendor!r}; choose one of {', '.join(VENDORS)}")
    with serving(app, tls=certificates.server_tls) as server:
        table = {
            "driver": vendor,
            "endpoint": server.url,
            "ca_file": str(certificates.ca_file),
            **extra,
        }
        present_volumes(table)
        yield ArraySimulator(vendor, app, server, table)


class ProcessAgent:
    """`ringsnap-agent serve` as its own process, as on a real node (no GIL shared with the
    coordinator): what the benchmarks measure."""

    def __init__(self, config_file: Path, port: int) -> None:
        self._config_file = config_file
        self.address = f"127.0.0.1:{port}"
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> ProcessAgent:
        # Its journal beside its config: read when a test fails, searched by the secrets check.
        with self._config_file.with_suffix(".log").open("ab") as log:
            self._process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "ringsnap.agent.main",
                    "serve",
                    "--config",
                    str(self._config_file),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        host, port = self.address.split(":")
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError), socket.create_connection((host, int(port)), 0.5):
                return self
            if self._process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"agent {self._config_file} did not start")
            time.sleep(0.1)

    def __exit__(self, *exc: object) -> None:
        if self._process is not None:
            self._process.terminate()  # SIGTERM: the agent thaws what it froze, then exits
            self._process.wait(30)

    @property
    def pid(self) -> int:
        assert self._process is not None, "agent not started"
        return self._process.pid

    def kill(self) -> None:
        """SIGKILL, as a crash or the OOM killer: none of the agent's own clean-up runs."""
        if self._process is not None:
            self._process.kill()
            self._process.wait(30)

    def restart(self) -> None:
        """A new process on the same config (after `kill`), as systemd restarts it."""
        self.__enter__()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def coordinator_data(
    cluster: SandboxCluster,
    agents: Mapping[str, str],
    array_table: Mapping[str, Any],
    *,
    client: TlsPaths,
    ca_file: Path,
    coordinator: Mapping[str, Any],
    **cluster_settings: Any,
) -> dict[str, Any]:
    """The coordinator's configuration for `cluster` (named "sandbox") as plain data: the agent
    address of every node (`agents`, by node name), its two LUNs on the one array."""
    nodes = [
        {
            "name": node.name,
            "agent": agents[node.name],
            # Its host object on the array (`host_objects`): clones are presented to it.
            "array_host": node.name,
            "volumes": [
                {"array": ARRAY_NAME, "volume": node.data_lun.volume_name, "role": "data"},
                {
                    "array": ARRAY_NAME,
                    "volume": node.commitlog_lun.volume_name,
                    "role": "commitlog",
                },
            ],
        }
        for node in cluster.nodes
    ]
    return {
        "coordinator": dict(coordinator),
        "tls": {
            "cert_file": str(client.cert),
            "key_file": str(client.key),
            "ca_file": str(ca_file),
        },
        "clusters": [
            {
                "name": CLUSTER_NAME,
                "contact_points": cluster.addresses,
                "nodes": nodes,
                # Every sandbox node is in Cassandra's seed list: a restore starts them together
                # (one seed started alone waits out its shadow round for the others, ~30 s).
                "seeds": [node.name for node in cluster.nodes],
                **cluster_settings,
            }
        ],
        "arrays": {ARRAY_NAME: dict(array_table)},
    }


@dataclass
class Stack:
    """Agents and an array around `cluster`; `coordinator_config()` is ready to open."""

    cluster: SandboxCluster
    workdir: Path
    pki: TestPki
    agents: dict[str, BackgroundAgent | ProcessAgent]
    array: ArraySimulator
    coordinator_settings: dict[str, Any] = field(default_factory=dict)
    #: The drill host's agent (`running_stack(..., drill_host=True)`), else None.
    drill_agent: ProcessAgent | None = None
    #: Each node's agent metrics address (`running_stack(..., agent_metrics=True)`), by node name.
    agent_metrics: dict[str, str] = field(default_factory=dict)

    def coordinator_data(self, **cluster_settings: Any) -> dict[str, Any]:
        client = self.pki.client.write(self.workdir / "pki", "coordinator")
        if self.drill_agent is not None:
            # The cluster's drill host (`[clusters.drill]`), for `ringsnap drill`.
            cluster_settings.setdefault(
                "drill", {"agent": self.drill_agent.address, "array_host": DRILL_HOST}
            )
        return coordinator_data(
            self.cluster,
            {name: agent.address for name, agent in self.agents.items()},
            self.array.table,
            client=client,
            ca_file=self.pki.ca_file,
            coordinator={
                "listen": "127.0.0.1:0",
                "metrics_listen": "127.0.0.1:0",
                "catalog": str(self.workdir / "catalog.db"),
                **self.coordinator_settings,
            },
            **cluster_settings,
        )

    def coordinator_config(self, **cluster_settings: Any) -> CoordinatorConfig:
        return validate(
            self.coordinator_data(**cluster_settings), CoordinatorConfig, source="<sandbox>"
        )

    @contextlib.contextmanager
    def coordinator_daemon(
        self, *, top: Mapping[str, Any] | None = None, **cluster_settings: Any
    ) -> Iterator[Path]:
        """`ringsnap-coordinator serve` on this stack's config, as its own process holding the
        catalog, API on a free loopback port, until the block ends; yields the config file that
        `ringsnap --config` is given (the CLI then works through the daemon). `top`: tables added
        at the top of the config (`schedules`, `retention`)."""
        data = {**self.coordinator_data(**cluster_settings), **(top or {})}
        listen = f"127.0.0.1:{_free_port()}"
        data["coordinator"]["listen"] = listen
        config_file = self.workdir / "coordinator.toml"
        config_file.write_text(services.toml_document(data, "written by Stack.coordinator_daemon"))
        token = token_path(Path(data["coordinator"]["catalog"]))
        token.unlink(missing_ok=True)  # the daemon writes a fresh one once it serves
        log_file = self.workdir / "coordinator.log"
        with log_file.open("ab") as log:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "ringsnap.coordinator.main",
                    "serve",
                    "--config",
                    str(config_file),
                    "--log-format",
                    "json",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            deadline = time.monotonic() + 60
            host, port = listen.split(":")
            while True:
                if token.is_file():
                    with (
                        contextlib.suppress(OSError),
                        socket.create_connection((host, int(port)), 0.5),
                    ):
                        break
                if process.poll() is not None or time.monotonic() > deadline:
                    tail = log_file.read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"the coordinator daemon did not serve on {listen}: {tail}")
                time.sleep(0.2)
            yield config_file
        finally:
            process.terminate()
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


#: The agent's `[volumes]` table exists once the restore's agent config has landed.
AGENT_HAS_VOLUMES = "volumes" in AgentConfig.model_fields


def hook_argv(action: str, pool_dir: Path) -> list[str]:
    """The agent's `[volumes]` detach/attach command for the sandbox (loop devices of the pool)."""
    return [
        sys.executable,
        "-m",
        "ringsnap.sandbox.hooks",
        action,
        "--pool",
        str(pool_dir),
    ]


def restore_settings(cluster: SandboxCluster, node: NodeInfo) -> dict[str, dict[str, Any]]:
    """What an agent needs to restore its node in the sandbox: stop and start the node's
    container (it binds its LUN mount points anew at `docker start`, so a LUN mounted again is
    what the restarted node sees) and the `[volumes]` hooks that detach and attach its LUNs.

    `volumes` is left out while the agent's configuration has no such table.
    """
    settings: dict[str, dict[str, Any]] = {
        "cassandra": {
            "stop_command": ["docker", "stop", "--time", "60", node.container_name],
            "start_command": ["docker", "start", node.container_name],
        }
    }
    if AGENT_HAS_VOLUMES:
        settings["volumes"] = {
            "detach_command": hook_argv("detach", cluster.pool_dir),
            "attach_command": hook_argv("attach", cluster.pool_dir),
            # The sandbox's fabric: the simulators name each LUN image by its WWN there.
            "by_id_dir": str(fabric.by_id_dir(cluster.pool_dir)),
        }
    return settings


def present_volumes(table: Mapping[str, Any]) -> None:
    """Ask the array for its volumes once, through the real driver: the simulator names every
    LUN image by its WWN on the sandbox's fabric as it answers (`simulators.fabric`), before any
    agent is asked what is under its directories."""
    driver = open_driver(ARRAY_NAME, dict(table), "<sandbox>")
    try:
        driver.list_volumes()
    finally:
        driver.close()


def agent_data(
    cluster: SandboxCluster, node: NodeInfo, pki: TestPki, state_directory: Path, listen: str
) -> dict[str, Any]:
    """The agent.toml of one sandbox node, as plain data."""
    restore = restore_settings(cluster, node)
    data = config_data(
        pki,
        data_directories=[node.data_dir],
        commitlog_directory=node.commitlog_dir,
        state_directory=state_directory,
        nodetool=node.nodetool_argv(),
        # Where the node keeps the rest of what it replays or reloads at start: a restore from
        # native snapshots empties them (an array restore keeps them: they are on the data LUN).
        cassandra={
            "jolokia_url": node.jolokia_url,
            "saved_caches_directory": str(node.saved_caches_dir),
            "hints_directory": str(node.hints_dir),
            **restore.pop("cassandra"),
        },
        listen=listen,
    )
    data["volumes"] = {**data["volumes"], **restore.pop("volumes", {})}
    data.update(restore)
    return data


def drill_jvm_options(jit: str) -> list[str]:
    """The drill nodes' Java flags: Cassandra's, and the sandbox nodes' JIT. With `quick` (C1 only,
    as the ring's nodes) a drill node needs about half the CPU to start: every drill of the tests
    starts one Cassandra per node on this 2-core machine, beside the ring."""
    return [*java17_flags(), *(["-XX:TieredStopAtLevel=1"] if jit == "quick" else [])]


def drill_host_data(
    cluster: SandboxCluster, pki: TestPki, workdir: Path, listen: str
) -> dict[str, Any]:
    """The agent.toml of the sandbox's drill host: the fabric's by-id directory, where presented
    clones appear, and a `[drill]` section running the host's Java with the cached Cassandra jars. It has no Cassandra
    of its own; `[cassandra]` (which every agent configuration requires) names empty directories
    of its work directory and a nodetool that always fails."""
    root = workdir / "drill-host"
    for name in ("no-cassandra/data", "no-cassandra/commitlog"):
        (root / name).mkdir(parents=True, exist_ok=True)
    data = config_data(
        pki,
        data_directories=[root / "no-cassandra" / "data"],
        commitlog_directory=root / "no-cassandra" / "commitlog",
        state_directory=root / "state",
        listen=listen,
    )
    # No attach hook: the drill host finds each clone by the identity the array gave when the
    # coordinator presented it (the fabric's loop device behind its by-id link), as on a SAN.
    data["volumes"] = {**data["volumes"], "by_id_dir": str(fabric.by_id_dir(cluster.pool_dir))}
    data["drill"] = {
        "cassandra_home": str(cassandra_home()),
        "jvm_options": drill_jvm_options(cluster.jit),
        "heap": "512M",
        "work_directory": str(root / "drills"),
        "start_timeout_seconds": 240.0,
        "stop_timeout_seconds": 60.0,
        "max_deadline_seconds": 1800.0,
    }
    data["log"] = {"json": True, "level": "info"}
    return data


@contextlib.contextmanager
def running_stack(
    cluster: SandboxCluster,
    workdir: Path,
    *,
    vendor: str = "ontap",
    agent_processes: bool = False,
    drill_host: bool = False,
    s3: dict[str, Any] | None = None,
    agent_metrics: bool = False,
    pitr: bool = False,
) -> Iterator[Stack]:
    """Agents for every node of `cluster` (threads, or processes) and a `vendor` simulator; with
    `drill_host`, a fourth agent process that runs restore drills (`Stack.drill_agent`); with
    `agent_metrics`, each agent serves its metrics on a free loopback port."""
    metrics: dict[str, str] = {}
    workdir.mkdir(parents=True, exist_ok=True)
    pki = TestPki.create(workdir / "pki")
    with contextlib.ExitStack() as stack:
        agents: dict[str, BackgroundAgent | ProcessAgent] = {}
        for node in cluster.nodes:
            port = _free_port() if agent_processes else 0
            data = agent_data(
                cluster,
                node,
                pki,
                state_directory=workdir / "agent-state" / node.name,
                listen=f"127.0.0.1:{port}",
            )
            if s3 is not None:
                data["s3"] = dict(s3)  # every node's `[s3]` table (docs/s3.md)
            if pitr:
                # Commit-log shipping (docs/pitr.md); disarmed again when the stack goes.
                data["pitr"] = pitr_table(node)
                stack.callback(disarm, node)
            if agent_metrics:
                metrics[node.name] = f"127.0.0.1:{_free_port()}"
                data["metrics"] = {"enabled": True, "listen": metrics[node.name]}
            if agent_processes:
                data["log"] = {"json": True, "level": "warning"}
                config_file = write_config(workdir / f"agent-{node.name}.toml", data)
                agents[node.name] = stack.enter_context(ProcessAgent(config_file, port))
            else:
                config = validate(data, AgentConfig, source=f"<agent {node.name}>")
                agents[node.name] = stack.enter_context(BackgroundAgent(config))
        # Mapped clones appear as loop devices behind their by-id links (`fabric`).
        pool = LunPool(cluster.pool_dir, fabric_loops=True)
        array = stack.enter_context(array_simulator(vendor, pool, workdir / vendor))
        for name, iqn in host_objects(cluster).items():
            array.app.add_host(name, iqn)
        drill_agent = None
        if drill_host:
            port = _free_port()
            config_file = write_config(
                workdir / "agent-drill-host.toml",
                drill_host_data(cluster, pki, workdir, f"127.0.0.1:{port}"),
            )
            drill_agent = stack.enter_context(ProcessAgent(config_file, port))
        yield Stack(
            cluster, workdir, pki, agents, array, drill_agent=drill_agent, agent_metrics=metrics
        )
