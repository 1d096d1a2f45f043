"""Isolated sandbox instances: names, directories, loopback addresses, JMX ports, container names.

Several instances run at once (people, parallel test sessions of several helpers). Each gets a slot
number k in 1..250, recorded under `<sandbox root>/.slots/` so that two live instances never share
one; from k follow its loopback addresses 127.0.k.i and JMX ports 17000 + 10k + i (node i = 1..9).
The instance's own services (`ringsnap sandbox up`): node i's agent on 127.0.k.i:7443, the
coordinator's API on 127.0.0.1:27000+k (gRPC's local credentials accept 127.0.0.1 only, not the
rest of 127/8) and its metrics on 127.0.0.1:28000+k, the agents' metrics on 127.0.k.i:9445, the
sandbox's Prometheus on 127.0.0.1:29000+k; the array simulator takes a free port.
The default instance "sandbox" prefers slot 1.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ringsnap.sandbox.errors import SandboxError

DEFAULT_INSTANCE = "sandbox"
MAX_NODES = 9
MAX_SLOT = 250
JMX_PORT_BASE = 17000
CONTAINER_PREFIX = "ringsnap-sandbox"
LABEL_INSTANCE = "io.ringsnap.sandbox.instance"
LABEL_NODE = "io.ringsnap.sandbox.node"
_NAME = re.compile(r"^[a-z][a-z0-9-]{0,30}$")
LUN_KINDS = ("data", "commitlog")
AGENT_PORT = 7443
COORDINATOR_PORT_BASE = 27000
METRICS_PORT_BASE = 28000
PROMETHEUS_PORT_BASE = 29000
AGENT_METRICS_PORT = 9445


def sandbox_root() -> Path:
    """Parent of every instance's root: $RINGSNAP_SANDBOX_ROOT, else /var/lib/ringsnap/sandbox."""
    return Path(os.environ.get("RINGSNAP_SANDBOX_ROOT", "/var/lib/ringsnap/sandbox"))


def validate_instance_name(name: str) -> str:
    """Instance names end up in paths, container names and volume names: keep them plain."""
    if not _NAME.match(name):
        raise SandboxError(
            f"instance name {name!r} is not allowed: use 1-31 lowercase letters, digits or '-', "
            "starting with a letter"
        )
    return name


def preferred_slot(name: str) -> int:
    """Where the search for a free slot starts: 1 for the default instance, else a hash of the name."""
    if name == DEFAULT_INSTANCE:
        return 1
    return 2 + int(hashlib.sha256(name.encode()).hexdigest(), 16) % (MAX_SLOT - 1)


def node_name(index: int) -> str:
    return f"node{index}"


def node_index(node: str) -> int:
    match = re.fullmatch(r"node([1-9])", node)
    if not match:
        raise SandboxError(f"no such node {node!r}: nodes are named node1..node{MAX_NODES}")
    return int(match.group(1))


def node_address(slot: int, index: int) -> str:
    """The loopback address of node `index` (1-based) of the instance in `slot`."""
    _check(slot, index)
    return f"127.0.{slot}.{index}"


def coordinator_listen(slot: int) -> str:
    """The API address of the coordinator of the instance in `slot`."""
    _check(slot, 1)
    return f"127.0.0.1:{COORDINATOR_PORT_BASE + slot}"


def metrics_listen(slot: int) -> str:
    """The Prometheus address of the coordinator of the instance in `slot`."""
    _check(slot, 1)
    return f"127.0.0.1:{METRICS_PORT_BASE + slot}"


def jmx_port(slot: int, index: int) -> int:
    """The JMX port (on 127.0.0.1) of node `index` (1-based) of the instance in `slot`."""
    _check(slot, index)
    return JMX_PORT_BASE + 10 * slot + index


def _check(slot: int, index: int) -> None:
    if not 1 <= slot <= MAX_SLOT:
        raise SandboxError(f"slot {slot} is outside 1..{MAX_SLOT}")
    if not 1 <= index <= MAX_NODES:
        raise SandboxError(f"node index {index} is outside 1..{MAX_NODES}")


def services_dir(root: Path) -> Path:
    """Configs, certificates, catalog, state and logs of the processes of the instance at `root`."""
    return root / "services"


def services_file(root: Path) -> Path:
    """Which processes run for the instance at `root` (pids and their start times)."""
    return root / "services.json"


