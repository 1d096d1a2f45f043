"""The agent's restore side on real loop-mounted ext4, through its real gRPC server with mutual TLS,
called by the coordinator's own client (`GrpcNodeAgent`). No Cassandra: its nodetool is `false`,
so the node counts as stopped.

The LUNs are image files on loop devices. The detach hook (a script written here, run as argv)
detaches the loop device the agent names; the attach hook attaches `<volume>.img` and prints the
device. A revert is played by attaching the same image again, an impostor by another image.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from ringsnap.agent import mounts
from ringsnap.agent.config import AgentConfig
from ringsnap.config import validate
from ringsnap.coordinator.agents.connection import ClientTls, GrpcNodeAgent
from ringsnap.coordinator.ports import AgentError
from ringsnap.sandbox.agents import BackgroundAgent, TestPki, config_data
from ringsnap.sandbox.loopfs import unavailable_reason

pytestmark = pytest.mark.integration

T = TypeVar("T")
OPERATION = "restore-it-1"


@pytest.fixture(scope="module", autouse=True)
def _loop_devices() -> None:
    missing = unavailable_reason()
    if missing:
        pytest.skip(f"loop-mounted filesystems unavailable: {missing}")


def _run(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=60).stdout


def mounted_at(point: Path) -> list[str]:
    """Sources mounted at `point`, from this process's mountinfo."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split(" ")
        if fields[4] == str(point):
            found.append(fields[fields.index("-", 6) + 2])
    return found


def loop_devices_of(image: Path) -> list[str]:
    out = _run("losetup", "-j", str(image))
    return [line.split(":", 1)[0] for line in out.splitlines() if line.strip()]


def fs_uuid(image: Path) -> str:
    return _run("blkid", "-p", "-o", "value", "-s", "UUID", str(image)).strip()


@dataclass
class Lun:
    """An ext4 image (the array's volume `name`) and where the node mounts it."""

    name: str
    image: Path
    mount_point: Path

    @property
    def uuid(self) -> str:
        return fs_uuid(self.image)


def make_image(directory: Path, name: str) -> Path:
    image = directory / f"{name}.img"
    with image.open("wb") as handle:
        handle.truncate(32 * 1024 * 1024)
    _run("mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", str(image))
    return image


@pytest.fixture
def luns(tmp_path: Path) -> Iterator[dict[str, Lun]]:
    """Two LUNs, `data` and `commitlog`, mounted. Cleanup unmounts whatever is mounted at their
    mount points and detaches every loop device backed by an image of this test (and only those:
    the machine's other loop devices belong to others)."""
    pool = tmp_path / "luns"
    pool.mkdir()
    made: dict[str, Lun] = {}
    try:
        for name in ("data", "commitlog"):
            image = make_image(pool, name)
            point = tmp_path / "mnt" / name
            point.mkdir(parents=True)
            device = _run("losetup", "--find", "--show", str(image)).strip()
            _run("mount", "-t", "ext4", device, str(point))
            made[name] = Lun(name, image, point)
            (point / name).mkdir()
        yield made
    finally:
        for lun in made.values():
            for _ in mounted_at(lun.mount_point):
                subprocess.run(["umount", str(lun.mount_point)], check=False, capture_output=True)
        for image in pool.glob("*.img"):
            for device in loop_devices_of(image):
                subprocess.run(["losetup", "-d", device], check=False, capture_output=True)


def write_hooks(directory: Path, pool: Path) -> tuple[list[str], list[str], Path]:
    """(detach argv, attach argv, log of their calls). Python scripts, run without a shell."""
    log = directory / "hooks.jsonl"
    common = (
        f"#!{sys.executable}\n"
        "import json, os, subprocess, sys\n"
        f"POOL = {str(pool)!r}\n"
        "env = {k: v for k, v in os.environ.items() if k.startswith('RINGSNAP_')}\n"
        f"with open({str(log)!r}, 'a') as log:\n"
        "    log.write(json.dumps({'hook': sys.argv[1], 'env': env}) + '\\n')\n"
    )
    detach = directory / "detach.py"
    detach.write_text(
        common + "device = env['RINGSNAP_DEVICE']\n"
        "name = os.path.basename(device)\n"
        "backing = open(f'/sys/block/{name}/loop/backing_file').read().strip()\n"
        "if os.path.dirname(backing) != POOL:\n"
        "    sys.exit(f'{device} is not a LUN of this test ({backing})')\n"
        "subprocess.run(['losetup', '-d', device], check=True)\n"
    )
    attach = directory / "attach.py"
    attach.write_text(
        common + "image = os.path.join(POOL, env['RINGSNAP_VOLUME'] + '.img')\n"
        "print('rescanning the pool')\n"
        "out = subprocess.run(['losetup', '--find', '--show', image], check=True,\n"
        "                     capture_output=True, text=True).stdout.strip()\n"
        "print(out)\n"
    )
    for script in (detach, attach):
        script.chmod(0o755)
    return [str(detach), "detach"], [str(attach), "attach"], log


