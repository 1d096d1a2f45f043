"""The restore workflow's DAS path, end to end with the LVM driver: nodes on local disks.

Each node has a volume group with a thick data LV and a thin commit-log LV, each an ext4
filesystem mounted where the node keeps its Cassandra data and commit log. Everything between the
coordinator and the disks is the real thing: `plan_restore` and `RestoreWorkflow`, one real agent
per node over mutual TLS (its `[volumes]` hooks detach and attach the LVs), and the real
`LvmDriver`, run by each node's own agent for its own volumes (the agent's `[lvm]`), asked by the
coordinator's `NodeSnapshotPort` (driver `agent-lvm`: no lvm2 on the coordinator's side), against
- `emulated`: the lvm2 2.03.16 emulator, whose LVs are image files in a reflink XFS pool, attached
  as loop devices;
- `live`: real lvm2 on loop-device physical volumes; only where device-mapper works.

No Cassandra runs. A stand-in nodetool answers while a flag file exists, which the agent's
`start_command` creates and its `stop_command` removes: the node counts as running before the
restore (its host id is checked, a pre-restore canary written, a drain asked for, and the agent
refuses to release while it runs), and as serving once started again. Canary rows are files on the
node's mounted data filesystem, so the ring finds a canary exactly when the filesystem mounted
there holds it: a restore that put back anything but the snapshot fails its proof.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import uuid
import zlib
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import AsyncExitStack, ExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar, cast

import pytest

from ringsnap import mountinfo
from ringsnap.agent.config import AgentConfig
from ringsnap.config import validate
from ringsnap.coordinator.agents.connection import ClientTls, GrpcNodeAgent
from ringsnap.coordinator.agents.node_snapshots import NodeSnapshotPort
from ringsnap.coordinator.backup.model import BackupFailed, BackupRun, BackupSettings, NodeTarget
from ringsnap.coordinator.backup.workflow import BackupWorkflow
from ringsnap.coordinator.model import (
    Backup,
    BackupNode,
    BackupState,
    NodeVerdict,
    NodeVolume,
    QuiesceMode,
    RestoreMode,
    RestoreRecord,
    RestoreState,
    Verification,
    VolumeRole,
)
from ringsnap.coordinator.ports import AgentPort, FreezeReceipt, SSTable
from ringsnap.coordinator.restore.plan import RestorePlan, RestoreRequest, plan_restore
from ringsnap.coordinator.restore.record import new_restore_id
from ringsnap.coordinator.restore.workflow import RestoreSettings, RestoreWorkflow
from ringsnap.plugins.api import PreparedSnapshot
from ringsnap.plugins.lvm.config import LvmSettings
from ringsnap.plugins.lvm.runner import CommandResult, CommandRunner, SubprocessRunner
from ringsnap.plugins.simulators.lunpool import loop_devices_of, temporary_xfs_pool
from ringsnap.plugins.simulators.lvm2 import Lvm2Emulator
from ringsnap.plugins.testing import mounts
from ringsnap.plugins.types import SnapshotRef, Volume
from ringsnap.sandbox.agents import BackgroundAgent, TestPki, config_data
from tests.plugins.test_lvm import device_mapper_error
from tests.support.confined import assert_confined, confinement, run_confined

pytestmark = pytest.mark.integration

T = TypeVar("T")
NODES = ("node1", "node2", "node3")
SEED = "node1"
CLUSTER = "lvm-ring"  # as the stand-in nodetool names it
DATA_LV = "data"  # thick (linear) LV
COMMITLOG_LV = "commitlog"  # thin LV in the volume group's thin pool
LV_BYTES = 32 << 20
#: `<keyspace>/<table>-<table id>` below the Cassandra data directory.
TABLE = "shop/orders-6f1ba3d0c8a511ee9b0d0242ac120002"
MARKER = "marker"
SETTINGS = RestoreSettings(
    agent_timeout=120.0, start_timeout=60.0, ring_timeout=60.0, array_timeout=300.0
)


# -- the nodes' local disks: the lvm2 emulator on image files, or real lvm2 ----------------------


@dataclass(frozen=True)
class VolumeGroup:
    """One node's volume group, with a data and a commit-log LV, each holding an empty ext4."""

    name: str
    runner: CommandRunner
    settings: LvmSettings


class Disks(Protocol):
    #: Whether an LV reaches the kernel only through a loop device the hooks attach (emulated).
    attached_by_hooks: bool
    #: What the hooks join with RINGSNAP_VOLUME (`<vg>/<lv>`) to find the LV's image; "" for /dev.
    hook_store: str

    def volume_group(self, node: str) -> VolumeGroup: ...

    def device(self, volume: str) -> Path:
        """What holds the LV's bytes: its image file, or its block device."""
        ...

    def attach(self, volume: str) -> str:
        """A block device showing the LV, to mount."""
        ...

    def device_numbers(self, volume: str) -> set[int]:
        """The block devices showing the LV now."""
        ...


def _run(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=120).stdout


def _make_lvs(device: Callable[[str], Path], vg: str) -> None:
    for lv in (DATA_LV, COMMITLOG_LV):
        mounts.format_image(device(f"{vg}/{lv}"))


class EmulatedDisks:
    """One lvm2 emulator per node (each node its own host), its LVs image files in one store."""

    attached_by_hooks = True

    def __init__(self, store: Path) -> None:
        self.store = store
        self.hook_store = str(store)

    def volume_group(self, node: str) -> VolumeGroup:
        vg = f"rs{node}"
        emulator = Lvm2Emulator(self.store)
        emulator.add_vg(vg, 512 << 20)
        emulator.add_linear(vg, DATA_LV, LV_BYTES)
        emulator.add_thin_pool(vg, "pool", 128 << 20)
        emulator.add_thin(vg, COMMITLOG_LV, LV_BYTES, "pool")
        _make_lvs(self.device, vg)
        return VolumeGroup(vg, emulator, LvmSettings(volume_groups=[vg]))

    def device(self, volume: str) -> Path:
        return self.store / f"{volume}.img"

    def attach(self, volume: str) -> str:
        return _run("losetup", "--find", "--show", str(self.device(volume))).strip()

    def device_numbers(self, volume: str) -> set[int]:
        return {os.stat(device).st_rdev for device in loop_devices_of(self.device(volume))}

    def detach_all(self) -> None:
        """Detach every loop device holding one of our images (and no other)."""
        for image in self.store.rglob("*.img"):
            for device in loop_devices_of(image):
                subprocess.run(["losetup", "-d", device], check=False, capture_output=True)