@dataclass(frozen=True)
class InstanceLayout:
    """Where everything of one instance lives. Pure: computing it touches nothing."""

    name: str
    slot: int
    root: Path

    @property
    def pool_image(self) -> Path:
        return self.root / "pool.img"

    @property
    def pool_dir(self) -> Path:
        """Mount point of the XFS pool; LUN images live in `pool_dir/luns/`."""
        return self.root / "pool"

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    @property
    def services_dir(self) -> Path:
        return services_dir(self.root)

    @property
    def services_file(self) -> Path:
        return services_file(self.root)

    @property
    def coordinator_config(self) -> Path:
        """The coordinator's config: `export RINGSNAP_CONFIG=<this>` makes `ringsnap` use it."""
        return self.services_dir / "coordinator.toml"

    @property
    def coordinator_listen(self) -> str:
        return coordinator_listen(self.slot)

    @property
    def metrics_listen(self) -> str:
        return metrics_listen(self.slot)

    @property
    def prometheus_listen(self) -> str:
        """The sandbox's Prometheus (API and UI), 127.0.0.1:29000+k."""
        _check(self.slot, 1)
        return f"127.0.0.1:{PROMETHEUS_PORT_BASE + self.slot}"

    def agent_metrics_address(self, index: int) -> str:
        """Node `index`'s agent's metrics, on the node's own loopback address."""
        return f"{self.address(index)}:{AGENT_METRICS_PORT}"

    def agent_address(self, index: int) -> str:
        return f"{self.address(index)}:{AGENT_PORT}"

    def address(self, index: int) -> str:
        return node_address(self.slot, index)

    def jmx_port(self, index: int) -> int:
        return jmx_port(self.slot, index)

    def container_name(self, index: int) -> str:
        return f"{CONTAINER_PREFIX}-{self.name}-{node_name(index)}"

    def volume_name(self, index: int, kind: str) -> str:
        """The LUN's name as an array would show it, e.g. `sandbox-node1-data`."""
        if kind not in LUN_KINDS:
            raise SandboxError(f"unknown LUN kind {kind!r}")
        return f"{self.name}-{node_name(index)}-{kind}"

    def mount_point(self, index: int, kind: str) -> Path:
        if kind not in LUN_KINDS:
            raise SandboxError(f"unknown LUN kind {kind!r}")
        return self.root / "mnt" / node_name(index) / kind

    def labels(self, index: int | None = None) -> dict[str, str]:
        labels = {LABEL_INSTANCE: self.name}
        if index is not None:
            labels[LABEL_NODE] = node_name(index)
        return labels


def _slots_dir() -> Path:
    return sandbox_root() / ".slots"


def _read_slots() -> dict[int, str]:
    taken: dict[int, str] = {}
    slots = _slots_dir()
    if slots.is_dir():
        for entry in slots.iterdir():
            if entry.name.isdigit():
                taken[int(entry.name)] = entry.read_text().strip()
    return taken


def choose_slot(name: str, taken: dict[int, str]) -> int:
    """The slot for `name`: the one it already holds, else the first free one from its preferred slot."""
    for slot, holder in taken.items():
        if holder == name:
            return slot
    start = preferred_slot(name)
    for offset in range(MAX_SLOT):
        slot = (start - 1 + offset) % MAX_SLOT + 1
        if slot not in taken:
            return slot
    raise SandboxError(
        f"all {MAX_SLOT} sandbox slots are taken; remove stale instances with `ringsnap sandbox down --instance NAME`"
    )


def acquire(name: str) -> InstanceLayout:
    """The layout of instance `name`, reserving a slot for it if it has none yet."""
    validate_instance_name(name)
    slots = _slots_dir()
    slots.mkdir(parents=True, exist_ok=True)
    with (slots / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        slot = choose_slot(name, _read_slots())
        (slots / str(slot)).write_text(name + "\n")
    return InstanceLayout(name=name, slot=slot, root=sandbox_root() / name)


def lookup(name: str) -> InstanceLayout | None:
    """The layout of an instance that holds a slot, or None."""
    validate_instance_name(name)
    for slot, holder in _read_slots().items():
        if holder == name:
            return InstanceLayout(name=name, slot=slot, root=sandbox_root() / name)
    return None


def release(name: str) -> None:
    """Give the instance's slot back (after everything of it is gone)."""
    slots = _slots_dir()
    if not slots.is_dir():
        return
    with (slots / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for slot, holder in _read_slots().items():
            if holder == name:
                (slots / str(slot)).unlink(missing_ok=True)


def known_instances() -> list[str]:
    """Names of the instances that hold a slot (running or left over)."""
    return sorted(set(_read_slots().values()))
