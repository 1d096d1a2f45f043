"""The whole ringsnap stack around a running sandbox cluster, as background processes: what
`ringsnap sandbox up` starts so that a newcomer can type `ringsnap backup sandbox` themselves.

- an agent per node: `ringsnap-agent serve --config services/agent-nodeN.toml`, listening on the
  node's own address, 127.0.k.i:7443, with a certificate for that address (mutual TLS);
- one array simulator (ONTAP, FlashArray or E-Series) over the instance's LUN pool:
  `python -m ringsnap.plugins.simulators VENDOR --pool ... --tls-dir ...`, HTTPS on 127.0.0.1;
- the coordinator: `ringsnap-coordinator serve --config services/coordinator.toml`, API on
  127.0.0.1:27000+k, metrics on 127.0.0.1:28000+k (k: the instance's slot), catalog and API token
  in services/coordinator/;
- Prometheus (Debian's package) on 127.0.0.1:29000+k, scraping the coordinator and the agents'
  metrics (node i's on 127.0.k.i:9445) with monitoring/alerts.yml loaded (`prometheus.py`).

`ringsnap` finds that coordinator with `export RINGSNAP_CONFIG=<instance>/services/coordinator.toml`
(`--config` > $RINGSNAP_CONFIG > /etc/ringsnap/coordinator.toml); `up` prints the line. Every
process is recorded (pid and start time) in the instance's services.json as soon as it starts;
`ringsnap sandbox down` stops them all (`processes.py`). Logs: services/logs/<name>.log.
"""

from __future__ import annotations

import json
import re
import shlex
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from ringsnap.config import validate
from ringsnap.coordinator.api.token import token_path
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.logs import get_logger
from ringsnap.sandbox import prometheus
from ringsnap.sandbox.cluster import SandboxCluster
from ringsnap.sandbox.errors import SandboxError
from ringsnap.sandbox.instance import InstanceLayout
from ringsnap.sandbox.processes import (
    ServiceProcess,
    ServicesState,
    find_service_processes,
    is_running,
    load_state,
    log_tail,
    save_state,
    spawn,
    stop_processes,
)

log = get_logger(__name__)

VENDORS = ("ontap", "flasharray", "eseries")
#: The cluster's name in the coordinator's config: `ringsnap backup sandbox`.
CLUSTER_NAME = "sandbox"
DEFAULT_VENDOR = "ontap"
START_TIMEOUT_SECONDS = 90.0
_SIMULATOR_URL = re.compile(r"simulator on (https://127\.0\.0\.1:\d+)")
Reporter = Callable[[str], None]


@dataclass(frozen=True)
class ServiceView:
    """One process of the instance and whether it runs now; `recorded` False: found by its
    command line only (a crashed `up` started it and never recorded it)."""

    process: ServiceProcess
    running: bool
    recorded: bool = True


@dataclass(frozen=True)
class Services:
    """The instance's background processes: the recorded ones and any unrecorded ones."""

    layout: InstanceLayout
    vendor: str
    config_file: Path
    views: list[ServiceView]
    #: S3Proxy's endpoint and the playground's bucket ("" from an `up` before S3 was added).
    s3_endpoint: str = ""
    s3_bucket: str = ""

    @property
    def all_running(self) -> bool:
        """Every recorded process runs, and no unrecorded one does."""
        return bool(self.views) and all(v.running and v.recorded for v in self.views)

    @property
    def unrecorded(self) -> list[ServiceProcess]:
        return [v.process for v in self.views if not v.recorded]

    @property
    def export_line(self) -> str:
        return export_line(self.config_file)


def export_line(config_file: Path) -> str:
    return f"export RINGSNAP_CONFIG={shlex.quote(str(config_file))}"


def current(layout: InstanceLayout) -> Services | None:
    """The instance's processes: what `services.json` records, checked against /proc, and the
    live ones it does not record (found by their command line). None: there are none."""
    try:
        state = load_state(layout.services_file)
    except SandboxError as exc:
        log.warning("ignoring unreadable process records", error=str(exc))
        state = ServicesState()
    views = [ServiceView(p, is_running(p)) for p in state.processes]
    live = {v.process.pid for v in views if v.running}
    views += [
        ServiceView(p, running=True, recorded=False)
        for p in find_service_processes(layout.services_dir)
        if p.pid not in live
    ]
    if not views:
        return None
    config = Path(state.details.get("config", str(layout.coordinator_config)))
    details = state.details
    s3 = {"s3_endpoint": details.get("s3", ""), "s3_bucket": details.get("s3_bucket", "")}
    return Services(layout, details.get("array", "?"), config, views, **s3)