class LiveDisks:
    """Real lvm2: per node a loop-device physical volume and a volume group confined to it."""

    attached_by_hooks = False
    hook_store = ""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.token = uuid.uuid4().hex[:6]
        #: (volume group, its lvm.conf filter, its physical volume's loop device)
        self.made: list[tuple[str, str, str]] = []

    def volume_group(self, node: str) -> VolumeGroup:
        image = self.workdir / f"{node}-pv.img"
        with open(image, "wb") as handle:
            handle.truncate(512 << 20)
        loop = _run("losetup", "--find", "--show", str(image)).strip()
        vg = f"rs{self.token}{node}"
        confine = f'devices{{filter=["a|^{loop}$|","r|.*|"] global_filter=["a|^{loop}$|","r|.*|"]}}'
        self.made.append((vg, confine, loop))
        size = f"{LV_BYTES >> 20}m"
        for command in (
            ["pvcreate", loop],
            ["vgcreate", vg, loop],
            ["lvcreate", "-y", "-L", size, "-n", DATA_LV, vg],
            ["lvcreate", "-y", "--type", "thin-pool", "-L", "128m", "-n", "pool", vg],
            ["lvcreate", "-y", "-V", size, "--thinpool", f"{vg}/pool", "-n", COMMITLOG_LV],
        ):
            _run(command[0], "--config", confine, *command[1:])
        _make_lvs(self.device, vg)
        return VolumeGroup(
            vg, SubprocessRunner(), LvmSettings(volume_groups=[vg], lvm_config=confine)
        )

    def device(self, volume: str) -> Path:
        return Path("/dev") / volume

    def attach(self, volume: str) -> str:
        return str(self.device(volume))

    def device_numbers(self, volume: str) -> set[int]:
        path = self.device(volume)
        return {os.stat(path).st_rdev} if path.exists() else set()

    def remove_all(self) -> None:
        for vg, confine, loop in self.made:
            subprocess.run(
                ["vgremove", "--config", confine, "-f", vg], check=False, capture_output=True
            )
            subprocess.run(["losetup", "-d", loop], check=False, capture_output=True)


def _missing_precondition() -> str | None:
    missing = mounts.missing_preconditions()
    missing += [f"the {tool} command" for tool in ("losetup", "blkid") if not shutil.which(tool)]
    return "; ".join(missing) or None


@contextmanager
def emulated_disks(workdir: Path) -> Iterator[EmulatedDisks]:
    missing = _missing_precondition()
    if missing:
        pytest.skip(f"missing precondition: {missing}")
    with temporary_xfs_pool(workdir, size_bytes=1 << 30) as pool:
        disks = EmulatedDisks(pool.root / "lvm")
        try:
            yield disks
        finally:
            disks.detach_all()


@contextmanager
def live_disks(workdir: Path) -> Iterator[LiveDisks]:
    reason = device_mapper_error()
    if reason is not None:
        pytest.skip(
            "precondition: a kernel with device-mapper, so that /dev/mapper/control can be opened"
            f" (here: {reason}); the emulated variant covers this host"
        )
    missing = _missing_precondition()
    if missing:
        pytest.skip(f"missing precondition: {missing}")
    disks = LiveDisks(workdir)
    try:
        yield disks
    finally:
        disks.remove_all()


# -- scripts the agents run: a stand-in nodetool and the [volumes] hook --------------------------

NODETOOL = r"""
# nodetool of a node without Cassandra. argv: flag file, host id, then nodetool's own arguments.
# "Cassandra" runs while the flag file exists (start_command creates it, stop_command removes it).
import os, sys

flag, host_id, arguments = sys.argv[1], sys.argv[2], sys.argv[3:]
if not os.path.exists(flag):
    sys.exit("nodetool: Failed to connect to '127.0.0.1:7199' - ConnectException: 'Connection refused'.")
answers = {
    "info": f"ID : {host_id}\nGossip active : true\nNative Transport active : true\n"
    "Generation No : 1\nData Center : dc1\nRack : r1",
    "version": "ReleaseVersion: 5.0.7",
    "describecluster": "Cluster Information:\n\tName: lvm-ring",
    "gossipinfo": f"/127.0.0.1:7000\n  HOST_ID:1:{host_id}\n  RPC_ADDRESS:1:127.0.0.1",
    "drain": "",
    "flush": "",
}
if not arguments or arguments[0] not in answers:
    sys.exit(f"the stand-in nodetool does not know {arguments}")
print(answers[arguments[0]])
"""

HOOK = r"""
# [volumes] hook. argv: store, log file, then `detach` or `attach`.
# detach lets go of the LV the agent just unmounted; attach prints the device showing the LV named
# RINGSNAP_VOLUME (`<vg>/<lv>`, the LVM driver's volume name). With a store, the LVs are the lvm2
# emulator's image files `<store>/<vg>/<lv>.img`, attached as loop devices; with "", real LVs,
# always at /dev/<vg>/<lv>.
import json, os, subprocess, sys

store, log, hook = sys.argv[1:4]
env = {key: value for key, value in os.environ.items() if key.startswith("RINGSNAP_")}
with open(log, "a") as handle:
    handle.write(json.dumps({"hook": hook, "env": env}) + "\n")
if hook == "detach" and store:
    device = env["RINGSNAP_DEVICE"]
    backing = open(f"/sys/block/{os.path.basename(device)}/loop/backing_file").read().strip()
    if not backing.startswith(store + "/"):
        sys.exit(f"{device} is not an LV of this test ({backing})")
    subprocess.run(["losetup", "-d", device], check=True)
elif hook == "attach" and store:
    image = os.path.join(store, env["RINGSNAP_VOLUME"] + ".img")
    attached = subprocess.run(
        ["losetup", "--find", "--show", image], check=True, capture_output=True, text=True
    )
    print(attached.stdout.strip())
elif hook == "attach":
    print(os.path.join("/dev", env["RINGSNAP_VOLUME"]))
"""