@dataclass
class Rig:
    luns: dict[str, Lun]
    agent: BackgroundAgent
    pki: TestPki
    state: Path
    hook_log: Path
    pool: Path

    def call(self, work: Callable[[GrpcNodeAgent], Awaitable[T]]) -> T:
        """Run `work` with the coordinator's client to this agent, on a fresh event loop."""

        async def scenario() -> T:
            tls = ClientTls(self.pki.client.cert_pem, self.pki.client.key_pem, self.pki.ca.cert_pem)
            client = GrpcNodeAgent("node1", self.agent.address, tls, call_timeout=60)
            try:
                return await work(client)
            finally:
                await client.close()

        return asyncio.run(scenario())

    def hooks(self) -> list[dict[str, Any]]:
        if not self.hook_log.exists():
            return []
        return [json.loads(line) for line in self.hook_log.read_text().splitlines()]


@pytest.fixture
def rig(luns: dict[str, Lun], tmp_path: Path) -> Iterator[Rig]:
    pki = TestPki.create(tmp_path / "pki")
    pool = luns["data"].image.parent
    detach, attach, log = write_hooks(tmp_path, pool)
    state = tmp_path / "state"
    data = config_data(
        pki,
        data_directories=[luns["data"].mount_point / "data"],
        commitlog_directory=luns["commitlog"].mount_point / "commitlog",
        state_directory=state,
        nodetool=["false"],  # Cassandra does not answer: the node is down
    )
    data["volumes"] |= {
        "detach_command": detach,
        "attach_command": attach,
        "hook_timeout_seconds": 60,
    }
    config = validate(data, AgentConfig, source="<volumes test agent>")
    with BackgroundAgent(config) as agent:
        yield Rig(luns, agent, pki, state, log, pool)


@pytest.fixture
def hookless(luns: dict[str, Lun], tmp_path: Path) -> Iterator[Rig]:
    """An agent with no [volumes] hook: what a SAN node needs when the arrays present clones
    (issue 20); its by-id directory is where the test plays the host's udev."""
    pki = TestPki.create(tmp_path / "pki")
    by_id = tmp_path / "by-id"
    by_id.mkdir()
    data = config_data(
        pki,
        data_directories=[luns["data"].mount_point / "data"],
        commitlog_directory=luns["commitlog"].mount_point / "commitlog",
        state_directory=tmp_path / "state",
        nodetool=["false"],
    )
    data["volumes"] |= {"by_id_dir": str(by_id)}
    config = validate(data, AgentConfig, source="<hookless volumes test agent>")
    with BackgroundAgent(config) as agent:
        # `pool` is its by-id directory here: no hook reads a pool.
        yield Rig(luns, agent, pki, tmp_path / "state", tmp_path / "no-hooks.jsonl", by_id)


CLONE_WWN = "600a098038304437522b4d6f6a6b7a31"


def test_without_hooks_a_clone_restore_mounts_the_clone_the_array_presented(
    hookless: Rig, tmp_path: Path
) -> None:
    """A clone-mode restore on a node with no hook: AttachVolume carries the identity the array
    gave the clone when it was mapped to this host; the agent mounts the device of that identity,
    not the released original (which stays attached: nothing detaches it without a hook)."""
    data = hookless.luns["data"]
    point = str(data.mount_point)
    (data.mount_point / "data" / "original").write_text("o")
    (released,) = hookless.call(lambda agent: agent.release_volumes(OPERATION, [point]))
    assert mounted_at(data.mount_point) == [] and loop_devices_of(data.image) == [released.device]

    # The array's clone: the original's filesystem (same UUID) with a file of its own, mapped to
    # this host: a device behind a by-id link named by its WWN, as udev makes one.
    clone = data.image.parent / "data_clone.img"
    shutil.copyfile(data.image, clone)
    device = _run("losetup", "--find", "--show", str(clone)).strip()
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    _run("mount", "-t", "ext4", device, str(scratch))
    try:
        (scratch / "data" / "from-clone").write_text("c")
    finally:
        _run("umount", str(scratch))
    (hookless.pool / f"wwn-0x{CLONE_WWN}").symlink_to(device)

    (volume,) = hookless.call(
        lambda agent: agent.attach_volumes(
            OPERATION, [(point, "data_clone")], {point: f"naa.{CLONE_WWN}"}
        )
    )
    assert volume.mounted and volume.device == device and volume.fs_uuid == data.uuid
    assert mounted_at(data.mount_point) == [device]
    assert (data.mount_point / "data" / "from-clone").read_text() == "c"