# -- TOML ------------------------------------------------------------------------------------------

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(key: str) -> str:
    return key if _BARE_KEY.match(key) else json.dumps(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str | Path):
        # JSON's string escapes (\" \\ \n \uXXXX ...) are all valid in a TOML basic string.
        return json.dumps(str(value))
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(item) for item in value) + "]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


def _is_flat(table: Mapping[str, Any]) -> bool:
    return not any(isinstance(v, Mapping) or _is_table_array(v) for v in table.values())


def _is_table_array(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, Mapping) for v in value)


def _table(path: list[str], table: Mapping[str, Any], lines: list[str], header: str) -> None:
    """Scalars and inline arrays first (a flat array of tables, e.g. a node's volumes, as one
    inline table per line), then sub-tables and nested arrays of tables."""
    plain = {
        k: v
        for k, v in table.items()
        if not isinstance(v, Mapping) and not (_is_table_array(v) and not all(map(_is_flat, v)))
    }
    nested = {k: v for k, v in table.items() if k not in plain}
    if header and (plain or not nested):
        lines.append(header)
    for key, value in plain.items():
        if _is_table_array(value):
            lines.append(f"{_key(key)} = [")
            lines += [f"  {_value(item)}," for item in value]
            lines.append("]")
        else:
            lines.append(f"{_key(key)} = {_value(value)}")
    if plain or (header and not nested):
        lines.append("")
    for key, value in nested.items():
        name = ".".join(map(_key, [*path, key]))
        if isinstance(value, Mapping):
            _table([*path, key], value, lines, f"[{name}]")
        else:
            for item in value:
                _table([*path, key], item, lines, f"[[{name}]]")


def toml_document(data: Mapping[str, Any], comment: str = "") -> str:
    """`data` (tables, arrays of tables, strings, numbers, booleans, lists) as TOML."""
    lines = [f"# {line}".rstrip() for line in comment.splitlines()]
    if lines:
        lines.append("")
    _table([], data, lines, "")
    return "\n".join(lines).rstrip("\n") + "\n"


# -- starting --------------------------------------------------------------------------------------


def _entry_point(script: str, module: str) -> list[str]:
    """The console script next to this interpreter (what an operator types), else `-m module`."""
    installed = Path(sys.executable).parent / script
    return [str(installed)] if installed.is_file() else [sys.executable, "-m", module]


def _accepts(address: str, timeout: float = 0.5) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout):
            return True
    except OSError:
        return False