# -- the ring ------------------------------------------------------------------------------------


class RecordingRunner:
    """The driver's command runner, keeping every command line it ran."""

    def __init__(self, inner: CommandRunner) -> None:
        self.inner = inner
        self.calls: list[tuple[str, ...]] = []

    def run(self, argv: Sequence[str], *, timeout: float) -> CommandResult:
        self.calls.append(tuple(argv))
        return self.inner.run(argv, timeout=timeout)

    def merged(self) -> list[str]:
        """The snapshots `lvconvert --merge` was asked to merge, in order."""
        return [argv[-1] for argv in self.calls if argv[0] == "lvconvert" and "--merge" in argv]


class WitnessedPort(NodeSnapshotPort):
    """A node's snapshot port (through its agent) that notes the digest of every origin LV just
    before it asks the agent to clone them."""

    def __init__(self, node: Node, address: str, tls: ClientTls) -> None:
        super().__init__(node.array, node.name, address, tls)
        self._node = node

    async def clone(self, ref: SnapshotRef, suffix: str) -> Sequence[Volume]:
        for member in ref.members:
            name = member.volume.name
            seen = await asyncio.to_thread(self._node.digest_of, name)
            self._node.origins_before_clone[name] = seen
        return await super().clone(ref, suffix)


@dataclass
class Node:
    name: str
    host_id: str
    root: Path
    vg: str
    #: The lvm2 this node's agent runs (recorded).
    commands: RecordingRunner
    #: `lvm_config` of the node's volume group (real lvm2 confined to the test's PV), or None.
    lvm_config: str | None
    digest_of: Callable[[str], str]
    origins_before_clone: dict[str, str] = field(default_factory=dict)
    #: The coordinator's port of this node's snapshots, on the running scenario's event loop.
    connected: WitnessedPort | None = None

    @property
    def port(self) -> WitnessedPort:
        assert self.connected is not None, "no coordinator connected to the agents"
        return self.connected

    @property
    def array(self) -> str:
        return f"{self.name}-lvm"

    @property
    def data_mount(self) -> Path:
        return self.root / "data"

    @property
    def commitlog_mount(self) -> Path:
        return self.root / "commitlog"

    @property
    def table(self) -> Path:
        return self.data_mount / "cassandra" / TABLE

    @property
    def commitlog(self) -> Path:
        return self.commitlog_mount / "commitlog"

    @property
    def hints(self) -> Path:
        """Outside the restored volumes: discarded by the restore."""
        return self.root / "hints"

    @property
    def running_flag(self) -> Path:
        return self.root / "cassandra.running"

    def volume(self, lv: str) -> str:
        return f"{self.vg}/{lv}"

    @property
    def mounts(self) -> dict[Path, str]:
        """Mount point -> the LV mounted there before any restore."""
        return {
            self.data_mount: self.volume(DATA_LV),
            self.commitlog_mount: self.volume(COMMITLOG_LV),
        }


class FileCanaries:
    """The ring (`RingPort`): a canary row is a file on the node's mounted data filesystem."""

    def __init__(self, data_mounts: Mapping[str, Path]) -> None:
        self._mounts = dict(data_mounts)  # host id -> data mount point
        self.waited_for: list[list[str]] = []

    def _path(self, key: str, host_id: str) -> Path:
        return self._mounts[host_id] / f"canary.{key}"

    def write(self, key: str, host_id: str) -> None:
        self._path(key, host_id).write_text(key)

    async def write_canaries(self, backup_id: str, host_ids: Sequence[str]) -> dict[str, str]:
        """The backup's canaries (`CanaryWriter`)."""
        keys = {host_id: f"{backup_id}.{host_id}" for host_id in host_ids}
        for host_id, key in keys.items():
            self.write(key, host_id)
        return keys

    async def write_pre_restore_canaries(
        self, restore_id: str, host_ids: Sequence[str]
    ) -> dict[str, str]:
        keys = {host_id: f"{restore_id}.{host_id}" for host_id in host_ids}
        for host_id, key in keys.items():
            self.write(key, host_id)
        return keys

    async def canary_present(self, key: str, host_id: str) -> bool:
        return self._path(key, host_id).is_file()

    async def min_gc_grace(self) -> tuple[int, str]:
        return 864000, "shop.orders"

    async def wait_for_ring(self, host_ids: Sequence[str], timeout: float) -> None:
        self.waited_for.append(list(host_ids))

    def reconnect(self) -> None:
        pass


class Side(Protocol):
    """What the coordinator's side of a scenario knows of the ring: the nodes, the ring's
    canaries, each agent's address and the client certificate (no disk, no lvm2)."""

    nodes: list[Node]
    canaries: FileCanaries

    def addresses(self) -> dict[str, str]: ...

    def tls(self) -> ClientTls: ...


@dataclass
class Rig:
    disks: Disks
    nodes: list[Node]
    pki: TestPki
    agents: dict[str, BackgroundAgent]
    canaries: FileCanaries
    hook_log: Path

    def addresses(self) -> dict[str, str]:
        return {name: agent.address for name, agent in self.agents.items()}

    def tls(self) -> ClientTls:
        return ClientTls(self.pki.client.cert_pem, self.pki.client.key_pem, self.pki.ca.cert_pem)

    def hook_calls(self) -> list[tuple[str, str, str]]:
        """(hook, mount point, volume name or "") of every hook run, in order."""
        if not self.hook_log.exists():
            return []
        calls = []
        for line in self.hook_log.read_text().splitlines():
            item = json.loads(line)
            env = item["env"]
            calls.append(
                (item["hook"], env["RINGSNAP_MOUNT_POINT"], env.get("RINGSNAP_VOLUME", ""))
            )
        return calls


def digest(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "blake2b").hexdigest()


def unmount_everything_at(point: Path) -> None:
    for _ in range(10):
        if not any(entry.mount_point == str(point) for entry in mountinfo.read()):
            return
        mounts.unmount(point)