def test_release_then_attach_brings_back_the_same_filesystem(rig: Rig) -> None:
    data = rig.luns["data"]
    point = str(data.mount_point)
    uuid = data.uuid
    (data.mount_point / "data" / "nb-1-big-Data.db").write_bytes(b"sstable" * 1000)
    commitlog = rig.luns["commitlog"].mount_point / "commitlog"
    (commitlog / "CommitLog-8-1.log").write_bytes(b"m" * 4096)

    state = rig.call(lambda agent: agent.volume_state())
    assert not state.cassandra_running and state.detail
    before = {volume.mount_point: volume for volume in state.volumes}
    assert before[point].fs_uuid == uuid and before[point].mounted
    assert before[point].kinds == ("data",)
    assert before[point].loop_backing_file == str(data.image)

    released = rig.call(lambda agent: agent.release_volumes(OPERATION, [point]))
    (volume,) = released
    assert not volume.mounted and volume.released_by == OPERATION and volume.fs_uuid == uuid
    assert mounted_at(data.mount_point) == []
    assert loop_devices_of(data.image) == [], "the detach hook did not detach the LUN"
    record = rig.state / "volumes" / "restores" / f"{OPERATION}.json"  # [volumes] state_directory
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    (detached,) = rig.hooks()
    assert detached["env"]["RINGSNAP_DEVICE"] == volume.device
    assert detached["env"]["RINGSNAP_FS_UUID"] == uuid
    # a loop device has no serial or WWN: the variables are there, empty
    assert detached["env"]["RINGSNAP_SERIAL"] == detached["env"]["RINGSNAP_WWN"] == ""
    # again: reported as released, nothing done twice
    assert rig.call(lambda agent: agent.release_volumes(OPERATION, [point])) == released
    assert len(rig.hooks()) == 1
    state = rig.call(lambda agent: agent.volume_state())
    assert [v.mount_point for v in state.volumes if v.released_by == OPERATION] == [point]

    attached = rig.call(lambda agent: agent.attach_volumes(OPERATION, [(point, "data")]))
    (volume,) = attached
    assert volume.mounted and volume.fs_uuid == uuid and volume.released_by == ""
    assert mounted_at(data.mount_point) == [volume.device]
    assert loop_devices_of(data.image) == [volume.device]
    assert (data.mount_point / "data" / "nb-1-big-Data.db").read_bytes() == b"sstable" * 1000
    assert rig.hooks()[-1]["env"]["RINGSNAP_VOLUME"] == "data"
    state = rig.call(lambda agent: agent.volume_state())
    assert all(v.mounted and not v.released_by for v in state.volumes)

    # the commit log did not come back with the restore: its replay state is discarded
    discarded = rig.call(lambda agent: agent.discard_replay_state(OPERATION, hints=False))
    assert [(d.kind, d.files, d.bytes) for d in discarded] == [("commitlog", 1, 4096)]
    assert commitlog.is_dir() and list(commitlog.iterdir()) == []
    assert (data.mount_point / "data" / "nb-1-big-Data.db").exists()


def test_a_process_holding_a_file_makes_release_refuse_naming_it(rig: Rig) -> None:
    data = rig.luns["data"]
    held = data.mount_point / "data" / "held.db"
    held.write_text("x")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; f = open(sys.argv[1]); print('open', flush=True);"
         " time.sleep(600)", str(held)],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        with pytest.raises(AgentError) as refused:
            rig.call(lambda agent: agent.release_volumes(OPERATION, [str(data.mount_point)]))
        assert refused.value.code == "FAILED_PRECONDITION"
        assert f"pid {holder.pid}" in str(refused.value)
        assert str(data.mount_point) in str(refused.value)
        assert mounted_at(data.mount_point) != []
        assert not (rig.state / "volumes" / "restores" / f"{OPERATION}.json").exists()
        assert rig.hooks() == []
    finally:
        holder.kill()
        holder.wait(10)
    # the holder gone, the same request goes through
    (volume,) = rig.call(lambda agent: agent.release_volumes(OPERATION, [str(data.mount_point)]))
    assert not volume.mounted and mounted_at(data.mount_point) == []


