"""The LVM driver against the lvm2 2.03.16 command-line contract.

Three sources of truth, strongest first:
- the real lvm2 binary on a loop device holding `rsvg.vgmeta` (reports work without device-mapper);
- outputs captured from it (`fixtures/lvm2-2.03.16/captured.json`, made by `capture.py`);
- the command emulator, whose report must equal the captured one byte for byte
  (tests/plugins/simulators/test_lvm2_emulator.py).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from ringsnap.errors import ConfigError
from ringsnap.plugins.errors import (
    AlreadyExistsError,
    ConfigurationError,
    DriverError,
    NotFoundError,
    UnsupportedError,
)
from ringsnap.plugins.lvm.client import Lvm2
from ringsnap.plugins.lvm.config import LvmSettings
from ringsnap.plugins.lvm.driver import LvmDriver
from ringsnap.plugins.lvm.report import LV_FIELDS, parse_lvs
from ringsnap.plugins.lvm.runner import SubprocessRunner
from ringsnap.plugins.simulators.lvm2 import Lvm2Emulator
from ringsnap.plugins.types import Volume
from tests.plugins.lvm2_captures import CAPTURED, FIXTURES, Replay


def lvm2_host(runner: Any, **settings: Any) -> LvmDriver:
    return LvmDriver("host1", LvmSettings(volume_groups=["rsvg"], **settings), runner=runner)


# The captures themselves


def test_captures_come_from_lvm2_2_03_16() -> None:
    assert CAPTURED["version"]["stdout"].startswith("  LVM version:     2.03.16(2) (2022-05-18)\n")


def test_every_report_value_is_a_string() -> None:
    document = json.loads(CAPTURED["lvs_report"]["stdout"])
    rows = document["report"][0]["lv"]
    assert rows and all(isinstance(value, str) for row in rows for value in row.values())
    assert list(rows[0]) == list(LV_FIELDS)


def test_parse_captured_report() -> None:
    volumes = {lv.name: lv for lv in parse_lvs(CAPTURED["lvs_report"]["stdout"])}
    assert "commitlog.rs.s1" not in volumes  # a merging thick snapshot is hidden without -a
    data = volumes["data"]
    assert (data.kind, data.size_bytes, data.origin) == ("o", 64 << 20, "")
    assert data.created_at == datetime(2026, 11, 21, 22, 54, 35, tzinfo=UTC)
    assert volumes["commitlog"].kind == "O" and volumes["commitlog"].merging
    thick = volumes["data.rs.s1"]
    assert thick.is_thick_snapshot and thick.origin == "data" and thick.size_bytes == 16 << 20
    assert thick.tag_value("ringsnap.snapshot") == "s1"
    assert thick.state_unknown and thick.snapshot_invalid is None and not thick.invalid
    thin = volumes["thindata.rs.s1"]
    assert thin.is_thin_volume and thin.is_snapshot and thin.activation_skipped
    assert thin.pool == "pool" and not volumes["thindata"].is_snapshot
    assert volumes["pool"].is_thin_pool and not volumes["pool"].is_plain_volume
    hidden = {lv.name for lv in parse_lvs(CAPTURED["lvs_report_all"]["stdout"]) if lv.hidden}
    assert hidden == {"[commitlog.rs.s1]", "[lvol0_pmspare]", "[pool_tdata]", "[pool_tmeta]"}


# The driver on captured outputs


def test_driver_lists_captured_snapshots() -> None:
    driver = lvm2_host(Replay("lvs_report"))
    infos = driver.list_snapshots(
        [Volume("rsvg/data", "rsvg/data"), Volume("rsvg/thindata", "rsvg/thindata")]
    )
    by_name = {info.ref.snapshot_name: info for info in infos}
    # s1's commitlog member is merging (hidden); s0 and s1 both cover data and thindata.
    assert sorted(by_name) == ["s0", "s1"]
    s0 = by_name["s0"].ref
    assert [member.snapshot_id for member in s0.members] == [
        "rsvg/data.rs.s0",
        "rsvg/thindata.rs.s0",
    ]
    assert s0.created_at == datetime(2026, 11, 21, 23, 0, tzinfo=UTC)
    assert s0.attribute("kind") == "thick+thin"


def test_missing_volume_group_is_a_not_found_error() -> None:
    replay = Replay("lvs_missing_vg")
    client = Lvm2("host1", replay, timeout=5)
    with pytest.raises(NotFoundError, match='Volume group "novg" not found'):
        client.logical_volumes(["novg"])


def test_missing_device_mapper_is_unsupported_with_the_reason() -> None:
    client = Lvm2("host1", Replay("lvcreate_thick_no_dm"), timeout=5)
    with pytest.raises(UnsupportedError, match="device-mapper is not available in this kernel"):
        client.create_thick_snapshot(
            "rsvg", "data", "data.rs.s2", 16 << 20, ["ringsnap.snapshot=s2"]
        )


def test_existing_name_is_already_exists() -> None:
    client = Lvm2("host1", Replay("lvcreate_exists"), timeout=5)
    with pytest.raises(AlreadyExistsError, match="already exists"):
        client.create_thin_snapshot(
            "rsvg", "thindata", "thindata.rs.s1", ["ringsnap.snapshot=s1"], skip_activation=True
        )


def test_removing_a_missing_lv_is_not_an_error() -> None:
    assert Lvm2("host1", Replay("lvremove_missing"), timeout=5).remove("rsvg", "nope") is False


def test_merge_without_kernel_support_is_unsupported() -> None:
    client = Lvm2("host1", Replay("lvconvert_merge_no_dm"), timeout=5)
    with pytest.raises(UnsupportedError, match="Missing support in kernel"):
        client.merge("rsvg", "data.rs.s1", timeout=5)


# The real lvm2 binary


@pytest.fixture(scope="module")
def loop_vg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`rsvg.vgmeta` restored onto a loop device; yields an lvm.conf filter that sees only it."""
    if shutil.which("lvs") is None:
        pytest.skip("lvm2 is not installed (apt install lvm2)")
    if shutil.which("losetup") is None or not Path("/dev/loop-control").exists():
        pytest.skip("no loop devices on this host (/dev/loop-control missing)")
    scratch = tmp_path_factory.mktemp("lvm-real")
    image = scratch / "pv.img"
    with open(image, "wb") as handle:
        handle.truncate(256 << 20)
    attached = subprocess.run(
        ["losetup", "-f", "--show", str(image)], capture_output=True, text=True, check=False
    )
    if attached.returncode != 0:
        pytest.skip(f"cannot attach a loop device: {attached.stderr.strip()}")
    loop = attached.stdout.strip()
    confine = f'devices{{filter=["a|^{loop}$|","r|.*|"] global_filter=["a|^{loop}$|","r|.*|"]}}'
    metadata = scratch / "rsvg.vgmeta"
    metadata.write_text((FIXTURES / "rsvg.vgmeta").read_text().replace("/dev/loop0", loop))
    env = {"LVM_SUPPRESS_FD_WARNINGS": "1", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    try:
        for step in (
            [
                "pvcreate",
                "--config",
                confine,
                "--uuid",
                "YWWjQ0-n0z4-fYjR-PebH-IM4i-4w9A-RNe58y",
                "--norestorefile",
                loop,
            ],
            [
                "vgcfgrestore",
                "--config",
                confine + " global{activation=0}",
                "--force",
                "-f",
                str(metadata),
                "rsvg",
            ],
        ):
            done = subprocess.run(step, capture_output=True, text=True, env=env, check=False)
            assert done.returncode == 0, done.stderr
        yield confine
    finally:
        subprocess.run(
            ["vgremove", "--config", confine + " global{activation=0}", "-f", "rsvg"],
            capture_output=True,
            env=env,
            check=False,
        )
        subprocess.run(["losetup", "-d", loop], capture_output=True, check=False)


def test_real_lvm2_report_is_parsed_by_the_driver(loop_vg: str) -> None:
    driver = lvm2_host(SubprocessRunner(), lvm_config=loop_vg)
    volumes = {volume.id for volume in driver.list_volumes()}
    assert volumes == {"rsvg/data", "rsvg/commitlog", "rsvg/thindata"}
    infos = driver.list_snapshots([Volume("rsvg/data", "rsvg/data")])
    assert [info.ref.snapshot_name for info in infos] == ["s0", "s1"]


def test_real_lvm2_check_names_missing_device_mapper(loop_vg: str) -> None:
    if Path("/dev/mapper/control").exists() and _device_mapper_works():
        pytest.skip("device-mapper works on this host; the live test covers it")
    with pytest.raises(UnsupportedError, match="device-mapper is not available"):
        lvm2_host(SubprocessRunner(), lvm_config=loop_vg).check()


def test_real_lvm2_unknown_volume_group_is_a_config_error(loop_vg: str) -> None:
    driver = LvmDriver("host1", LvmSettings(volume_groups=["rsvg", "novg"], lvm_config=loop_vg))
    with pytest.raises(ConfigurationError, match="check volume_groups"):
        driver.check()


def test_real_lvm2_snapshot_without_device_mapper_is_a_typed_error(loop_vg: str) -> None:
    if _device_mapper_works():
        pytest.skip("device-mapper works on this host; snapshots succeed there")
    driver = lvm2_host(SubprocessRunner(), lvm_config=loop_vg)
    with pytest.raises(UnsupportedError, match="device-mapper"):
        driver.create_group_snapshot([Volume("rsvg/thindata", "rsvg/thindata")], "s9")
    names = {
        lv.name
        for lv in Lvm2("h", SubprocessRunner(), timeout=30, lvm_config=loop_vg).logical_volumes(
            ["rsvg"]
        )
    }
    assert "thindata.rs.s9" not in names


def test_bad_names_never_reach_lvm2() -> None:
    emulator = Lvm2Emulator()
    emulator.add_vg("vg0", 1 << 30)
    emulator.add_linear("vg0", "data", 64 << 20)
    driver = LvmDriver("host1", LvmSettings(volume_groups=["vg0"]), runner=emulator)
    for bad in (
        "vg0/../etc",
        "vg0/da;ta",
        "vg0/$(reboot)",
        "vg0/-rf",
        "../vg0/data",
        "vg0/snapshot1",
        "vg0/a_tdata",
    ):
        with pytest.raises(DriverError):
            driver.create_group_snapshot([Volume(bad, bad)], "s1")
    for bad_name in ("../x", "a b", "-x", "x;y", ""):
        with pytest.raises(DriverError):
            driver.create_group_snapshot([Volume("vg0/data", "vg0/data")], bad_name)
    with pytest.raises(DriverError, match="not in this array's volume_groups"):
        driver.create_group_snapshot([Volume("other/data", "other/data")], "s1")
    assert not [call for call in emulator.calls if call[0] != "lvs"]


def test_bad_settings_are_refused() -> None:
    cases: list[dict[str, Any]] = [
        {"volume_groups": ["vg/../x"]},
        {"volume_groups": []},
        {"volume_groups": ["vg0"], "lvm_config": "a\nb"},
        {"volume_groups": ["vg0"], "thick_snapshot_percent": 0},
    ]
    for settings in cases:
        with pytest.raises(ConfigError):
            LvmDriver.from_config("host1", settings, source="test.toml")


def _device_mapper_works() -> bool:
    try:
        with open("/dev/mapper/control", "rb"):
            return True
    except OSError:
        return False