def start_node(stack: ExitStack, rig_root: Path, disks: Disks, name: str) -> Node:
    """Make the node's volume group, mount its LVs, and say Cassandra runs on it."""
    group = disks.volume_group(name)
    commands = RecordingRunner(group.runner)
    node = Node(
        name,
        str(uuid.uuid4()),
        rig_root / name,
        group.name,
        commands,
        group.settings.lvm_config,
        lambda volume: digest(disks.device(volume)),
    )
    for point, volume in node.mounts.items():
        point.mkdir(parents=True)
        stack.callback(unmount_everything_at, point)
        _run("mount", "-t", "ext4", disks.attach(volume), str(point))
    for directory in (node.table, node.commitlog, node.hints):
        directory.mkdir(parents=True)
    node.running_flag.touch()
    return node


def agent_config(
    node: Node, pki: TestPki, nodetool: Sequence[str], hook: Sequence[str]
) -> AgentConfig:
    """The node's agent: the stand-in nodetool, harmless stop and start commands, the hooks."""
    data = config_data(
        pki,
        data_directories=[node.data_mount / "cassandra"],
        commitlog_directory=node.commitlog,
        state_directory=node.root / "state",
        nodetool=[*nodetool, str(node.running_flag), node.host_id],
        cassandra={
            "hints_directory": str(node.hints),
            "stop_command": ["rm", "-f", str(node.running_flag)],
            "start_command": ["touch", str(node.running_flag)],
        },
    )
    # Merged into what config_data set: its [volumes] state_directory keeps this agent's restore
    # records apart from the other agents' (the default is one directory per host).
    data["volumes"] |= {
        "detach_command": [*hook, "detach"],
        "attach_command": [*hook, "attach"],
        "hook_timeout_seconds": 60,
    }
    # The node's own LVM: the agent snapshots, reverts and clones these, never the coordinator.
    data["lvm"] = {
        "volumes": [
            {
                "volume": node.volume(DATA_LV),
                "kind": "thick",
                "directories": [str(node.data_mount / "cassandra")],
            },
            {
                "volume": node.volume(COMMITLOG_LV),
                "kind": "thin",
                "directories": [str(node.commitlog)],
            },
        ],
        **({"lvm_config": node.lvm_config} if node.lvm_config else {}),
    }
    config = validate(data, AgentConfig, source=f"<agent of {node.name}>")
    assert config.volumes.state_directory.is_relative_to(node.root), "records must stay ours"
    return config


def share_mounts_below(stack: ExitStack, root: Path) -> None:
    """Make `root` a shared mount, so that what the agents mount and unmount below it reaches a
    coordinator confined in a mount namespace of its own (a slave of this one), as the mounts
    of a host reach a unit with PrivateDevices=yes."""
    _run("mount", "--bind", str(root), str(root))
    stack.callback(subprocess.run, ["umount", "-l", str(root)], check=False, capture_output=True)
    _run("mount", "--make-shared", str(root))


@pytest.fixture(params=["emulated", "live"])
def rig(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Rig]:
    root = tmp_path.resolve()
    with ExitStack() as stack:
        share_mounts_below(stack, root)
        disks: Disks
        if request.param == "emulated":
            disks = stack.enter_context(emulated_disks(root))
        else:
            disks = stack.enter_context(live_disks(root))
        pki = TestPki.create(root / "pki")
        hook_log = root / "hooks.jsonl"
        (root / "nodetool.py").write_text(NODETOOL)
        (root / "hook.py").write_text(HOOK)
        nodetool = [sys.executable, str(root / "nodetool.py")]
        hook = [sys.executable, str(root / "hook.py"), disks.hook_store, str(hook_log)]
        nodes: list[Node] = []
        agents: dict[str, BackgroundAgent] = {}
        for name in NODES:
            node = start_node(stack, root, disks, name)
            nodes.append(node)
            agents[name] = stack.enter_context(
                BackgroundAgent(agent_config(node, pki, nodetool, hook), lvm_runner=node.commands)
            )
        canaries = FileCanaries({node.host_id: node.data_mount for node in nodes})
        yield Rig(disks, nodes, pki, agents, canaries, hook_log)


@asynccontextmanager
async def coordinator_agents(rig: Side) -> AsyncIterator[dict[str, AgentPort]]:
    """The coordinator's own gRPC clients of the agents, over mutual TLS."""
    tls = rig.tls()
    addresses = rig.addresses()
    async with AsyncExitStack() as stack:
        clients: dict[str, AgentPort] = {}
        for name, address in addresses.items():
            client = GrpcNodeAgent(name, address, tls, call_timeout=60)
            stack.push_async_callback(client.close)
            clients[name] = client
        # Each node's snapshots through its own agent (driver agent-lvm): no lvm2 here.
        for node in rig.nodes:
            node.connected = WitnessedPort(node, addresses[node.name], tls)
            stack.push_async_callback(node.connected.close)
        try:
            yield clients
        finally:
            for node in rig.nodes:
                node.connected = None


# -- what is on a node's filesystems -------------------------------------------------------------


def write_sstable(table: Path, generation: int, seed: str) -> None:
    """An SSTable as the agent's manifest reads it: components, TOC.txt, Digest.crc32."""
    data = hashlib.sha256(f"{seed}/{generation}".encode()).digest() * (64 * generation)
    components = {
        "Data.db": data,
        "Index.db": data[:96],
        "Statistics.db": f"stats {seed} {generation}".encode(),
        "Digest.crc32": str(zlib.crc32(data)).encode(),
    }
    for name, content in components.items():
        (table / f"nb-{generation}-big-{name}").write_bytes(content)
    (table / f"nb-{generation}-big-TOC.txt").write_text("\n".join([*components, "TOC.txt"]) + "\n")


def delete_sstable(table: Path, generation: int) -> None:
    for path in table.glob(f"nb-{generation}-big-*"):
        path.unlink()


def files_of(root: Path) -> dict[str, bytes]:
    """Every file below `root` (lost+found and the load aside): relative path -> contents."""
    return {
        str(path.relative_to(root)): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file() and "lost+found" not in path.parts and LOAD not in path.parts
    }