def test_another_filesystem_is_refused_and_nothing_stays_mounted(rig: Rig) -> None:
    data = rig.luns["data"]
    point = str(data.mount_point)
    (data.mount_point / "data" / "keep").write_text("mine")
    rig.call(lambda agent: agent.release_volumes(OPERATION, [point]))
    impostor = make_image(rig.pool, "impostor")
    assert fs_uuid(impostor) != data.uuid

    with pytest.raises(AgentError) as refused:
        rig.call(lambda agent: agent.attach_volumes(OPERATION, [(point, "impostor")]))
    assert refused.value.code == "FAILED_PRECONDITION"
    assert fs_uuid(impostor) in str(refused.value) and data.uuid in str(refused.value)
    assert mounted_at(data.mount_point) == []
    # what the attach hook attached went to the detach hook: nothing stays attached
    assert loop_devices_of(impostor) == []
    detached = rig.hooks()[-1]
    assert detached["hook"] == "detach" and detached["env"]["RINGSNAP_VOLUME"] == "impostor"
    assert "was handed to [volumes] detach_command" in str(refused.value)
    state = rig.call(lambda agent: agent.volume_state())
    assert [v.mount_point for v in state.volumes if not v.mounted] == [point]

    # the right volume is accepted afterwards
    (volume,) = rig.call(lambda agent: agent.attach_volumes(OPERATION, [(point, "data")]))
    assert volume.mounted and (data.mount_point / "data" / "keep").read_text() == "mine"


def test_refusals_carry_their_status_code(rig: Rig) -> None:
    data = str(rig.luns["data"].mount_point)

    def code_of(work: Callable[[GrpcNodeAgent], Awaitable[object]]) -> str:
        with pytest.raises(AgentError) as refused:
            rig.call(work)
        return refused.value.code

    assert code_of(lambda a: a.release_volumes(OPERATION, ["/"])) == "INVALID_ARGUMENT"
    assert code_of(lambda a: a.release_volumes(OPERATION, [str(rig.state)])) == "INVALID_ARGUMENT"
    assert code_of(lambda a: a.release_volumes("../x", [data])) == "INVALID_ARGUMENT"
    assert code_of(lambda a: a.attach_volumes(OPERATION, [(data, "data")])) == (
        "FAILED_PRECONDITION"  # never released under this operation
    )
    assert code_of(lambda a: a.attach_volumes(OPERATION, [(data, "$(reboot)")])) == (
        "INVALID_ARGUMENT"
    )
    assert code_of(lambda a: a.discard_replay_state("never-released", hints=True)) == (
        "FAILED_PRECONDITION"
    )
    assert mounted_at(rig.luns["data"].mount_point) != [] and rig.hooks() == []
    assert os.listdir(rig.luns["commitlog"].mount_point / "commitlog") == []


def test_an_agent_that_cannot_restore_refuses_up_front_naming_the_drop_in(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the shipped unit without the restore drop-in gets (here the detection is told so):
    FAILED_PRECONDITION before anything is unmounted or any hook runs."""
    obstacle = "the agent runs in a mount namespace of its own (not the one of PID 1)"
    monkeypatch.setattr(mounts, "restore_obstacles", lambda *args: [obstacle])
    data = rig.luns["data"]
    for work in (
        lambda a: a.release_volumes(OPERATION, [str(data.mount_point)]),
        lambda a: a.attach_volumes(OPERATION, [(str(data.mount_point), "data")]),
    ):
        with pytest.raises(AgentError) as refused:
            rig.call(work)
        assert refused.value.code == "FAILED_PRECONDITION"
        assert obstacle in str(refused.value) and mounts.RESTORE_DROP_IN in str(refused.value)
    assert mounted_at(data.mount_point) != [] and rig.hooks() == []
    monkeypatch.undo()
    (volume,) = rig.call(lambda a: a.release_volumes(OPERATION, [str(data.mount_point)]))
    assert not volume.mounted
