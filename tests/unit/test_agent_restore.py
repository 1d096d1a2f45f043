"""The agent's side of restores against a fake host: records, refusals, hooks, discarding.

The host (mount table, mount/umount, block devices, UUIDs, who holds what) is faked; the records,
the hooks (real processes) and the directories emptied by DiscardReplayState are real. The proof
on real loop filesystems through gRPC is tests/integration/test_agent_volumes.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import sys
from collections.abc import Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from structlog.testing import capture_logs

from ringsnap.agent import mounts, volumes
from ringsnap.agent.config import AgentConfig, VolumesSection
from ringsnap.agent.errors import CommandFailed, Conflict
from ringsnap.agent.mounts import RESTORE_DROP_IN, Holder, Host
from ringsnap.agent.node import NodeAgent
from ringsnap.agent.nodetool import NodeIdentity
from ringsnap.agent.restore.model import ATTACHED, RELEASED, CassandraStatus, check_volume_name
from ringsnap.agent.restore.release_records import RestoreRecords
from ringsnap.agent.restore.replay_state import empty_directory
from ringsnap.agent.restore.restorer import VolumeRestorer
from ringsnap.config import validate
from ringsnap.errors import ConfigError, ValidationError
from ringsnap.mountinfo import Mount
from ringsnap.sandbox.agents import TestPki, agent_config, config_data

T = TypeVar("T")
ROOT_DEV = (8, 1)
DATA_DEV = (7, 1)
COMMITLOG_DEV = (7, 2)
UUID_DATA = "11111111-1111-4111-8111-111111111111"
UUID_COMMITLOG = "22222222-2222-4222-8222-222222222222"
UUID_OTHER = "99999999-9999-4999-8999-999999999999"
OPERATION = "restore-1"


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coroutine)


# -- the fake host --------------------------------------------------------------------------------


@dataclass
class FakeHost(Host):
    """Mounts in a list; devices, UUIDs and holders in dicts; every action in `calls`."""

    entries_: list[Mount] = field(default_factory=list)
    #: block device path -> (major, minor)
    devices: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: block device path -> filesystem UUID on it
    uuids: dict[str, str] = field(default_factory=dict)
    #: device number -> processes holding something on it
    holders: dict[int, list[Holder]] = field(default_factory=dict)
    #: directory -> processes holding something below it
    holders_below: dict[str, list[Holder]] = field(default_factory=dict)
    #: devices the kernel still holds after an unmount
    busy: set[str] = field(default_factory=set)
    calls: list[tuple[Any, ...]] = field(default_factory=list)
    umount_error: Exception | None = None
    #: called at each umount (to look at the record as it was then)
    on_umount: Any = None
    #: UUID a device shows once mounted, if it differs from `uuids` (a device that changed)
    uuid_after_mount: dict[str, str] = field(default_factory=dict)
    #: what restore_obstacles() reports (nothing: restores are possible)
    obstacles: list[str] = field(default_factory=list)

    def restore_obstacles(self) -> list[str]:
        return list(self.obstacles)

    def entries(self) -> list[Mount]:
        return list(self.entries_)

    def device_of(self, path: str) -> int:
        mount = volumes.mount_of(os.path.realpath(path), self.entries_)
        return os.makedev(mount.major, mount.minor)

    def is_directory(self, path: str) -> bool:
        return True

    def holders_of_device(self, device_number: int) -> tuple[list[Holder], list[int]]:
        return list(self.holders.get(device_number, [])), []

    def holders_under(self, directory: str) -> tuple[list[Holder], list[int]]:
        return list(self.holders_below.get(directory, [])), []

    def block_device_number(self, path: str) -> int | None:
        found = self.devices.get(path)
        return os.makedev(*found) if found else None

    def busy_reason(self, device: str) -> str:
        return f"the kernel still holds {device}" if device in self.busy else ""

    def identity(self, major: int, minor: int) -> volumes.DeviceIdentity:
        return volumes.DeviceIdentity(serial=f"SER-{major}-{minor}", wwn=f"wwn-{major}-{minor}")

    async def fs_uuid(self, device: str) -> str:
        mounted = any(e.source == device for e in self.entries_)
        if mounted and device in self.uuid_after_mount:
            return self.uuid_after_mount[device]
        return self.uuids.get(device, "")

    async def mount(
        self, device: str, mount_point: str, fs_type: str, options: Sequence[str]
    ) -> None:
        self.calls.append(("mount", device, mount_point, fs_type, tuple(options)))
        major, minor = self.devices[device]
        self.entries_.append(
            Mount(mount_point, major, minor, fs_type, device, "/", tuple(options), ("rw",))
        )

    async def umount(self, mount_point: str) -> None:
        self.calls.append(("umount", mount_point))
        if self.on_umount is not None:
            self.on_umount(mount_point)
        if self.umount_error is not None:
            raise self.umount_error
        for index in range(len(self.entries_) - 1, -1, -1):
            if self.entries_[index].mount_point == mount_point:
                del self.entries_[index]
                return
        raise CommandFailed(f"umount: {mount_point}: not mounted")


def entry(point: Path | str, dev: tuple[int, int], source: str) -> Mount:
    return Mount(
        str(point), *dev, "ext4", source, "/", ("rw", "noatime"), ("rw", "errors=remount-ro")
    )


@dataclass
class Node:
    """A fake node: data and commit log on their own (fake) filesystems below `root`, saved caches
    and CDC on the root filesystem; real directories for everything."""

    root: Path
    host: FakeHost
    status: list[CassandraStatus]
    hook_log: Path
    settings: VolumesSection = field(default_factory=VolumesSection)
    directories: dict[str, list[Path]] = field(default_factory=dict)
    state: Path = Path()
    #: [volumes] state_directory/restores; None: the old place, <state>/restores
    records: Path | None = None

    @property
    def data_mount(self) -> str:
        return str(self.root / "data")

    @property
    def commitlog_mount(self) -> str:
        return str(self.root / "commitlog")

    def restorer(self, **settings: Any) -> VolumeRestorer:
        async def cassandra() -> CassandraStatus:
            return self.status[-1]

        return VolumeRestorer(
            directories=self.directories,
            state_directory=self.state,
            settings=VolumesSection(**settings) if settings else self.settings,
            cassandra=cassandra,
            host=self.host,
            records_directory=self.records,
        )

    def record(self, operation: str = OPERATION) -> dict[str, Any]:
        directory = self.records or self.state / "restores"
        data: dict[str, Any] = json.loads((directory / f"{operation}.json").read_text())
        return data

    def hook_calls(self) -> list[dict[str, Any]]:
        if not self.hook_log.exists():
            return []
        return [json.loads(line) for line in self.hook_log.read_text().splitlines()]


@pytest.fixture
def node(tmp_path: Path) -> Node:
    root = Path(os.path.realpath(tmp_path))
    for name in ("data/data", "data/hints", "commitlog/commitlog", "local/saved_caches"):
        (root / name).mkdir(parents=True)
    (root / "local/cdc_raw").mkdir()
    host = FakeHost(
        entries_=[
            entry("/", ROOT_DEV, "/dev/vda1"),
            entry(root / "data", DATA_DEV, "/dev/sdb"),
            entry(root / "commitlog", COMMITLOG_DEV, "/dev/sdc"),
        ],
        devices={"/dev/vda1": ROOT_DEV, "/dev/sdb": DATA_DEV, "/dev/sdc": COMMITLOG_DEV},
        uuids={"/dev/sdb": UUID_DATA, "/dev/sdc": UUID_COMMITLOG},
    )
    return Node(
        root=root,
        host=host,
        status=[CassandraStatus(False, "no answer through nodetool: connection refused")],
        hook_log=root / "hooks.jsonl",
        directories={
            "data": [root / "data/data"],
            "commitlog": [root / "commitlog/commitlog"],
            "hints": [root / "data/hints"],
            "saved_caches": [root / "local/saved_caches"],
            "cdc_raw": [root / "local/cdc_raw"],
        },
        state=root / "state",
    )


def hook(node: Node, name: str, *, prints: str = "", exit_code: int = 0) -> list[str]:
    """A hook (a Python script, run without a shell) that appends its argv and RINGSNAP_*
    environment to node.hook_log as one JSON line, prints `prints`, exits with `exit_code`."""
    script = node.root / f"{name}.py"
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        f"with open({str(node.hook_log)!r}, 'a') as log:\n"
        "    env = {k: v for k, v in os.environ.items() if k.startswith('RINGSNAP_')}\n"
        f"    log.write(json.dumps({{'hook': {name!r}, 'argv': sys.argv[1:], 'env': env}}) + '\\n')\n"
        f"sys.stdout.write({prints!r})\n"
        f"sys.stderr.write('hook {name} says: exit {exit_code}\\n')\n"
        f"sys.exit({exit_code})\n"
    )
    script.chmod(0o755)
    # Arguments a shell would act on: they must arrive verbatim.
    return [str(script), "$(touch pwned)", "a b;c", "`id`"]


def mounted_points(node: Node) -> list[str]:
    return [e.mount_point for e in node.host.entries_]


# -- release ---------------------------------------------------------------------------------------


def test_release_records_before_unmounting_then_runs_the_detach_hook(node: Node) -> None:
    seen_at_umount: list[dict[str, Any]] = []
    node.host.on_umount = lambda point: seen_at_umount.append(node.record())
    detach = hook(node, "detach")
    released = run(node.restorer(detach_command=detach).release(OPERATION, [node.data_mount]))

    (volume,) = released
    assert (volume.mount_point, volume.device, volume.fs_uuid) == (
        node.data_mount,
        "/dev/sdb",
        UUID_DATA,
    )
    assert volume.kinds == ("data", "hints") and not volume.mounted
    assert volume.released_by == OPERATION and volume.serial == "SER-7-1"
    assert node.data_mount not in mounted_points(node)
    # the record was on disk, naming the volume, when umount ran
    (before,) = seen_at_umount
    (recorded,) = before["volumes"]
    assert recorded["mount_point"] == node.data_mount and recorded["state"] == RELEASED
    assert recorded["fs_uuid"] == UUID_DATA and recorded["detached"] is False
    assert recorded["options"] == ["rw", "noatime"]
    assert recorded["cassandra_directories"] == [
        str(node.root / "data/data"),
        str(node.root / "data/hints"),
    ]
    # after the hook: detached
    assert node.record()["volumes"][0]["detached"] is True
    path = node.state / "restores" / f"{OPERATION}.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700

    (call,) = node.hook_calls()
    assert call["argv"] == ["$(touch pwned)", "a b;c", "`id`"]
    assert not (node.root / "pwned").exists() and not Path("pwned").exists()
    assert call["env"] == {
        "RINGSNAP_OPERATION": OPERATION,
        "RINGSNAP_MOUNT_POINT": node.data_mount,
        "RINGSNAP_DEVICE": "/dev/sdb",
        "RINGSNAP_FS_UUID": UUID_DATA,
        "RINGSNAP_KINDS": "data,hints",
        "RINGSNAP_SERIAL": "SER-7-1",
        "RINGSNAP_WWN": "wwn-7-1",
    }


def test_hooks_never_see_the_agents_own_ringsnap_variables(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RINGSNAP_VOLUME", "leaked-from-the-agent")
    monkeypatch.setenv("RINGSNAP_EXTRA", "x")
    run(node.restorer(detach_command=hook(node, "detach")).release(OPERATION, [node.data_mount]))
    (call,) = node.hook_calls()
    assert "RINGSNAP_VOLUME" not in call["env"] and "RINGSNAP_EXTRA" not in call["env"]


def test_releasing_again_reports_the_volume_and_unmounts_nothing_more(node: Node) -> None:
    restorer = node.restorer(detach_command=hook(node, "detach"))
    first = run(restorer.release(OPERATION, [node.data_mount]))
    again = run(restorer.release(OPERATION, [node.data_mount]))
    assert again == first
    assert node.host.calls == [("umount", node.data_mount)]
    assert len(node.hook_calls()) == 1


def test_a_failed_detach_hook_fails_the_call_and_runs_again_on_retry(node: Node) -> None:
    failing = node.restorer(detach_command=hook(node, "detach", exit_code=3))
    with pytest.raises(CommandFailed, match="hook detach says: exit 3") as failed:
        run(failing.release(OPERATION, [node.data_mount]))
    assert "detach_command" in str(failed.value)
    # unmounted and recorded, not detached
    assert node.data_mount not in mounted_points(node)
    assert node.record()["volumes"][0]["detached"] is False
    state = run(failing.state())
    (released,) = [v for v in state.volumes if v.mount_point == node.data_mount]
    assert not released.mounted and released.released_by == OPERATION

    fixed = node.restorer(detach_command=hook(node, "detach"))
    (volume,) = run(fixed.release(OPERATION, [node.data_mount]))
    assert volume.released_by == OPERATION
    assert node.record()["volumes"][0]["detached"] is True
    assert [call["hook"] for call in node.hook_calls()] == ["detach", "detach"]
    assert node.host.calls == [("umount", node.data_mount)]


def test_release_is_refused_while_cassandra_runs(node: Node) -> None:
    node.status.append(CassandraStatus(True, "answers through nodetool: host id h1"))
    with pytest.raises(Conflict) as refused:
        run(node.restorer().release(OPERATION, [node.data_mount]))
    assert node.data_mount in str(refused.value)
    assert "Cassandra is running" in str(refused.value) and "StopCassandra" in str(refused.value)
    assert node.host.calls == [] and not (node.state / "restores").exists()


OBSTACLE = "PID 1 is not visible in /proc: other processes are hidden from the agent"


def test_restores_are_refused_up_front_where_the_agent_cannot_do_them(node: Node) -> None:
    """Without the restore drop-in (a private mount namespace, hidden processes): refused before
    Cassandra is asked, anything recorded or any hook run, naming the drop-in to install."""
    asked: list[str] = []
    detach = hook(node, "detach")
    restorer = node.restorer(detach_command=detach, attach_command=hook(node, "attach"))

    async def cassandra() -> CassandraStatus:
        asked.append("cassandra")
        return node.status[-1]

    restorer._cassandra = cassandra
    node.host.obstacles = [OBSTACLE]
    calls: list[Coroutine[Any, Any, Any]] = [
        restorer.release(OPERATION, [node.data_mount]),
        restorer.attach(OPERATION, [(node.data_mount, "vol_data")]),
        restorer.discard(OPERATION, hints=True),
    ]
    for call in calls:
        with pytest.raises(Conflict) as refused:
            run(call)
        message = str(refused.value)
        assert OBSTACLE in message and RESTORE_DROP_IN in message
        assert "systemd/ringsnap-agent.service.d/restore.conf" in message
        assert "not mounted from a block device" not in message
    assert asked == [] and node.host.calls == [] and node.hook_calls() == []
    assert not (node.state / "restores").exists()
    # the state is still reported
    assert len(run(restorer.state()).volumes) == 3

    node.host.obstacles = []
    (volume,) = run(restorer.release(OPERATION, [node.data_mount]))
    assert volume.released_by == OPERATION


def test_release_is_refused_while_a_process_holds_a_file_on_the_filesystem(node: Node) -> None:
    node.host.holders[os.makedev(*DATA_DEV)] = [
        Holder(4242, "java", f"fd 17 {node.data_mount}/data/ks/t/nb-1-big-Data.db")
    ]
    with pytest.raises(Conflict) as refused:
        run(node.restorer().release(OPERATION, [node.commitlog_mount, node.data_mount]))
    message = str(refused.value)
    assert "pid 4242 (java)" in message and node.data_mount in message
    # refused before anything changed: the commit log (named first) is still mounted too
    assert node.host.calls == [] and not (node.state / "restores").exists()


def test_release_is_refused_when_the_kernel_still_holds_the_device(node: Node) -> None:
    node.host.busy.add("/dev/sdb")
    with pytest.raises(Conflict, match="must not revert or clone"):
        run(
            node.restorer(detach_command=hook(node, "detach")).release(OPERATION, [node.data_mount])
        )
    assert node.hook_calls() == []
    assert node.record()["volumes"][0]["detached"] is False


def test_a_failed_unmount_leaves_no_record_behind(node: Node) -> None:
    node.host.umount_error = CommandFailed("`umount` failed (exit 32): target is busy")
    with pytest.raises(CommandFailed, match="target is busy"):
        run(node.restorer().release(OPERATION, [node.data_mount]))
    assert not (node.state / "restores" / f"{OPERATION}.json").exists()
    state = run(node.restorer().state())
    assert all(v.released_by == "" and v.mounted for v in state.volumes)


@pytest.mark.parametrize(
    ("point", "reason"),
    [
        ("/", "never unmounts /"),
        ("relative/data", "absolute"),
        ("/srv/../etc", "'..'"),
        ("/srv/elsewhere", "not the mount point of a filesystem that holds"),
    ],
)
def test_release_refuses_what_it_must_never_unmount(node: Node, point: str, reason: str) -> None:
    with pytest.raises(ValidationError, match=reason):
        run(node.restorer().release(OPERATION, [point]))
    assert node.host.calls == []


def test_release_refuses_the_filesystem_of_the_agents_state(node: Node) -> None:
    node.state = node.root / "data" / "ringsnap-state"
    with pytest.raises(ValidationError, match="agent's state"):
        run(node.restorer().release(OPERATION, [node.data_mount]))
    assert node.host.calls == []


@pytest.mark.parametrize("operation", ["", "../x", "a/b", "x" * 129, ".hidden"])
def test_release_refuses_unsafe_operation_ids(node: Node, operation: str) -> None:
    with pytest.raises(ValidationError, match="run id"):
        run(node.restorer().release(operation, [node.data_mount]))


def test_a_volume_released_by_another_operation_is_refused(node: Node) -> None:
    run(node.restorer().release("restore-0", [node.data_mount]))
    with pytest.raises(Conflict, match="released by operation 'restore-0'"):
        run(node.restorer().release(OPERATION, [node.data_mount]))


def test_an_empty_list_releases_every_cassandra_filesystem_but_leaves_root(node: Node) -> None:
    released = run(node.restorer().release(OPERATION, []))
    assert sorted(v.mount_point for v in released) == sorted(
        [node.data_mount, node.commitlog_mount]
    )
    assert mounted_points(node) == ["/"]
    # again: both reported, nothing unmounted twice
    assert len(run(node.restorer().release(OPERATION, []))) == 2
    assert len(node.host.calls) == 2


def test_an_empty_list_refuses_data_on_the_root_filesystem(node: Node) -> None:
    node.directories["data"].append(node.root / "local" / "data2")
    with pytest.raises(Conflict, match="never releases"):
        run(node.restorer().release(OPERATION, []))
    assert node.host.calls == []


def test_an_unreadable_record_refuses_changes_but_not_the_state(node: Node) -> None:
    records = node.state / "restores"
    records.mkdir(parents=True)
    (records / "restore-0.json").write_text("{not json")
    with pytest.raises(Conflict, match="unreadable"):
        run(node.restorer().release(OPERATION, [node.data_mount]))
    assert node.host.calls == []
    assert len(run(node.restorer().state()).volumes) == 3  # data, commit log, and / (caches)


def test_records_go_to_the_records_directory_and_old_ones_are_still_found(node: Node) -> None:
    """An agent upgraded between release and attach: the record the old one left in
    <freeze state>/restores is read (never moved); new records go to [volumes] state_directory."""
    run(node.restorer().release(OPERATION, [node.data_mount]))  # the old agent
    legacy = node.state / "restores" / f"{OPERATION}.json"
    left = legacy.read_bytes()
    node.records = node.root / "var-lib" / "restores"
    upgraded = node.restorer()

    by_point = {v.mount_point: v for v in run(upgraded.state()).volumes}
    assert by_point[node.data_mount].released_by == OPERATION
    (volume,) = run(upgraded.release(OPERATION, [node.data_mount]))  # again: already released
    assert volume.released_by == OPERATION and node.host.calls == [("umount", node.data_mount)]
    (volume,) = run(upgraded.attach(OPERATION, [(node.data_mount, "vol_data")]))
    assert volume.mounted
    assert node.record()["volumes"][0]["state"] == ATTACHED  # written to the new place
    assert stat.S_IMODE(node.records.stat().st_mode) == 0o700
    assert legacy.read_bytes() == left  # the old one is left as it was, and shadowed
    assert run(upgraded.discard(OPERATION, hints=False))  # the attached record is the one read

    run(upgraded.release("restore-2", [node.commitlog_mount]))
    assert (node.records / "restore-2.json").exists()
    assert not (node.state / "restores" / "restore-2.json").exists()


def test_a_volume_an_old_record_holds_is_refused_naming_where_that_record_is(node: Node) -> None:
    run(node.restorer().release("restore-0", [node.data_mount]))
    node.records = node.root / "var-lib" / "restores"
    with pytest.raises(Conflict) as refused:
        run(node.restorer().release(OPERATION, [node.data_mount]))
    assert str(node.state / "restores" / "restore-0.json") in str(refused.value)


def test_release_refuses_the_filesystem_of_the_restore_records(node: Node) -> None:
    node.records = node.root / "data" / "ringsnap" / "restores"
    with pytest.raises(ValidationError, match="restore records"):
        run(node.restorer().release(OPERATION, [node.data_mount]))
    with pytest.raises(Conflict, match="restore records"):
        run(node.restorer().release(OPERATION, []))  # data is there: refused as a whole
    assert node.host.calls == []


def test_records_on_a_cassandra_filesystem_are_named_for_check(node: Node) -> None:
    node.records = node.root / "var-lib" / "restores"  # on '/' (with the saved caches): fine
    assert node.restorer().records_on_cassandra_filesystem() == ""
    node.records = node.root / "commitlog" / "ringsnap" / "restores"
    message = node.restorer().records_on_cassandra_filesystem()
    assert f"{node.records} is on {node.commitlog_mount}" in message
    assert "holds Cassandra commitlog" in message and "[volumes] state_directory" in message


# -- state ------------------------------------------------------------------------------------------


def test_volume_state_lists_mounted_and_released_volumes(node: Node) -> None:
    before = run(node.restorer().state())
    assert not before.cassandra.running and "connection refused" in before.cassandra.detail
    by_point = {v.mount_point: v for v in before.volumes}
    assert by_point[node.data_mount].kinds == ("data", "hints")
    assert by_point[node.data_mount].fs_uuid == UUID_DATA and by_point[node.data_mount].mounted
    assert by_point[node.commitlog_mount].kinds == ("commitlog",)
    assert by_point["/"].kinds == ("saved_caches", "cdc_raw")

    run(node.restorer().release(OPERATION, [node.data_mount]))
    after = {v.mount_point: v for v in run(node.restorer().state()).volumes}
    released = after[node.data_mount]
    assert not released.mounted and released.released_by == OPERATION
    assert released.fs_uuid == UUID_DATA and released.device == "/dev/sdb"
    # the data directory now resolves to '/', but is not reported there: it is on the released volume
    assert after["/"].kinds == ("saved_caches", "cdc_raw")
    assert after[node.commitlog_mount].released_by == ""


# -- attach -----------------------------------------------------------------------------------------


def released(node: Node, *points: str, **settings: Any) -> VolumeRestorer:
    restorer = node.restorer(**settings)
    run(restorer.release(OPERATION, list(points)))
    node.host.calls.clear()
    return restorer


def test_attach_mounts_the_device_the_hook_names_and_checks_the_uuid(node: Node) -> None:
    attach = hook(node, "attach", prints="rescanning...\n/dev/sdz\n")
    restorer = released(node, node.data_mount, attach_command=attach)
    node.host.devices["/dev/sdz"] = (65, 144)
    node.host.uuids["/dev/sdz"] = UUID_DATA  # a clone keeps the filesystem UUID

    (volume,) = run(restorer.attach(OPERATION, [(node.data_mount, "svm1:/vol/data_clone")]))
    assert volume.mounted and volume.released_by == "" and volume.device == "/dev/sdz"
    assert volume.fs_uuid == UUID_DATA
    assert node.host.calls == [("mount", "/dev/sdz", node.data_mount, "ext4", ("rw", "noatime"))]
    (call,) = node.hook_calls()
    assert call["env"] == {
        "RINGSNAP_OPERATION": OPERATION,
        "RINGSNAP_MOUNT_POINT": node.data_mount,
        "RINGSNAP_DEVICE": "/dev/sdb",
        "RINGSNAP_FS_UUID": UUID_DATA,
        "RINGSNAP_KINDS": "data,hints",
        "RINGSNAP_SERIAL": "SER-7-1",
        "RINGSNAP_WWN": "wwn-7-1",
        "RINGSNAP_VOLUME": "svm1:/vol/data_clone",
    }
    recorded = node.record()["volumes"][0]
    assert recorded["state"] == ATTACHED and recorded["attached_device"] == "/dev/sdz"
    assert recorded["volume_name"] == "svm1:/vol/data_clone"
    state = run(restorer.state())
    assert all(v.released_by == "" and v.mounted for v in state.volumes)

    # again: reported, no hook, no second mount
    again = run(restorer.attach(OPERATION, [(node.data_mount, "svm1:/vol/data_clone")]))
    assert again[0].mounted and len(node.host.calls) == 1 and len(node.hook_calls()) == 1


def test_attach_without_a_hook_mounts_the_recorded_device(node: Node) -> None:
    restorer = released(node, node.data_mount)
    (volume,) = run(restorer.attach(OPERATION, [(node.data_mount, "vol_data")]))
    assert volume.device == "/dev/sdb"
    assert node.host.calls == [("mount", "/dev/sdb", node.data_mount, "ext4", ("rw", "noatime"))]


CLONE_WWN = "600a098038304437522b4d6f6a6b7a31"


def test_attach_without_a_hook_mounts_the_clone_found_by_its_identity(
    node: Node, tmp_path: Path
) -> None:
    """A clone-mode restore on a node with no attach hook: the released device is the original
    volume; the clone the coordinator presented to this host is found by its WWN in the by-id
    directory and mounted (it keeps the original's filesystem UUID)."""
    by_id = tmp_path / "by-id"
    by_id.mkdir()
    restorer = released(node, node.data_mount, by_id_dir=by_id)
    (by_id / f"wwn-0x{CLONE_WWN}").symlink_to("/dev/sdz")
    node.host.devices["/dev/sdz"] = (65, 144)
    node.host.uuids["/dev/sdz"] = UUID_DATA

    (volume,) = run(
        restorer.attach(
            OPERATION,
            [(node.data_mount, "data_clone")],
            {node.data_mount + "/": f"naa.{CLONE_WWN.upper()}"},  # any spelling of both
        )
    )
    assert volume.mounted and volume.device == "/dev/sdz"
    assert node.host.calls == [("mount", "/dev/sdz", node.data_mount, "ext4", ("rw", "noatime"))]
    recorded = node.record()["volumes"][0]
    assert recorded["attached_device"] == "/dev/sdz" and recorded["volume_name"] == "data_clone"


def test_a_clone_found_by_identity_holding_another_filesystem_is_not_mounted(
    node: Node, tmp_path: Path
) -> None:
    by_id = tmp_path / "by-id"
    by_id.mkdir()
    restorer = released(node, node.data_mount, by_id_dir=by_id)
    (by_id / f"wwn-0x{CLONE_WWN}").symlink_to("/dev/sdz")
    node.host.devices["/dev/sdz"] = (65, 144)
    node.host.uuids["/dev/sdz"] = UUID_OTHER  # the array mapped another volume under that id
    with pytest.raises(Conflict, match="nothing was mounted") as refused:
        run(restorer.attach(OPERATION, [(node.data_mount, "c")], {node.data_mount: CLONE_WWN}))
    assert "/dev/sdz" in str(refused.value) and UUID_OTHER in str(refused.value)
    assert node.host.calls == [] and node.record()["volumes"][0]["state"] == RELEASED


@pytest.mark.parametrize(
    ("identity", "point", "words"),
    [
        ("serial-ABC", "", "is no WWN, NAA or EUI id"),
        ("600a0980", "", "is no WWN"),  # too short to name a LUN
        (CLONE_WWN, "/elsewhere", "which is not attached"),
    ],
)
def test_attach_refuses_an_identity_that_names_nothing_it_attaches(
    node: Node, identity: str, point: str, words: str
) -> None:
    restorer = released(node, node.data_mount)
    with pytest.raises(ValidationError, match=words):
        run(
            restorer.attach(
                OPERATION, [(node.data_mount, "c")], {point or node.data_mount: identity}
            )
        )
    assert node.host.calls == []


def test_attach_refuses_another_filesystem_and_mounts_nothing(node: Node) -> None:
    restorer = released(node, node.data_mount)
    node.host.uuids["/dev/sdb"] = UUID_OTHER  # the array put something else there
    with pytest.raises(Conflict) as refused:
        run(restorer.attach(OPERATION, [(node.data_mount, "vol_data")]))
    assert UUID_OTHER in str(refused.value) and UUID_DATA in str(refused.value)
    assert node.host.calls == [] and node.data_mount not in mounted_points(node)
    assert node.record()["volumes"][0]["state"] == RELEASED


def test_attach_unmounts_again_when_what_got_mounted_is_not_the_filesystem(node: Node) -> None:
    restorer = released(node, node.data_mount)
    node.host.uuid_after_mount["/dev/sdb"] = UUID_OTHER
    with pytest.raises(Conflict, match="unmounted again") as refused:
        run(restorer.attach(OPERATION, [(node.data_mount, "vol_data")]))
    assert UUID_OTHER in str(refused.value) and UUID_DATA in str(refused.value)
    assert [call[0] for call in node.host.calls] == ["mount", "umount"]
    assert node.data_mount not in mounted_points(node)
    assert node.record()["volumes"][0]["state"] == RELEASED


def test_a_refused_device_the_attach_hook_attached_is_handed_to_the_detach_hook(
    node: Node,
) -> None:
    attach = hook(node, "attach", prints="/dev/sdz\n")
    restorer = released(
        node, node.data_mount, attach_command=attach, detach_command=hook(node, "detach")
    )
    node.hook_log.unlink()
    node.host.devices["/dev/sdz"] = (65, 144)
    node.host.uuids["/dev/sdz"] = UUID_OTHER  # the array presented another filesystem

    with pytest.raises(Conflict) as refused:
        run(restorer.attach(OPERATION, [(node.data_mount, "svm1:/vol/data_clone")]))
    message = str(refused.value)
    assert UUID_OTHER in message and "nothing was mounted" in message
    assert "/dev/sdz was handed to [volumes] detach_command" in message
    attach_call, detach_call = node.hook_calls()
    assert attach_call["hook"] == "attach" and detach_call["hook"] == "detach"
    assert detach_call["env"] == {
        "RINGSNAP_OPERATION": OPERATION,
        "RINGSNAP_MOUNT_POINT": node.data_mount,
        "RINGSNAP_DEVICE": "/dev/sdz",  # what the attach hook attached, not the recorded one
        "RINGSNAP_FS_UUID": UUID_DATA,
        "RINGSNAP_KINDS": "data,hints",
        "RINGSNAP_SERIAL": "SER-65-144",  # the attached device's own identity
        "RINGSNAP_WWN": "wwn-65-144",
        "RINGSNAP_VOLUME": "svm1:/vol/data_clone",
    }
    assert node.host.calls == [] and node.data_mount not in mounted_points(node)
    recorded = node.record()["volumes"][0]
    assert recorded["state"] == RELEASED and recorded["device"] == "/dev/sdb"


def test_a_device_refused_once_mounted_is_unmounted_then_detached(node: Node) -> None:
    restorer = released(
        node,
        node.data_mount,
        attach_command=hook(node, "attach"),  # prints nothing: the recorded device is mounted
        detach_command=hook(node, "detach"),
    )
    node.hook_log.unlink()
    node.host.uuid_after_mount["/dev/sdb"] = UUID_OTHER
    with pytest.raises(Conflict, match="unmounted again; /dev/sdb was handed to"):
        run(restorer.attach(OPERATION, [(node.data_mount, "vol_data")]))
    assert [call[0] for call in node.host.calls] == ["mount", "umount"]
    assert [call["hook"] for call in node.hook_calls()] == ["attach", "detach"]
    assert node.hook_calls()[1]["env"]["RINGSNAP_DEVICE"] == "/dev/sdb"


def test_a_refused_device_without_a_detach_hook_or_whose_detach_fails_is_named(
    node: Node,
) -> None:
    restorer = released(node, node.data_mount, attach_command=hook(node, "attach"))
    node.host.uuids["/dev/sdb"] = UUID_OTHER
    with pytest.raises(Conflict, match="not configured, so /dev/sdb stays attached"):
        run(restorer.attach(OPERATION, [(node.data_mount, "vol_data")]))

    failing = node.restorer(
        attach_command=hook(node, "attach"), detach_command=hook(node, "detach", exit_code=4)
    )
    with pytest.raises(Conflict) as refused:
        run(failing.attach(OPERATION, [(node.data_mount, "vol_data")]))
    message = str(refused.value)
    assert "detaching /dev/sdb failed too" in message and "hook detach says: exit 4" in message
    assert "detach it by hand" in message


def test_a_device_that_is_not_from_the_attach_hook_is_never_detached(node: Node) -> None:
    restorer = released(node, node.data_mount, detach_command=hook(node, "detach"))
    node.hook_log.unlink()
    node.host.uuids["/dev/sdb"] = UUID_OTHER
    with pytest.raises(Conflict) as refused:
        run(restorer.attach(OPERATION, [(node.data_mount, "vol_data")]))
    assert "detach" not in str(refused.value) and node.hook_calls() == []


def test_attach_only_mounts_what_the_same_operation_released(node: Node) -> None:
    restorer = released(node, node.data_mount)
    with pytest.raises(Conflict, match="not released by operation 'restore-2'"):
        run(restorer.attach("restore-2", [(node.data_mount, "vol_data")]))
    with pytest.raises(Conflict) as refused:
        run(restorer.attach(OPERATION, [(node.commitlog_mount, "vol_cl")]))
    assert node.commitlog_mount in str(refused.value)
    assert node.host.calls == []


def test_attach_is_refused_while_cassandra_runs(node: Node) -> None:
    restorer = released(node, node.data_mount)
    node.status.append(CassandraStatus(True, "answers"))
    with pytest.raises(Conflict, match="Cassandra is running"):
        run(restorer.attach(OPERATION, [(node.data_mount, "vol_data")]))
    assert node.host.calls == []


def test_a_hook_that_names_no_block_device_fails(node: Node) -> None:
    restorer = released(
        node, node.data_mount, attach_command=hook(node, "attach", prints="/dev/nothing\n")
    )
    with pytest.raises(CommandFailed, match="not a block device"):
        run(restorer.attach(OPERATION, [(node.data_mount, "vol_data")]))
    assert node.host.calls == []


@pytest.mark.parametrize(
    "name",
    ["", "../vol", "a b", "$(reboot)", "-rf", "x" * 256, "a;b", "vol\n", "vol`id`", "v*"],
)
def test_bad_volume_names_are_refused_before_anything_runs(node: Node, name: str) -> None:
    restorer = released(node, node.data_mount, attach_command=hook(node, "attach"))
    with pytest.raises(ValidationError, match="volume name"):
        run(restorer.attach(OPERATION, [(node.data_mount, name)]))
    assert node.hook_calls() == [] and node.host.calls == []


@pytest.mark.parametrize("name", ["vol_1", "svm1:/vol/data", "pool/lun-3.a", "x" * 255])
def test_array_volume_names_pass(name: str) -> None:
    assert check_volume_name(name) == name


# -- discard ----------------------------------------------------------------------------------------


def fill(directory: Path, files: int, size: int = 10) -> None:
    for index in range(files):
        (directory / f"f{index}").write_bytes(b"x" * size)


def attached(node: Node, *points: str) -> VolumeRestorer:
    restorer = released(node, *points)
    pairs = [(point, f"vol{index}") for index, point in enumerate(points)]
    run(restorer.attach(OPERATION, pairs))
    return restorer


def test_discard_empties_replay_state_outside_the_restored_filesystems(node: Node) -> None:
    root = node.root
    fill(root / "commitlog/commitlog", 3, 100)
    fill(root / "data/hints", 2)
    fill(root / "local/saved_caches", 4, 25)
    (root / "local/saved_caches/sub").mkdir()
    fill(root / "local/saved_caches/sub", 1, 7)
    outside = root / "outside"
    outside.mkdir()
    fill(outside, 1)
    (root / "local/cdc_raw/link").symlink_to(outside)
    restorer = attached(node, node.data_mount)  # only data came back; the commit log did not

    with capture_logs() as logs:
        discarded = run(restorer.discard(OPERATION, hints=True))
    by_kind = {d.kind: d for d in discarded}
    assert set(by_kind) == {"commitlog", "saved_caches", "cdc_raw"}  # hints: on the restored fs
    assert (by_kind["commitlog"].files, by_kind["commitlog"].bytes) == (3, 300)
    assert (by_kind["saved_caches"].files, by_kind["saved_caches"].bytes) == (5, 107)
    assert by_kind["cdc_raw"].files == 1
    for directory in ("commitlog/commitlog", "local/saved_caches", "local/cdc_raw"):
        assert (root / directory).is_dir() and not list((root / directory).iterdir())
    assert len(list((root / "data/hints").iterdir())) == 2  # came back from the snapshot
    assert (outside / "f0").exists()  # a link was removed, never followed
    warnings = [e for e in logs if e["log_level"] == "warning" and e["event"].startswith("discard")]
    logged = {(e["path"], e.get("files")) for e in warnings if "files" in e}
    assert logged == {
        (str(root / "commitlog/commitlog"), 3),
        (str(root / "local/saved_caches"), 5),
        (str(root / "local/cdc_raw"), 1),
    }


def test_discard_keeps_hints_unless_asked_and_keeps_every_restored_filesystem(node: Node) -> None:
    fill(node.root / "commitlog/commitlog", 2)
    fill(node.root / "local/saved_caches", 1)
    node.directories["hints"] = [node.root / "local/hints"]
    (node.root / "local/hints").mkdir()
    fill(node.root / "local/hints", 2)
    restorer = attached(node, node.data_mount, node.commitlog_mount)

    discarded = run(restorer.discard(OPERATION, hints=False))
    assert {d.kind for d in discarded} == {"saved_caches", "cdc_raw"}
    assert len(list((node.root / "commitlog/commitlog").iterdir())) == 2
    assert len(list((node.root / "local/hints").iterdir())) == 2

    discarded = run(restorer.discard(OPERATION, hints=True))
    assert {d.kind for d in discarded} == {"saved_caches", "cdc_raw", "hints"}
    assert not list((node.root / "local/hints").iterdir())
    assert (node.root / "local/hints").is_dir()


def test_discard_is_refused_while_cassandra_runs(node: Node) -> None:
    fill(node.root / "local/saved_caches", 1)
    restorer = attached(node, node.data_mount)
    node.status.append(CassandraStatus(True, "answers"))
    with pytest.raises(Conflict, match="Cassandra is running"):
        run(restorer.discard(OPERATION, hints=True))
    assert (node.root / "local/saved_caches/f0").exists()


def test_discard_is_refused_for_an_unknown_operation_or_before_attach(node: Node) -> None:
    fill(node.root / "commitlog/commitlog", 1)
    with pytest.raises(Conflict, match="released no volume"):
        run(node.restorer().discard(OPERATION, hints=False))
    released(node, node.data_mount)
    with pytest.raises(Conflict, match="not attached again"):
        run(node.restorer().discard(OPERATION, hints=False))
    assert (node.root / "commitlog/commitlog/f0").exists()


def test_discard_is_refused_while_a_process_holds_a_file_there(node: Node) -> None:
    fill(node.root / "commitlog/commitlog", 1)
    restorer = attached(node, node.data_mount)
    node.host.holders_below[str(node.root / "commitlog/commitlog")] = [
        Holder(77, "java", "fd 3 CommitLog-8-1.log")
    ]
    with pytest.raises(Conflict, match=r"pid 77 \(java\)"):
        run(restorer.discard(OPERATION, hints=False))
    assert (node.root / "commitlog/commitlog/f0").exists()


def test_empty_directory_keeps_the_directory_and_other_filesystems(tmp_path: Path) -> None:
    (tmp_path / "a/b").mkdir(parents=True)
    fill(tmp_path / "a/b", 2, 3)
    (tmp_path / "top").write_bytes(b"12345")
    assert empty_directory(str(tmp_path)) == (3, 11)
    assert tmp_path.is_dir() and not list(tmp_path.iterdir())


# -- records ----------------------------------------------------------------------------------------


def test_records_round_trip_and_refuse_garbage(tmp_path: Path) -> None:
    records = RestoreRecords(tmp_path / "restores")
    assert records.load("op-1") == []
    with pytest.raises(ValidationError):
        records.path("../escape")
    (tmp_path / "restores").mkdir()
    for garbage in ('{"volumes": [{"mount_point": 3}]}', "[]", '{"volumes": [{}]}'):
        (tmp_path / "restores/op-1.json").write_text(garbage)
        with pytest.raises(Conflict, match="unreadable"):
            records.load("op-1")
    found, problems = records.all()
    assert found == {} and len(problems) == 1


# -- the real /proc scan ----------------------------------------------------------------------------


def test_holders_are_found_in_proc_by_device_and_by_path(tmp_path: Path) -> None:
    held = tmp_path / "held"
    held.mkdir()
    with (held / "open.txt").open("w"):
        device = os.stat(held).st_dev
        by_device, _ = mounts.holders_of_device(device)
        mine = [h for h in by_device if h.pid == os.getpid()]
        assert any(str(held / "open.txt") in h.what for h in mine), by_device[:5]
        by_path, _ = mounts.holders_under(str(held))
        assert [h.pid for h in by_path] == [os.getpid()]
        assert "fd " in by_path[0].what
    assert mounts.holders_under(str(held))[0] == []


# -- can this process restore at all? --------------------------------------------------------------

ALL_CAPS = "000001ffffffffff"
CAP_SYS_ADMIN_ONLY = f"{1 << 21:016x}"
ROOT_SHARED = "27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
ROOT_SLAVE = "300 299 254:0 / / rw,relatime shared:180 master:1 - ext4 /dev/vda rw\n"


def fake_proc(
    root: Path,
    *,
    pid1: str | None = "same",
    kthreadd: str | None = None,
    caps: str = ALL_CAPS,
    mountinfo: str = ROOT_SHARED,
) -> tuple[Path, Path]:
    """A /proc with self/ns/mnt and self/status, and PID 1 (and kthreadd as PID 2) whose ns/mnt is
    the same file as self's ("same": a hard link, the same inode), another one ("other"), or
    cannot be looked at ("hidden"); pid1=None: PID 1 is not listed at all."""
    proc = root / "proc"
    (proc / "self" / "ns").mkdir(parents=True)
    (proc / "self" / "ns" / "mnt").write_text("")
    (proc / "self" / "status").write_text(f"Name:\tringsnap-agent\nCapEff:\t{caps}\n")
    for pid, how in (("1", pid1), ("2", kthreadd)):
        if how is None:
            continue
        (proc / pid / "ns").mkdir(parents=True)
        (proc / pid / "comm").write_text("kthreadd\n" if pid == "2" else "systemd\n")
        if how == "same":
            os.link(proc / "self" / "ns" / "mnt", proc / pid / "ns" / "mnt")
        elif how == "other":
            (proc / pid / "ns" / "mnt").write_text("")
    info = root / "mountinfo"
    info.write_text(mountinfo)
    return proc, info


def test_a_root_agent_in_the_hosts_namespace_meets_no_obstacle(tmp_path: Path) -> None:
    assert mounts.restore_obstacles(*fake_proc(tmp_path)) == []


def test_a_private_mount_namespace_is_an_obstacle(tmp_path: Path) -> None:
    (obstacle,) = mounts.restore_obstacles(*fake_proc(tmp_path, pid1="other"))
    assert "mount namespace of its own (not the one of PID 1)" in obstacle


def test_kthreadd_stands_in_for_a_pid_1_that_cannot_be_inspected(tmp_path: Path) -> None:
    """As in this test bed's VM: PID 1 holds capabilities the agent lacks, kthreadd does not."""
    proc, info = fake_proc(tmp_path / "a", pid1="hidden", kthreadd="same", mountinfo=ROOT_SLAVE)
    assert mounts.restore_obstacles(proc, info) == []
    proc, info = fake_proc(tmp_path / "b", pid1="hidden", kthreadd="other")
    (obstacle,) = mounts.restore_obstacles(proc, info)
    assert "not the one of kthreadd (PID 2)" in obstacle


def test_with_no_namespace_to_compare_a_slave_root_mount_is_an_obstacle(tmp_path: Path) -> None:
    proc, info = fake_proc(tmp_path / "a", pid1="hidden", mountinfo=ROOT_SLAVE)
    (obstacle,) = mounts.restore_obstacles(proc, info)
    assert "its / is a slave mount" in obstacle
    # shared, or private (a host without systemd): nothing shown, nothing refused
    for index, text in enumerate((ROOT_SHARED, ROOT_SHARED.replace(" shared:1", ""))):
        proc, info = fake_proc(tmp_path / f"b{index}", pid1="hidden", mountinfo=text)
        assert mounts.restore_obstacles(proc, info) == []


def test_the_shipped_unit_without_the_drop_in_meets_every_obstacle(tmp_path: Path) -> None:
    """User=ringsnap with CAP_SYS_ADMIN only, ProtectProc=invisible, ProtectSystem=strict."""
    proc, info = fake_proc(tmp_path, pid1=None, caps=CAP_SYS_ADMIN_ONLY, mountinfo=ROOT_SLAVE)
    hidden, ptrace, namespace = mounts.restore_obstacles(proc, info)
    assert "PID 1 is not visible in /proc" in hidden and "ProtectProc=invisible" in hidden
    assert "without CAP_SYS_PTRACE" in ptrace
    assert "slave mount" in namespace


@pytest.mark.skipif(os.geteuid() != 0, reason="the test bed's agents run as root")
def test_this_hosts_root_agent_outside_systemd_may_restore() -> None:
    """The sandbox test bed: root, outside systemd, in the host's mount namespace."""
    assert mounts.restore_obstacles() == []


# -- stop with drain ------------------------------------------------------------------------------


class FakeControl:
    def __init__(self, *, answers: bool, drain_fails: bool) -> None:
        self.answers = answers
        self.drain_fails = drain_fails
        self.calls: list[str] = []

    async def info(self, *, timeout: float | None = None) -> NodeIdentity:
        self.calls.append("info")
        if not self.answers:
            raise CommandFailed("`nodetool info` failed (exit 1): Connection refused")
        return NodeIdentity("h1", "dc1", "r1", ("1",), True, True)

    async def drain(self) -> float:
        self.calls.append("drain")
        if self.drain_fails:
            raise CommandFailed("`nodetool drain` failed (exit 1): Connection refused")
        return 0.1


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TestPki:
    return TestPki.create(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def agent_factory(pki: TestPki, tmp_path: Path) -> Iterator[Any]:
    made: list[NodeAgent] = []

    def make(control: FakeControl) -> tuple[NodeAgent, Path]:
        stopped = tmp_path / "stopped"
        config = agent_config(
            pki,
            data_directories=[tmp_path / "data"],
            commitlog_directory=tmp_path / "commitlog",
            state_directory=tmp_path / "state",
            cassandra={"stop_command": ["touch", str(stopped)]},
        )
        agent = NodeAgent(config)
        agent.control = control  # type: ignore[assignment]
        made.append(agent)
        return agent, stopped

    yield make


def test_stop_drains_when_cassandra_answers(agent_factory: Any) -> None:
    control = FakeControl(answers=True, drain_fails=False)
    agent, stopped = agent_factory(control)
    result = run(agent.stop_cassandra(drain=True))
    assert result.drained and stopped.exists() and control.calls == ["drain"]


def test_stop_skips_the_drain_of_a_node_that_does_not_answer(agent_factory: Any) -> None:
    control = FakeControl(answers=False, drain_fails=True)
    agent, stopped = agent_factory(control)
    with capture_logs() as logs:
        result = run(agent.stop_cassandra(drain=True))
    assert not result.drained and stopped.exists()
    assert any("without a drain" in e["event"] for e in logs)


def test_stop_fails_when_a_running_node_cannot_drain(agent_factory: Any) -> None:
    control = FakeControl(answers=True, drain_fails=True)
    agent, stopped = agent_factory(control)
    with pytest.raises(CommandFailed, match="drain"):
        run(agent.stop_cassandra(drain=True))
    assert not stopped.exists()


def test_cassandra_status_says_how_it_knows(agent_factory: Any) -> None:
    agent, _ = agent_factory(FakeControl(answers=False, drain_fails=False))
    status = run(agent.cassandra_status())
    assert not status.running and "Connection refused" in status.detail
    agent.control = FakeControl(answers=True, drain_fails=False)
    status = run(agent.cassandra_status())
    assert status.running and "host id h1" in status.detail


# -- configuration ----------------------------------------------------------------------------------


def test_volumes_table_and_cdc_directory_in_the_config(pki: TestPki, tmp_path: Path) -> None:
    settings: dict[str, Any] = {
        "data_directories": [tmp_path / "data"],
        "commitlog_directory": tmp_path / "commitlog",
        "state_directory": tmp_path / "state",
    }
    config = agent_config(pki, **settings)
    assert config.volumes.detach_command is None and config.volumes.attach_command is None
    assert config.volumes.hook_timeout_seconds == 120
    config = agent_config(
        pki, cassandra={"cdc_raw_directory": "/var/lib/cassandra/cdc_raw"}, **settings
    )
    assert NodeAgent(config).directories()["cdc_raw"] == [Path("/var/lib/cassandra/cdc_raw")]

    def load(volumes_table: dict[str, Any], **cassandra: Any) -> AgentConfig:
        data = config_data(pki, cassandra=cassandra, **settings)
        data["volumes"] = volumes_table
        return validate(data, AgentConfig, source="agent.toml")

    hooks = load({"detach_command": ["/sbin/lun-detach", "--all"], "attach_command": ["/x"]})
    assert hooks.volumes.detach_command == ["/sbin/lun-detach", "--all"]
    bad_tables: list[tuple[dict[str, Any], str]] = [
        ({"detach_command": []}, "volumes.detach_command"),
        ({"attach_command": "/sbin/lun-attach --now"}, "volumes.attach_command"),
        ({"hook_timeout_seconds": 0}, "volumes.hook_timeout_seconds"),
        ({"shell": True}, "volumes.shell"),
    ]
    for bad, key in bad_tables:
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            load(bad)
    with pytest.raises(ConfigError, match="cdc_raw_directory"):
        load({}, cdc_raw_directory="relative/cdc")


def test_restore_records_directory_in_the_config(pki: TestPki, tmp_path: Path) -> None:
    settings: dict[str, Any] = {
        "data_directories": [tmp_path / "data"],
        "commitlog_directory": tmp_path / "commitlog",
        "state_directory": tmp_path / "state",
    }
    data = config_data(pki, **settings)
    data.pop("volumes", None)
    default = validate(data, AgentConfig, source="agent.toml")
    assert default.volumes.state_directory == Path("/var/lib/ringsnap/agent")

    data["volumes"] = {"state_directory": str(tmp_path / "lib" / ".." / "records")}
    config = validate(data, AgentConfig, source="agent.toml")
    assert config.volumes.state_directory == tmp_path / "records"
    restorer = NodeAgent(config).restorer
    assert restorer.records.directory == tmp_path / "records" / "restores"
    assert restorer.records.fallbacks == (tmp_path / "state" / "restores",)

    data["volumes"] = {"state_directory": "var/lib/ringsnap"}
    with pytest.raises(ConfigError, match=r"volumes\.state_directory"):
        validate(data, AgentConfig, source="agent.toml")


def test_records_read_from_a_fallback_and_shadowed_by_the_main_directory(tmp_path: Path) -> None:
    old, new = tmp_path / "run" / "restores", tmp_path / "lib" / "restores"
    volume = {"mount_point": "/m", "device": "/dev/sdb", "major": 8, "minor": 16,
              "fs_type": "ext4", "fs_uuid": UUID_DATA, "options": [], "super_options": [],
              "kinds": ["data"], "cassandra_directories": ["/m/data"]}  # fmt: skip
    old.mkdir(parents=True)
    for name in ("op-old", "op-both"):
        (old / f"{name}.json").write_text(json.dumps({"volumes": [volume]}))
    records = RestoreRecords(new, fallbacks=(old, new))
    assert records.fallbacks == (old,)
    assert records.location("op-old") == old / "op-old.json"
    assert [v.device for v in records.load("op-old")] == ["/dev/sdb"]
    records.save("op-both", [])
    assert records.location("op-both") == new / "op-both.json"
    found, problems = records.all()
    assert found == {"op-both": [], "op-old": records.load("op-old")} and problems == []
    records.remove("op-both")
    assert records.load("op-both") != []  # the old record shows again: it was never moved
    assert (old / "op-both.json").exists()