# -- the backup, the later writes, the restore ---------------------------------------------------


@dataclass
class TakenBackup:
    backup: Backup
    #: The agent's manifest of each node, taken at backup time (what the catalog would hold).
    manifests: dict[str, list[SSTable]]
    #: Mount point -> the files of its filesystem at the snapshot.
    files: dict[Path, dict[str, bytes]]

    def ref(self, node: Node) -> SnapshotRef:
        return next(ref for ref in self.backup.snapshots if ref.array == node.array)


async def take_backup(rig: Side, agents: Mapping[str, AgentPort]) -> TakenBackup:
    """Write data, then back the ring up with the coordinator's own backup workflow (the callers
    write to every node meanwhile, `writing_load`): plan, canary, flush, manifest, every node's space checked (prepare)
    before any freeze, every node frozen by its agent, every agent snapshotting its own volumes
    at once, thaw, record."""
    for node in rig.nodes:
        for generation in (1, 2, 3):
            write_sstable(node.table, generation, node.name)
        (node.data_mount / MARKER).write_text("as backed up")
        (node.commitlog / "CommitLog-7-1.log").write_bytes(b"segment one" * 100)
    manifests = {node.name: await agents[node.name].manifest() for node in rig.nodes}
    files = {point: files_of(point) for node in rig.nodes for point in node.mounts}
    workflow = BackupWorkflow(
        CLUSTER, targets(rig, agents), {node.array: node.port for node in rig.nodes}, rig.canaries
    )
    run = await workflow.run(BACKUP_SETTINGS, trigger="test_restore_lvm")
    assert run.window is not None and run.window.total < BACKUP_SETTINGS.freeze_budget
    for node in rig.nodes:
        # The workflow's canary, written before the freeze: in the snapshot too.
        key = run.nodes[node.name].canary_id
        assert key, f"{node.name}: no canary written"
        files[node.data_mount][f"canary.{key}"] = key.encode()
    backup = Backup(
        id=run.backup_id,
        cluster=CLUSTER,
        state=BackupState.COMPLETE,
        quiesce_mode=QuiesceMode.FREEZE,
        trigger=run.trigger,
        policy="",
        started_at=run.started_at,
        nodes=tuple(
            BackupNode(
                name=node.name,
                host_id=run.nodes[node.name].host_id,
                volumes=configured_volumes(node),
                canary_id=run.nodes[node.name].canary_id,
            )
            for node in rig.nodes
        ),
        snapshots=tuple(run.snapshots),
    )
    assert {ref.array for ref in backup.snapshots} == {node.array for node in rig.nodes}
    assert all(ref.driver == "agent-lvm" for ref in backup.snapshots)
    return TakenBackup(backup, manifests, files)


#: Generous for a machine shared by several rings; the agents' leases end a stuck freeze anyway.
BACKUP_SETTINGS = BackupSettings(freeze_budget=20.0, lease=10.0, agent_timeout=120.0)
LOAD = "load"
LOAD_FILES = 64


def configured_volumes(node: Node) -> tuple[NodeVolume, ...]:
    return (
        NodeVolume(array=node.array, volume=node.volume(DATA_LV), role=VolumeRole.DATA),
        NodeVolume(array=node.array, volume=node.volume(COMMITLOG_LV), role=VolumeRole.COMMITLOG),
    )


def targets(rig: Side, agents: Mapping[str, AgentPort]) -> list[NodeTarget]:
    return [
        NodeTarget(node.name, agents[node.name], configured_volumes(node)) for node in rig.nodes
    ]


@contextmanager
def writing_load(rig: Rig) -> Iterator[None]:
    """Writes on every node's data filesystem all through the backup (a freeze stalls them):
    files of 64 KiB, each written whole and fsynced, over and over in a set of 64 (4 MiB: the
    node's 32 MiB volume never fills)."""
    stop = threading.Event()

    def write(node: Node) -> None:
        folder = node.data_mount / LOAD
        folder.mkdir(exist_ok=True)
        number = 0
        while not stop.is_set():
            block = hashlib.sha256(f"{node.name}/{number % LOAD_FILES}".encode()).digest() * 2048
            with open(folder / f"{number % LOAD_FILES:06d}", "wb") as handle:
                handle.write(block)
                handle.flush()
                os.fsync(handle.fileno())
            number += 1
            stop.wait(0.005)

    threads = [threading.Thread(target=write, args=(node,), daemon=True) for node in rig.nodes]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)


def assert_load_not_torn(rig: Rig) -> None:
    """What the load wrote and a snapshot caught: never a partly written file."""
    for node in rig.nodes:
        for path in sorted((node.data_mount / LOAD).iterdir()):
            data = path.read_bytes()
            block = hashlib.sha256(f"{node.name}/{int(path.name)}".encode()).digest() * 2048
            # The last file may have been caught before its write reached the disk (empty), never
            # half written.
            assert data in (block, b""), f"{path}: {len(data)} bytes, torn"


def write_after_the_backup(rig: Rig) -> None:
    """What a restore must undo: new SSTables, a recorded one compacted away, a changed marker,
    a new commit-log segment; and hints outside the volumes, which it must discard."""
    for node in rig.nodes:
        for generation in (4, 5):
            write_sstable(node.table, generation, node.name)
        delete_sstable(node.table, 2)
        (node.data_mount / MARKER).write_text("written after the backup")
        (node.commitlog / "CommitLog-7-2.log").write_bytes(b"segment two" * 100)
        (node.hints / f"{uuid.uuid4()}-1-7.hints").write_bytes(b"hint" * 64)


@dataclass
class MemoryJournal:
    """The restore's journal (`RestoreJournal`) in memory, with the backup's manifests."""

    manifests: Mapping[str, Sequence[SSTable]]
    saved: list[RestoreRecord] = field(default_factory=list)
    verified: list[tuple[str, Verification, str]] = field(default_factory=list)

    async def save(self, record: RestoreRecord) -> None:
        self.saved.append(record)

    async def manifest(self, backup_id: str, node: str) -> Sequence[SSTable]:
        return self.manifests[node]

    async def mark_verified(
        self, backup_id: str, result: Verification, detail: str, by: str
    ) -> None:
        self.verified.append((backup_id, result, by))

    async def mark_snapshots_lost(self, backup_ids: Sequence[str], reason: str) -> None:
        raise AssertionError(f"an LVM revert lost no other backup, yet {backup_ids} were marked")