class _Launcher:
    """Starts processes, records each at once, and stops them all if a later one fails."""

    def __init__(self, layout: InstanceLayout, details: dict[str, str]) -> None:
        self.layout = layout
        self.state = ServicesState([], details)
        self.popen: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, kind: str, argv: list[str], address: str = "") -> ServiceProcess:
        logs = self.layout.services_dir / "logs"
        record, process = spawn(
            name, kind, argv, logs / f"{name}.log", cwd=self.layout.services_dir, address=address
        )
        self.popen[name] = process
        self.state.processes.append(record)
        save_state(self.layout.services_file, self.state)
        return record

    def set_address(self, record: ServiceProcess, address: str) -> ServiceProcess:
        updated = replace(record, address=address)
        self.state.processes = [updated if p == record else p for p in self.state.processes]
        save_state(self.layout.services_file, self.state)
        return updated

    def wait(self, record: ServiceProcess, ready: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        process = self.popen[record.name]
        while not ready():
            code = process.poll()
            if code is not None:
                raise SandboxError(
                    f"{record.name} exited with status {code} while starting; its log"
                    f" {record.log}:\n{log_tail(record.log)}"
                )
            if time.monotonic() > deadline:
                raise SandboxError(
                    f"{record.name} did not {what} within {START_TIMEOUT_SECONDS:.0f} s; its log"
                    f" {record.log}:\n{log_tail(record.log)}"
                )
            time.sleep(0.2)

    def abort(self) -> None:
        try:
            stop_processes(self.state.processes)
        finally:
            self.layout.services_file.unlink(missing_ok=True)


def _write_pki(cluster: SandboxCluster, directory: Path) -> tuple[Path, dict[str, Any]]:
    """A fresh CA, an agent certificate per node (for its own address) and the coordinator's."""
    from ringsnap.plugins.testing.pki import TestCA
    from ringsnap.sandbox.agents import COORDINATOR_IDENTITY, TestPki

    ca = TestCA.create("ringsnap sandbox CA")
    ca_file = ca.write_ca(directory / "ca.crt")
    client = ca.issue(COORDINATOR_IDENTITY)
    per_node = {}
    for node in cluster.nodes:
        agent = ca.issue(
            "ringsnap-agent", dns=["localhost"], ips=["127.0.0.1", node.address]
        ).write(directory, f"agent-{node.name}")
        per_node[node.name] = TestPki(directory, ca, ca_file, agent, client)
    return ca_file, per_node


def _simulator(vendor: str, directory: Path) -> tuple[list[str], dict[str, Any]]:
    """The simulator's login arguments and the matching `[arrays.array1]` settings."""
    secret = directory / f"{vendor}.secret"
    secret.parent.mkdir(parents=True, exist_ok=True)
    secret.touch(mode=0o600)
    secret.write_text("sandbox-secret\n")
    if vendor == "ontap":
        return (
            ["--username", "ringsnap", "--password-file", str(secret)],
            {"svm": "svm0", "username": "ringsnap", "password_file": str(secret)},
        )
    if vendor == "flasharray":
        # The FlashArray simulator takes its password as the API token (of user pureuser).
        return (
            ["--username", "pureuser", "--password-file", str(secret)],
            {"api_token_file": str(secret)},
        )
    if vendor == "eseries":
        return (
            ["--username", "ringsnap", "--password-file", str(secret)],
            {"username": "ringsnap", "password_file": str(secret)},
        )
    raise SandboxError(f"unknown array simulator {vendor!r}; choose one of {', '.join(VENDORS)}")


def start(
    cluster: SandboxCluster, vendor: str = DEFAULT_VENDOR, report: Reporter | None = None
) -> Services:
    """Start agents, the simulator and the coordinator for `cluster` (running), record them and
    return them. Already running with this vendor: returns them untouched. Some died: the rest
    are stopped and all are started again (the catalog is kept). On failure nothing is left
    running and the error quotes the failing process's log."""
    from ringsnap.sandbox.agents import write_config
    from ringsnap.sandbox.pitr import pitr_table
    from ringsnap.sandbox.s3_service import start_s3
    from ringsnap.sandbox.stack import (
        ARRAY_NAME,
        agent_data,
        coordinator_data,
        host_objects,
        present_volumes,
    )

    say = report or (lambda _message: None)
    if vendor not in VENDORS:
        raise SandboxError(
            f"unknown array simulator {vendor!r}; choose one of {', '.join(VENDORS)}"
        )
    layout = cluster.layout
    # Before the agents: each ships its commit log to the bucket as soon as it runs.
    s3 = start_s3(layout, say)
    existing = current(layout)
    if existing is not None:
        if existing.all_running and existing.vendor == vendor:
            return existing
        if existing.all_running:
            raise SandboxError(
                f"sandbox {layout.name!r} runs the {existing.vendor} simulator, not {vendor}:"
                f" `ringsnap sandbox down --instance {layout.name}` first"
            )
        say("some services of an earlier `up` stopped or were never recorded: restarting all")
        stop_processes(v.process for v in existing.views)
        layout.services_file.unlink(missing_ok=True)

    directory = layout.services_dir
    directory.mkdir(parents=True, exist_ok=True)
    config_file = layout.coordinator_config
    details = {"array": vendor, "config": str(config_file)}
    details |= {"s3": s3.endpoint_url, "s3_bucket": s3.table["bucket"]}
    launcher = _Launcher(layout, details)
    try:
        say(f"starting an agent per node ({len(cluster.nodes)})")
        ca_file, pki = _write_pki(cluster, directory / "pki")
        agents: dict[str, ServiceProcess] = {}
        for node in cluster.nodes:
            address = layout.agent_address(node.index)
            data = agent_data(
                cluster, node, pki[node.name], directory / "agent-state" / node.name, address
            )
            data["log"] = {"json": True, "level": "info"}
            # Exports and restores from S3 as in production, and the commit log shipped as it
            # grows (`restore --to`): the sandbox's cassandra.yaml archives every segment.
            data["s3"] = s3.table
            data["pitr"] = pitr_table(node)
            # On the node's own loopback address, as on a real node: the sandbox's Prometheus.
            data["metrics"] = {"enabled": True, "listen": layout.agent_metrics_address(node.index)}
            agent_config = write_config(directory / f"agent-{node.name}.toml", data)
            argv = [
                *_entry_point("ringsnap-agent", "ringsnap.agent.main"),
                "serve",
                "--config",
                str(agent_config),
            ]
            agents[node.name] = launcher.start(f"agent-{node.name}", "agent", argv, address)
        for record in agents.values():
            launcher.wait(record, partial(_accepts, record.address), f"listen on {record.address}")

        say(f"starting the {vendor} array simulator")
        login, settings = _simulator(vendor, directory / "simulator")
        tls_dir = directory / "simulator" / "tls"
        simulator = launcher.start(
            "simulator",
            "simulator",
            [
                sys.executable,
                "-m",
                "ringsnap.plugins.simulators",
                vendor,
                "--pool",
                str(cluster.pool_dir),
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--tls-dir",
                str(tls_dir),
                "--json-logs",
                "--fabric-loops",
                *(f"--host-object={name}={iqn}" for name, iqn in host_objects(cluster).items()),
                *login,
            ],
        )
        found: list[str] = []

        def simulator_ready() -> bool:
            match = _SIMULATOR_URL.search(log_tail(simulator.log, 200))
            if match is None:
                return False
            found[:] = [match.group(1)]
            return _accepts(found[0].removeprefix("https://"))

        launcher.wait(simulator, simulator_ready, "serve HTTPS")
        url = found[0]
        simulator = launcher.set_address(simulator, url)
        table = {"driver": vendor, "endpoint": url, "ca_file": str(tls_dir / "ca.pem"), **settings}
        present_volumes(table)

        say("starting the coordinator")
        listen = layout.coordinator_listen
        catalog = directory / "coordinator" / "catalog.db"
        catalog.parent.mkdir(parents=True, exist_ok=True, mode=0o750)
        client = pki[cluster.nodes[0].name].client.write(directory / "pki", "coordinator")
        data = coordinator_data(
            cluster,
            {name: record.address for name, record in agents.items()},
            table,
            client=client,
            ca_file=ca_file,
            coordinator={
                "listen": listen,
                "metrics_listen": layout.metrics_listen,
                "catalog": str(catalog),
            },
        )
        data["retention"] = {"playground": {"daily": 7, "min_count": 3}}
        data["s3"] = s3.table
        data["clusters"][0]["pitr"] = True  # the daemon writes the time canaries of `--to`
        text = toml_document(
            data,
            f"The coordinator of sandbox instance {layout.name!r}, written by `ringsnap sandbox"
            " up`.\nUse it: " + export_line(config_file) + "\nArray "
            f"{ARRAY_NAME}: the {vendor} simulator at {url}; its log: {simulator.log}.",
        )
        validate(tomllib.loads(text), CoordinatorConfig, source=str(config_file))
        config_file.write_text(text)
        token = token_path(catalog)
        token.unlink(missing_ok=True)  # the coordinator writes a fresh one when it is ready
        coordinator = launcher.start(
            "coordinator",
            "coordinator",
            [
                *_entry_point("ringsnap-coordinator", "ringsnap.coordinator.main"),
                "serve",
                "--config",
                str(config_file),
                "--log-format",
                "json",
            ],
            listen,
        )
        launcher.wait(
            coordinator,
            lambda: token.is_file() and _accepts(listen),
            f"serve its API on {listen}",
        )

        say("starting Prometheus with the shipped alert rules")
        nodes = [layout.agent_metrics_address(node.index) for node in cluster.nodes]
        config, data_directory = prometheus.write_config(
            directory / "prometheus", layout.metrics_listen, nodes, CLUSTER_NAME
        )
        watcher = launcher.start(
            "prometheus",
            "prometheus",
            prometheus.argv(config, data_directory, layout.prometheus_listen),
            f"http://{layout.prometheus_listen}",
        )
        launcher.wait(
            watcher,
            partial(prometheus.ready, layout.prometheus_listen),
            f"serve on {layout.prometheus_listen}",
        )
    except BaseException:
        launcher.abort()
        raise
    log.info("sandbox services up", instance=layout.name, array=vendor, config=str(config_file))
    found_now = current(layout)
    assert found_now is not None
    return found_now
