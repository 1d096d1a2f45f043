"""MountClones/UnmountClones (`ringsnap.agent.clones`): validation, the attach/detach hooks with
what they are told, XFS `nouuid` and read-only options, idempotence per purpose, the durable record
and the teardown a restarted agent does. The host (mounts, block devices) is faked; the hooks are
real scripts."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ringsnap.agent.clone_options import mount_options
from ringsnap.agent.clones import (
    ATTACHED,
    MOUNTED,
    CloneMounter,
    CloneVolume,
    check_purpose_id,
)
from ringsnap.agent.config import VolumesSection
from ringsnap.agent.errors import CommandFailed, Conflict, NotFound
from ringsnap.agent.mounts import Host
from ringsnap.errors import ValidationError
from ringsnap.mountinfo import Mount


@dataclass
class FakeHost(Host):
    """Mounts in a list, block devices in a dict; every action in `calls`."""

    mounts: list[Mount] = field(default_factory=list)
    devices: dict[str, tuple[int, int]] = field(default_factory=dict)
    calls: list[tuple[str, ...]] = field(default_factory=list)
    busy_mounts: set[str] = field(default_factory=set)

    def entries(self) -> list[Mount]:
        return list(self.mounts)

    def block_device_number(self, path: str) -> int | None:
        found = self.devices.get(path)
        return os.makedev(*found) if found else None

    def busy_reason(self, device: str) -> str:
        return ""

    async def mount(
        self, device: str, mount_point: str, fs_type: str, options: Sequence[str]
    ) -> None:
        self.calls.append(("mount", device, mount_point, fs_type, ",".join(options)))
        major, minor = self.devices[device]
        self.mounts.append(Mount(mount_point, major, minor, fs_type, device, "/", (), ()))

    async def umount(self, mount_point: str) -> None:
        self.calls.append(("umount", mount_point))
        if mount_point in self.busy_mounts:
            raise CommandFailed(f"umount: {mount_point}: target is busy")
        self.mounts = [m for m in self.mounts if m.mount_point != mount_point]


def _hook(path: Path, log: Path, prints: str) -> list[str]:
    """A hook script that appends its RINGSNAP_* environment to `log` as a JSON line."""
    path.write_text(
        "import json, os, sys\n"
        f"with open({str(log)!r}, 'a') as f:\n"
        "    env = {k: v for k, v in os.environ.items() if k.startswith('RINGSNAP_')}\n"
        "    f.write(json.dumps([sys.argv[1], env]) + '\\n')\n"
        f"print({prints})\n"
    )
    return [sys.executable, str(path)]


@dataclass
class Rig:
    mounter: CloneMounter
    host: FakeHost
    state: Path
    hook_log: Path

    def hook_calls(self) -> list[tuple[str, dict[str, str]]]:
        if not self.hook_log.exists():
            return []
        return [
            (action, env) for action, env in map(json.loads, self.hook_log.read_text().splitlines())
        ]


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    log = tmp_path / "hooks.jsonl"
    # The attach hook names a device per volume: /dev/clone-<volume>.
    attach = _hook(tmp_path / "attach.py", log, "'/dev/clone-' + os.environ['RINGSNAP_VOLUME']")
    detach = _hook(tmp_path / "detach.py", log, "''")
    settings = VolumesSection(
        attach_command=[*attach, "attach"], detach_command=[*detach, "detach"]
    )
    host = FakeHost(devices={"/dev/clone-c_data": (7, 1), "/dev/clone-c_log": (7, 2)})
    state = tmp_path / "state"
    mounter = CloneMounter(settings, state, host=host)
    mounter.fs_type = _xfs  # type: ignore[method-assign]
    return Rig(mounter, host, state, log)


async def _xfs(device: str) -> str:
    return "xfs"


VOLUMES = [
    CloneVolume("data", "array1", "c_data", "SER1", "600a0980", "/srv/node1/data"),
    CloneVolume("commitlog", "array1", "c_log", "", "", "/srv/node1/commitlog"),
]


def test_purpose_ids_and_fields_are_validated(rig: Rig) -> None:
    for bad in ("", "Drill", "-x", "a/b", "a" * 64, "a..b", "x y"):
        with pytest.raises(ValidationError):
            check_purpose_id(bad)
    check_purpose_id("drill-20261124-0a")
    bad_volumes = [
        CloneVolume("wal", "array1", "c", "", "", "/srv/x"),
        CloneVolume("data", "array1", "-rf", "", "", "/srv/x"),
        CloneVolume("data", "array1", "../etc", "", "", "/srv/x"),
        CloneVolume("data", "a;rm", "c", "", "", "/srv/x"),
        CloneVolume("data", "array1", "c", "$(x)", "", "/srv/x"),
        CloneVolume("data", "array1", "c", "", "", "relative/path"),
        CloneVolume("data", "array1", "c", "", "", "/srv/../etc"),
    ]
    for volume in bad_volumes:
        with pytest.raises(ValidationError):
            asyncio.run(rig.mounter.mount("drill-1", [volume], read_only=False))
    with pytest.raises(ValidationError, match="names no volume"):
        asyncio.run(rig.mounter.mount("drill-1", [], read_only=False))
    with pytest.raises(ValidationError, match="twice"):
        asyncio.run(rig.mounter.mount("drill-1", [VOLUMES[0], VOLUMES[0]], read_only=False))
    assert rig.host.calls == [] and rig.hook_calls() == []


def test_mount_options_for_clones() -> None:
    assert mount_options("xfs", False) == ("nouuid",)
    assert mount_options("xfs", True) == ("nouuid", "ro", "norecovery")
    assert mount_options("ext4", True) == ("ro", "noload")
    assert mount_options("ext4", False) == ()


def test_mount_attaches_with_the_hook_and_mounts_under_the_state_directory(rig: Rig) -> None:
    mounts = asyncio.run(rig.mounter.mount("drill-1", VOLUMES, read_only=False))
    base = rig.state / "clones" / "drill-1"
    assert [(m.volume, m.device, m.mount_point, m.source_mount_point) for m in mounts] == [
        ("c_data", "/dev/clone-c_data", str(base / "data"), "/srv/node1/data"),
        ("c_log", "/dev/clone-c_log", str(base / "commitlog"), "/srv/node1/commitlog"),
    ]
    assert rig.host.calls == [
        ("mount", "/dev/clone-c_data", str(base / "data"), "xfs", "nouuid"),
        ("mount", "/dev/clone-c_log", str(base / "commitlog"), "xfs", "nouuid"),
    ]
    (action, env), _ = rig.hook_calls()
    assert action == "attach"
    assert env["RINGSNAP_VOLUME"] == "c_data" and env["RINGSNAP_ARRAY"] == "array1"
    assert env["RINGSNAP_SERIAL"] == "SER1" and env["RINGSNAP_WWN"] == "600a0980"
    assert env["RINGSNAP_KINDS"] == "data" and env["RINGSNAP_OPERATION"] == "drill-1"
    record = rig.state / "clones" / "drill-1.json"
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    assert {c["state"] for c in json.loads(record.read_text())["clones"]} == {MOUNTED}
    assert [c.volume for c in rig.mounter.mounted("drill-1")] == ["c_data", "c_log"]


def test_mount_again_is_idempotent_and_other_volumes_are_refused(rig: Rig) -> None:
    first = asyncio.run(rig.mounter.mount("drill-1", VOLUMES, read_only=False))
    again = asyncio.run(rig.mounter.mount("drill-1", VOLUMES, read_only=False))
    assert first == again
    assert [c[0] for c in rig.host.calls] == ["mount", "mount"]  # not mounted twice
    with pytest.raises(Conflict, match="other clones"):
        asyncio.run(rig.mounter.mount("drill-1", VOLUMES[:1], read_only=False))
    with pytest.raises(Conflict, match="other clones"):
        asyncio.run(rig.mounter.mount("drill-1", VOLUMES, read_only=True))


def test_read_only_clones_skip_log_recovery(rig: Rig) -> None:
    asyncio.run(rig.mounter.mount("restore-7", VOLUMES[:1], read_only=True))
    assert rig.host.calls[0][-1] == "nouuid,ro,norecovery"


def test_unmount_unmounts_detaches_and_forgets_and_is_idempotent(rig: Rig) -> None:
    asyncio.run(rig.mounter.mount("drill-1", VOLUMES, read_only=False))
    assert asyncio.run(rig.mounter.unmount("drill-1")) == ["c_data", "c_log"]
    assert rig.host.mounts == []
    detaches = [env for action, env in rig.hook_calls() if action == "detach"]
    assert sorted(env["RINGSNAP_DEVICE"] for env in detaches) == [
        "/dev/clone-c_data",
        "/dev/clone-c_log",
    ]
    assert not (rig.state / "clones" / "drill-1.json").exists()
    assert not (rig.state / "clones" / "drill-1").exists()
    assert asyncio.run(rig.mounter.unmount("drill-1")) == []
    with pytest.raises(NotFound):
        rig.mounter.mounted("drill-1")


def test_a_busy_clone_stays_mounted_and_recorded(rig: Rig) -> None:
    mounts = asyncio.run(rig.mounter.mount("drill-1", VOLUMES, read_only=False))
    rig.host.busy_mounts.add(mounts[0].mount_point)
    with pytest.raises(Conflict, match="cannot be unmounted"):
        asyncio.run(rig.mounter.unmount("drill-1"))
    assert mounts[0].mount_point in {m.mount_point for m in rig.host.mounts}
    assert (rig.state / "clones" / "drill-1.json").exists()
    rig.host.busy_mounts.clear()
    assert asyncio.run(rig.mounter.unmount("drill-1")) == ["c_data", "c_log"]


def test_a_device_that_is_not_a_block_device_is_refused_and_recorded_for_teardown(
    rig: Rig,
) -> None:
    del rig.host.devices["/dev/clone-c_log"]
    with pytest.raises(CommandFailed, match="not a block device"):
        asyncio.run(rig.mounter.mount("drill-1", VOLUMES, read_only=False))
    # The data clone was mounted before the failure: the record says so, and unmount undoes it.
    record = json.loads((rig.state / "clones" / "drill-1.json").read_text())
    assert [c["state"] for c in record["clones"]] == [MOUNTED, "attaching"]
    assert asyncio.run(rig.mounter.unmount("drill-1")) == ["c_data", "c_log"]
    assert rig.host.mounts == []


def test_no_attach_hook_is_a_failed_precondition(tmp_path: Path) -> None:
    mounter = CloneMounter(VolumesSection(), tmp_path, host=FakeHost())
    with pytest.raises(Conflict, match=r"\[volumes\] attach_command"):
        asyncio.run(mounter.mount("drill-1", VOLUMES, read_only=False))


def test_a_restarted_agent_tears_down_the_clones_it_finds(rig: Rig) -> None:
    asyncio.run(rig.mounter.mount("drill-1", VOLUMES, read_only=False))
    asyncio.run(rig.mounter.mount("restore-2", [VOLUMES[0]], read_only=True))
    # A new process over the same state directory and host.
    restarted = CloneMounter(rig.mounter.settings, rig.state, host=rig.host)
    asyncio.run(restarted.recover())
    assert rig.host.mounts == []
    assert list((rig.state / "clones").glob("*.json")) == []


def test_an_attached_but_unmounted_clone_is_detached_after_a_restart(rig: Rig) -> None:
    rig.host.devices.pop("/dev/clone-c_data")

    with pytest.raises(CommandFailed):
        asyncio.run(rig.mounter.mount("drill-1", VOLUMES[:1], read_only=False))
    # Simulate a crash between attach and mount: the record says attached, with the device.
    record_path = rig.state / "clones" / "drill-1.json"
    record = json.loads(record_path.read_text())
    record["clones"][0].update(state=ATTACHED, device="/dev/clone-c_data")
    record_path.write_text(json.dumps(record))
    asyncio.run(CloneMounter(rig.mounter.settings, rig.state, host=rig.host).recover())
    detached = [env["RINGSNAP_DEVICE"] for action, env in rig.hook_calls() if action == "detach"]
    assert detached == ["/dev/clone-c_data"]
    assert not record_path.exists()