async def restore(
    rig: Side, agents: Mapping[str, AgentPort], taken: TakenBackup, mode: RestoreMode
) -> tuple[RestoreRecord, MemoryJournal]:
    """Plan the whole-ring restore, check the plan found nothing to refuse, run it."""
    arrays = {node.array: node.port for node in rig.nodes}
    request = RestoreRequest(taken.backup.id, mode=mode)
    plan = await plan_restore(
        new_restore_id(), request, taken.backup, agents, [SEED], arrays, rig.canaries
    )
    assert not plan.refused, plan.refusals
    assert plan.whole_ring and all(node.running for node in plan.nodes), plan.warnings
    for node in rig.nodes:
        said = (
            f"array {node.array}: node-local: on {node.name}'s own disks, it dies with them; the"
            " S3 export is the copy that survives"
        )
        assert said in plan.warnings, plan.warnings
    journal = MemoryJournal(taken.manifests)
    workflow = RestoreWorkflow(
        agents, arrays, rig.canaries, journal, seeds=[SEED], settings=SETTINGS
    )
    return await workflow.run(plan, "test_restore_lvm"), journal


# -- what must hold afterwards -------------------------------------------------------------------


def assert_proven(record: RestoreRecord, journal: MemoryJournal) -> None:
    shown = "\n".join(
        f"{n.name}: {n.step.value}, {n.verdict.value}: {n.proof}" for n in record.nodes
    )
    assert record.state is RestoreState.PROVEN, f"{record.state.value} {record.error}\n{shown}"
    for node in record.nodes:
        assert node.verdict is NodeVerdict.PROVEN, shown
        assert node.proof[0] == (
            "manifest: all 3 recorded SSTables present, sizes and digests equal"
        ), shown
        assert any("pre-restore canary is gone" in line for line in node.proof), shown
        assert node.unproven == (), shown
    assert journal.verified == [(record.backup_id, Verification.PROVEN, record.id)]


def assert_holds_the_backup(rig: Rig, taken: TakenBackup) -> None:
    """Each filesystem holds exactly its files at the snapshot, nothing written since."""
    for node in rig.nodes:
        assert (node.table / "nb-2-big-Data.db").exists(), "the deleted SSTable did not come back"
        assert not list(node.table.glob("nb-4-big-*")), "an SSTable written later survived"
        assert (node.data_mount / MARKER).read_text() == "as backed up"
        assert not (node.commitlog / "CommitLog-7-2.log").exists()
        for point in node.mounts:
            assert files_of(point) == taken.files[point], f"{point} differs from the backup"
        assert list(node.hints.iterdir()) == [], "hints outside the volumes were not discarded"


def assert_attached_once(rig: Rig, attached: Mapping[Path, str], unattached: Sequence[str]) -> None:
    """Each mount point shows exactly one filesystem, the one of its expected LV; no LV is mounted
    anywhere else, and (emulated) no LV image is held by a loop device more than it is mounted."""
    entries = mountinfo.read()
    for point, volume in attached.items():
        here = [entry for entry in entries if entry.mount_point == str(point)]
        assert len(here) == 1, f"{point}: mounted {len(here)} times: {[e.source for e in here]}"
        assert here[0].device_number in rig.disks.device_numbers(volume), (
            f"{point} shows {here[0].source}, not {volume}"
        )
    for volume in [*attached.values(), *unattached]:
        numbers = rig.disks.device_numbers(volume)
        where = sorted(entry.mount_point for entry in entries if entry.device_number in numbers)
        expected = sorted(str(point) for point, name in attached.items() if name == volume)
        assert where == expected, f"{volume} is mounted at {where}, expected {expected}"
        if rig.disks.attached_by_hooks:
            assert len(numbers) == len(expected), f"{volume} is attached {len(numbers)} times"


async def volumes_as_agents_see_them(
    agents: Mapping[str, AgentPort],
) -> list[tuple[str, bool, str]]:
    """(mount point, mounted, released by) of every data and commit-log volume, as the agents
    report them; each must also report Cassandra running again."""
    found = []
    for agent in agents.values():
        state = await agent.volume_state()
        assert state.cassandra_running, f"{agent.node}: {state.detail}"
        found += [
            (volume.mount_point, volume.mounted, volume.released_by)
            for volume in state.volumes
            if {"data", "commitlog"} & set(volume.kinds)
        ]
    return found


@dataclass
class Outcome:
    taken: TakenBackup
    record: RestoreRecord
    journal: MemoryJournal
    #: What the agents report afterwards (see `volumes_as_agents_see_them`).
    agents_see: list[tuple[str, bool, str]]


def backup_write_on_and_restore(rig: Rig, mode: RestoreMode) -> Outcome:
    """The whole story, through the coordinator's own clients of the agents."""

    async def scenario() -> Outcome:
        async with coordinator_agents(rig) as agents:
            with writing_load(rig):
                taken = await take_backup(rig, agents)
            write_after_the_backup(rig)
            record, journal = await restore(rig, agents, taken, mode)
            return Outcome(taken, record, journal, await volumes_as_agents_see_them(agents))

    return asyncio.run(scenario())


# -- the tests -----------------------------------------------------------------------------------


def test_revert_brings_every_node_back_to_the_snapshot_and_proves_it(rig: Rig) -> None:
    outcome = backup_write_on_and_restore(rig, RestoreMode.REVERT)

    assert_proven(outcome.record, outcome.journal)
    assert_holds_the_backup(rig, outcome.taken)
    assert_load_not_torn(rig)
    for node in rig.nodes:
        members = [member.snapshot_id for member in outcome.taken.ref(node).members]
        assert sorted(node.commands.merged()) == sorted(members), "one merge per member"
    every_mount = {point: volume for node in rig.nodes for point, volume in node.mounts.items()}
    assert_attached_once(rig, every_mount, unattached=[])
    hooks = Counter((hook, point) for hook, point, _ in rig.hook_calls())
    assert hooks == Counter(
        {(hook, str(p)): 1 for p in every_mount for hook in ("detach", "attach")}
    )
    assert sorted(outcome.agents_see) == sorted((str(p), True, "") for p in every_mount)
    assert rig.canaries.waited_for == [[node.host_id for node in rig.nodes]]


def test_clone_attaches_clones_and_leaves_the_origin_lvs_untouched(rig: Rig) -> None:
    outcome = backup_write_on_and_restore(rig, RestoreMode.CLONE)

    assert_proven(outcome.record, outcome.journal)
    assert_holds_the_backup(rig, outcome.taken)
    assert_load_not_torn(rig)
    clone_of = {original: clone for _, original, clone in outcome.record.clones}
    attached: dict[Path, str] = {}
    for node in rig.nodes:
        assert node.commands.merged() == [], "a clone-mode restore merged a snapshot"
        for point, origin in node.mounts.items():
            assert clone_of[origin] != origin
            attached[point] = clone_of[origin]
        before_clone = node.origins_before_clone
        assert sorted(before_clone) == sorted(node.mounts.values())
        for origin, before in before_clone.items():
            assert digest(rig.disks.device(origin)) == before, f"{origin} changed"
    origins = [volume for node in rig.nodes for volume in node.mounts.values()]
    snapshots = [m.snapshot_id for ref in outcome.taken.backup.snapshots for m in ref.members]
    assert_attached_once(rig, attached, unattached=[*origins, *snapshots])
    attaches = [volume for hook, _, volume in rig.hook_calls() if hook == "attach"]
    assert sorted(attaches) == sorted(attached.values())
    assert sorted(outcome.agents_see) == sorted((str(p), True, "") for p in attached)


# -- faults (the emulator fills pools and snapshots to order) ------------------------------------


class WatchedAgent:
    """A node's agent client that notes every freeze asked of it (the rest passes through)."""

    def __init__(self, inner: AgentPort, frozen: list[str]) -> None:
        self._inner = inner
        self._frozen = frozen

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    async def freeze(self, operation_id: str, lease_seconds: float) -> FreezeReceipt:
        self._frozen.append(self._inner.node)
        return await self._inner.freeze(operation_id, lease_seconds)


def emulator_of(node: Node) -> Lvm2Emulator:
    inner = node.commands.inner
    assert isinstance(inner, Lvm2Emulator)
    return inner


def created(node: Node) -> list[tuple[str, ...]]:
    return [argv for argv in node.commands.calls if argv[0] == "lvcreate"]


@pytest.mark.parametrize("rig", ["emulated"], indirect=True)
def test_a_thin_pool_too_full_refuses_the_backup_before_any_node_is_frozen(rig: Rig) -> None:
    full = rig.nodes[1]
    emulator_of(full).set_data_percent(full.vg, "pool", 95.25)
    frozen: list[str] = []

    async def scenario() -> None:
        async with coordinator_agents(rig) as agents:
            watched = {n: cast(AgentPort, WatchedAgent(a, frozen)) for n, a in agents.items()}
            workflow = BackupWorkflow(
                CLUSTER,
                targets(rig, watched),
                {node.array: node.port for node in rig.nodes},
                rig.canaries,
            )
            await workflow.run(BACKUP_SETTINGS, trigger="test_restore_lvm")

    with pytest.raises(BackupFailed) as refused:
        asyncio.run(scenario())
    text = str(refused.value)
    assert "preparing the snapshot failed" in text, text
    assert f"node {full.name}" in text, text
    assert f"thin pool {full.vg}/pool data 95.25% used" in text and "limit of 90%" in text, text
    assert frozen == [], f"frozen before the refusal: {frozen}"
    assert [created(node) for node in rig.nodes] == [[], [], []], "a snapshot was taken"


@pytest.mark.parametrize("rig", ["emulated"], indirect=True)
def test_an_overflowed_thick_snapshot_refuses_that_node_s_restore_by_name(rig: Rig) -> None:
    lost = rig.nodes[2]

    async def scenario() -> RestorePlan:
        async with coordinator_agents(rig) as agents:
            taken = await take_backup(rig, agents)
            member = next(
                m.snapshot_name for m in taken.ref(lost).members if m.volume.id.endswith(DATA_LV)
            )
            emulator_of(lost).fill_snapshot(lost.vg, member, 100)
            arrays = {node.array: node.port for node in rig.nodes}
            return await plan_restore(
                new_restore_id(),
                RestoreRequest(taken.backup.id, mode=RestoreMode.REVERT),
                taken.backup,
                agents,
                [SEED],
                arrays,
                rig.canaries,
            )

    plan = asyncio.run(scenario())
    invalid = [r for r in plan.refusals if f"node {lost.name}: snapshot" in r and "is invalid" in r]
    assert len(invalid) == 1, plan.refusals
    assert "restore this node from the backup's S3 copy" in invalid[0]
    assert all(rig.nodes[i].name not in " ".join(plan.refusals) for i in (0, 1)), plan.refusals
    assert [node.commands.merged() for node in rig.nodes] == [[], [], []]


class KilledAgentPort(WitnessedPort):
    """Node 3's snapshot port: its agent dies once the other nodes have snapshotted, before its
    own snapshot is asked for."""

    def __init__(self, node: Node, address: str, tls: ClientTls, rig: Rig) -> None:
        super().__init__(node, address, tls)
        self._rig = rig

    async def commit_group_snapshot(self, prepared: PreparedSnapshot) -> SnapshotRef:
        others = [n for n in self._rig.nodes if n.name != self.node]
        for _ in range(200):
            if all(created(n) for n in others):
                break
            await asyncio.sleep(0.05)
        assert all(created(n) for n in others), "the other nodes never snapshotted"
        # The agent's server goes away as a killed agent's would; what it froze stays frozen
        # until its lease runs out, as after a crash until its restart.
        agent = self._rig.agents[self.node]
        server = agent.server._server
        assert server is not None
        await asyncio.to_thread(agent.call, server.stop(0))
        return await super().commit_group_snapshot(prepared)


@pytest.mark.parametrize("rig", ["emulated"], indirect=True)
def test_an_agent_killed_after_the_others_snapshotted_fails_thaws_and_cleans_up(
    rig: Rig,
) -> None:
    victim = rig.nodes[2]
    runs: list[BackupRun] = []

    async def remember(run: BackupRun) -> None:
        runs.append(run)

    async def scenario() -> None:
        async with coordinator_agents(rig) as agents:
            tls = ClientTls(rig.pki.client.cert_pem, rig.pki.client.key_pem, rig.pki.ca.cert_pem)
            killed = KilledAgentPort(victim, rig.agents[victim.name].address, tls, rig)
            victim.connected = killed
            try:
                workflow = BackupWorkflow(
                    CLUSTER,
                    targets(rig, agents),
                    {node.array: node.port for node in rig.nodes},
                    rig.canaries,
                )
                await workflow.run(BACKUP_SETTINGS, trigger="test_restore_lvm", on_start=remember)
            finally:
                await killed.close()

    with pytest.raises(BackupFailed) as failed:
        asyncio.run(scenario())
    assert victim.array in str(failed.value), str(failed.value)
    # Every node thawed: the survivors' filesystems take writes, and no freeze is left.
    for node in rig.nodes:
        for point in node.mounts:
            (point / "after-the-failure").write_text("writable")
    for node in rig.nodes[:2]:
        made = {argv[argv.index("-n") + 1] for argv in created(node)}
        assert made, f"{node.name} made no snapshot"
        left = set(emulator_of(node).names(node.vg)) & made
        assert left == set(), f"{node.name}: snapshots of the failed run left: {left}"
    # The dead node's snapshot, if its agent made it, is a cleanup recorded by name.
    (run,) = runs
    assert run.snapshots == []
    named = [c for c in run.pending_cleanups if c.array == victim.array]
    assert named or not created(victim), run.pending_cleanups


# -- the coordinator as its unit runs it: its own mount namespace, no devices, no capability ------
# (`tests.support.confined`). Its uid stays 0: the canaries of this rig are files the coordinator
# writes itself on the nodes' root-owned filesystems (no Cassandra runs), which it reaches because
# the rig's mounts are shared into its namespace (`share_mounts_below`, `keep_below`).

#: Imported by the confined process before its capabilities go.
PRELOAD = ("tests.integration.test_restore_lvm",)


@dataclass(frozen=True)
class NodeSpec:
    name: str
    host_id: str
    root: Path
    vg: str


@dataclass(frozen=True)
class RingSpec:
    """The ring as the coordinator's config would describe it (picklable)."""

    nodes: tuple[NodeSpec, ...]
    addresses: dict[str, str]
    tls: ClientTls


class NoLvm2:
    """The coordinator's side has no lvm2: any command would be a failure of this design."""

    def run(self, argv: Sequence[str], *, timeout: float) -> CommandResult:
        raise AssertionError(f"the coordinator ran {argv[0]}")


@dataclass
class CoordinatorView:
    """`Side` built in the confined process from a `RingSpec`."""

    nodes: list[Node]
    canaries: FileCanaries
    spec: RingSpec

    @classmethod
    def of(cls, spec: RingSpec) -> CoordinatorView:
        nodes = [
            Node(n.name, n.host_id, n.root, n.vg, RecordingRunner(NoLvm2()), None, lambda v: "")
            for n in spec.nodes
        ]
        return cls(nodes, FileCanaries({n.host_id: n.data_mount for n in nodes}), spec)

    def addresses(self) -> dict[str, str]:
        return dict(self.spec.addresses)

    def tls(self) -> ClientTls:
        return self.spec.tls


def ring_spec(rig: Rig) -> RingSpec:
    return RingSpec(
        tuple(NodeSpec(n.name, n.host_id, n.root, n.vg) for n in rig.nodes),
        rig.addresses(),
        rig.tls(),
    )


def coordinator_backup(spec: RingSpec) -> tuple[TakenBackup, dict[str, object]]:
    """In the confined process: the backup workflow through the agents."""

    async def scenario() -> TakenBackup:
        view = CoordinatorView.of(spec)
        async with coordinator_agents(view) as agents:
            return await take_backup(view, agents)

    return asyncio.run(scenario()), confinement()


def coordinator_restore(
    spec: RingSpec, taken: TakenBackup
) -> tuple[RestoreRecord, MemoryJournal, dict[str, object]]:
    """In the confined process: plan and revert the whole ring through the agents."""

    async def scenario() -> tuple[RestoreRecord, MemoryJournal]:
        view = CoordinatorView.of(spec)
        async with coordinator_agents(view) as agents:
            return await restore(view, agents, taken, RestoreMode.REVERT)

    record, journal = asyncio.run(scenario())
    return record, journal, confinement()


def as_the_coordinator_unit(spec: RingSpec, function: Callable[..., T], *args: object) -> T:
    """`function(*args)` in a fresh process confined like the coordinator's unit (uid 0, see
    above), the rig's mounts kept."""
    rig_roots = sorted({node.root.parent for node in spec.nodes})
    return run_confined(function, *args, uid=0, preload=PRELOAD, keep_below=rig_roots, timeout=600)


@pytest.mark.parametrize("rig", ["emulated"], indirect=True)
def test_an_unprivileged_coordinator_without_devices_backs_up_and_restores_through_the_agents(
    rig: Rig,
) -> None:
    spec = ring_spec(rig)
    with writing_load(rig):
        taken, during_backup = as_the_coordinator_unit(spec, coordinator_backup, spec)
    assert_confined(during_backup, uid=0)
    write_after_the_backup(rig)
    record, journal, during_restore = as_the_coordinator_unit(
        spec, coordinator_restore, spec, taken
    )
    assert_confined(during_restore, uid=0)

    assert_proven(record, journal)
    assert_holds_the_backup(rig, taken)
    assert_load_not_torn(rig)
    for node in rig.nodes:
        # Every lvm2 command ran in the node's own agent.
        members = [m.snapshot_id for m in taken.ref(node).members]
        assert sorted(node.commands.merged()) == sorted(members)
        assert created(node), f"{node.name}: its agent took no snapshot"
