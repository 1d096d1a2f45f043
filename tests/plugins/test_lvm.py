"""The LVM driver: the conformance properties, on the lvm2 emulator and live where LVM works.

The HTTP conformance suite does not fit a driver that runs commands instead of calling a REST API,
so the same properties are checked here against two backends:
- `emulated`: the lvm2 2.03.16 command emulator (`ringsnap.plugins.simulators.lvm2`), whose LVs are
  image files in a reflink XFS pool, loop-mounted as real ext4/XFS filesystems and frozen with
  fsfreeze while the driver snapshots them (the marker tests);
- `live`: real lvm2 on a loop-device volume group; runs only where device-mapper works.
Everything goes through the registry's entry point and the retry/timing/log middleware.
"""

from __future__ import annotations

import contextlib
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ringsnap.plugins.api import Cloneable, Revertible
from ringsnap.plugins.errors import (
    AlreadyExistsError,
    ArrayTimeoutError,
    DriverError,
    NotFoundError,
    QuotaExceededError,
)
from ringsnap.plugins.lvm.config import LvmSettings
from ringsnap.plugins.lvm.driver import LvmDriver
from ringsnap.plugins.lvm.runner import (
    CommandResult,
    CommandRunner,
    CommandTimeout,
    SubprocessRunner,
)
from ringsnap.plugins.middleware import FAST_RETRY, WrappedDriver, wrap
from ringsnap.plugins.registry import build_driver
from ringsnap.plugins.simulators.lunpool import temporary_xfs_pool
from ringsnap.plugins.simulators.lvm2 import Lvm2Emulator
from ringsnap.plugins.testing import mounts
from ringsnap.plugins.types import SnapshotRef, Volume

ARRAY = "node1-lvm"
VG = "rsvg"
THICK = "data"
THIN = "commitlog"
LV_SIZE = 64 << 20


@dataclass
class Backend:
    kind: str
    driver: WrappedDriver
    volumes: list[Volume]
    devices: dict[str, Path]
    emulator: Lvm2Emulator | None = None
    created: list[str] = field(default_factory=list)

    def device(self, volume: Volume) -> Path:
        """The block device (or emulator image) holding `volume`."""
        if volume.id in self.devices:
            return self.devices[volume.id]
        if self.emulator is not None:
            vg, _, lv = volume.id.partition("/")
            return self.emulator.device(vg, lv)
        return Path("/dev") / volume.id

    def lv_names(self) -> list[str]:
        if self.emulator is not None:
            return self.emulator.names(VG)
        return [v.name for v in self.driver.list_volumes()]

    def name(self, label: str = "snap") -> str:
        return f"rs-{label}-{uuid.uuid4().hex[:8]}"


def device_mapper_error() -> str | None:
    """Why device-mapper cannot be used here, or None when it can."""
    try:
        with open("/dev/mapper/control", "rb"):
            return None
    except OSError as exc:
        return f"/dev/mapper/control cannot be opened ({exc.strerror})"


@contextlib.contextmanager
def _emulated_vg(tmp_path: Path) -> Iterator[Lvm2Emulator]:
    """The emulator with the volume group `VG`, its LV images in a reflink pool (skipped where
    loop devices cannot be made)."""
    missing = mounts.missing_preconditions()
    if missing:
        pytest.skip("missing precondition: " + "; ".join(missing))
    with temporary_xfs_pool(tmp_path, size_bytes=1 << 30) as pool:
        emulator = Lvm2Emulator(pool.root / "lvm")
        emulator.add_vg(VG, 2 << 30)
        yield emulator


def _emulated(tmp_path: Path, filesystem: str = "ext4", size: int = LV_SIZE) -> Iterator[Backend]:
    with _emulated_vg(tmp_path) as emulator:
        thick = emulator.add_linear(VG, THICK, size)
        emulator.add_thin_pool(VG, "pool", 256 << 20)
        thin = emulator.add_thin(VG, THIN, size, "pool")
        for image in (thick, thin):
            assert image is not None
            mounts.format_image(image, filesystem)
        driver = LvmDriver(ARRAY, LvmSettings(volume_groups=[VG]), runner=emulator)
        managed = wrap(driver, retry=FAST_RETRY)
        assert managed.revertible and managed.cloneable
        volumes = sorted(managed.list_volumes(), key=lambda v: v.id)
        yield Backend("emulated", managed, volumes, {}, emulator)


def _live(tmp_path: Path) -> Iterator[Backend]:
    reason = device_mapper_error()
    if reason is not None:
        pytest.skip(
            "precondition: a kernel with device-mapper, so that /dev/mapper/control can be opened"
            f" (here: {reason}); the lvm2 2.03.16 contract tests cover this host"
        )
    missing = mounts.missing_preconditions()
    if missing:
        pytest.skip("missing precondition: " + "; ".join(missing))
    image = tmp_path / "pv.img"
    with open(image, "wb") as handle:
        handle.truncate(1 << 30)
    loop = subprocess.run(
        ["losetup", "-f", "--show", str(image)], capture_output=True, text=True, check=True
    ).stdout.strip()
    vg = f"rsconf{uuid.uuid4().hex[:6]}"
    confine = f'devices{{filter=["a|^{loop}$|","r|.*|"] global_filter=["a|^{loop}$|","r|.*|"]}}'
    try:
        for command in (
            ["pvcreate", "--config", confine, loop],
            ["vgcreate", "--config", confine, vg, loop],
            ["lvcreate", "--config", confine, "-y", "-L", "64m", "-n", THICK, vg],
            [
                "lvcreate",
                "--config",
                confine,
                "-y",
                "--type",
                "thin-pool",
                "-L",
                "256m",
                "-n",
                "pool",
                vg,
            ],
            [
                "lvcreate",
                "--config",
                confine,
                "-y",
                "-V",
                "64m",
                "--thinpool",
                f"{vg}/pool",
                "-n",
                THIN,
            ],
        ):
            subprocess.run(command, capture_output=True, text=True, check=True)
        for lv in (THICK, THIN):
            mounts.format_image(Path("/dev") / vg / lv)
        driver = LvmDriver(
            ARRAY, LvmSettings(volume_groups=[vg], lvm_config=confine), SubprocessRunner()
        )
        managed = wrap(driver, retry=FAST_RETRY)
        assert managed.revertible and managed.cloneable
        volumes = sorted(managed.list_volumes(), key=lambda v: v.id)
        yield Backend("live", managed, volumes, {})
    finally:
        subprocess.run(
            ["vgremove", "--config", confine, "-f", vg], capture_output=True, check=False
        )
        subprocess.run(["losetup", "-d", loop], capture_output=True, check=False)


@pytest.fixture(params=["emulated", "live"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "emulated":
        yield from _emulated(tmp_path)
    else:
        yield from _live(tmp_path)


@pytest.fixture
def emulated(tmp_path: Path) -> Iterator[Backend]:
    yield from _emulated(tmp_path)


def _emulator(backend: Backend) -> Lvm2Emulator:
    assert backend.emulator is not None
    return backend.emulator


# The conformance properties


def test_capabilities_match_interfaces(backend: Backend) -> None:
    raw = backend.driver.driver
    capabilities = raw.capabilities()
    assert capabilities.atomic_group_snapshot is False
    assert isinstance(raw, Revertible) == capabilities.revert is True
    assert isinstance(raw, Cloneable) == capabilities.clone is True
    assert backend.driver.revertible and backend.driver.cloneable
    assert capabilities.extra["xfs_clone_mount_options"] == "nouuid"


def test_registered_under_its_entry_point() -> None:
    driver = build_driver(ARRAY, {"driver": "lvm", "volume_groups": [VG]}, source="t.toml")
    assert isinstance(driver, LvmDriver) and driver.array == ARRAY


def test_check_and_list_volumes(backend: Backend) -> None:
    backend.driver.check()
    assert [v.name.split("/")[1] for v in backend.volumes] == [THIN, THICK]
    assert all(v.size_bytes == LV_SIZE for v in backend.volumes)


def test_group_snapshot_covers_every_volume(backend: Backend) -> None:
    name = backend.name()
    ref = backend.driver.create_group_snapshot(backend.volumes, name)
    assert sorted(m.volume.id for m in ref.members) == sorted(v.id for v in backend.volumes)
    assert (ref.array, ref.driver, ref.snapshot_name) == (ARRAY, "lvm", name)
    assert ref.attribute("kind") == "thick+thin"
    listed = [
        i.ref for i in backend.driver.list_snapshots(backend.volumes) if i.ref.snapshot_name == name
    ]
    assert listed == [ref]
    assert backend.driver.get_snapshot(ref).ref == ref


def test_create_is_idempotent(backend: Backend) -> None:
    name = backend.name()
    first = backend.driver.create_group_snapshot(backend.volumes, name)
    before = backend.lv_names()
    second = backend.driver.create_group_snapshot(backend.volumes, name)
    assert second == first
    assert backend.lv_names() == before


def test_missing_snapshot_is_not_found(backend: Backend) -> None:
    ref = backend.driver.create_group_snapshot(backend.volumes, backend.name())
    backend.driver.delete_snapshot(ref)
    with pytest.raises(NotFoundError) as caught:
        backend.driver.get_snapshot(ref)
    assert not caught.value.retryable and ARRAY in str(caught.value)


def test_delete_is_idempotent(backend: Backend) -> None:
    before = backend.lv_names()
    ref = backend.driver.create_group_snapshot(backend.volumes, backend.name())
    backend.driver.delete_snapshot(ref)
    backend.driver.delete_snapshot(ref)
    assert backend.lv_names() == before
    assert ref.snapshot_name not in {
        i.ref.snapshot_name for i in backend.driver.list_snapshots(backend.volumes)
    }


def _mount_all(
    backend: Backend, root: Path, volumes: Sequence[Volume], options: str = ""
) -> list[Path]:
    points = []
    for volume in volumes:
        point = root / volume.id.replace("/", "_")
        mounts.mount_image(backend.device(volume), point, options=options)
        points.append(point)
    return points


def _unmount_all(points: Sequence[Path]) -> None:
    for point in points:
        mounts.unmount(point)


def _marked_snapshot(
    backend: Backend, points: Sequence[Path], marker_prefix: str, name: str
) -> tuple[SnapshotRef, list[dict[str, bytes]]]:
    """A `before` marker written on each mounted volume, a group snapshot of them taken frozen,
    then an `after` marker written on each: the snapshot and each volume's markers in it."""
    expected = []
    for index, point in enumerate(points):
        mounts.write_marker(point, "before", f"{marker_prefix}{index}".encode())
        expected.append(mounts.read_markers(point))
    with mounts.frozen(points):
        ref = backend.driver.create_group_snapshot(backend.volumes, backend.name(name))
    for point in points:
        mounts.write_marker(point, "after", b"after")
    return ref, expected


def test_marker_revert(backend: Backend, tmp_path: Path) -> None:
    points = _mount_all(backend, tmp_path / "live", backend.volumes)
    try:
        ref, expected = _marked_snapshot(backend, points, "before-", "mk")
        for point in points:
            mounts.write_marker(point, "before", b"overwritten after the snapshot")
        with pytest.raises(DriverError, match="is open"):
            backend.driver.revert(ref)  # mounted origins are refused, nothing merged
    finally:
        _unmount_all(points)
    assert any("consumes it" in line for line in backend.driver.revert_plan(ref))
    backend.driver.revert(ref)
    points = _mount_all(backend, tmp_path / "reverted", backend.volumes)
    try:
        assert [mounts.read_markers(point) for point in points] == expected
    finally:
        _unmount_all(points)
    # The merge consumed the snapshot.
    with pytest.raises(NotFoundError):
        backend.driver.get_snapshot(ref)
    assert sorted(v.id for v in backend.driver.list_volumes()) == sorted(
        v.id for v in backend.volumes
    )


def test_marker_clone(backend: Backend, tmp_path: Path) -> None:
    points = _mount_all(backend, tmp_path / "live", backend.volumes)
    try:
        ref, expected = _marked_snapshot(backend, points, "clone-", "mkc")
        clones = backend.driver.clone(ref, "drill")
        assert [c.id for c in backend.driver.clone(ref, "drill")] == [c.id for c in clones]
        by_source = {m.volume.id: c for m, c in zip(ref.members, clones, strict=True)}
        for index, volume in enumerate(backend.volumes):
            clone = by_source[volume.id]
            assert clone.id == f"{volume.id}-drill"
            with mounts.mounted(
                backend.device(clone), tmp_path / "clone" / clone.name.replace("/", "_")
            ) as point:
                assert mounts.read_markers(point) == expected[index]
        for point in points:
            assert "after" in mounts.read_markers(point)
    finally:
        _unmount_all(points)
    for clone in clones:
        backend.driver.delete_clone(clone)
        backend.driver.delete_clone(clone)
    assert not any(name.endswith("-drill") for name in backend.lv_names())


# LVM specifics (emulated: they need states or failures a healthy host does not produce)


def test_xfs_clone_mounts_beside_its_origin_with_nouuid(tmp_path: Path) -> None:
    # mkfs.xfs wants at least 300 MB.
    for backend in _emulated(tmp_path, filesystem="xfs", size=320 << 20):
        thick = [v for v in backend.volumes if v.id.endswith(THICK)]
        points = _mount_all(backend, tmp_path / "live", thick)
        try:
            with mounts.frozen(points):
                ref = backend.driver.create_group_snapshot(thick, backend.name())
            (clone,) = backend.driver.clone(ref, "x")
            with pytest.raises(mounts.MountError):
                mounts.mount_image(backend.device(clone), tmp_path / "clone-plain")
            option = backend.driver.capabilities().extra["xfs_clone_mount_options"]
            with mounts.mounted(backend.device(clone), tmp_path / "clone", options=option):
                pass
        finally:
            _unmount_all(points)


def test_invalid_thick_snapshot_is_reported_and_refused(emulated: Backend) -> None:
    ref = emulated.driver.create_group_snapshot(emulated.volumes, emulated.name())
    thick_member = next(m for m in ref.members if m.volume.id.endswith(THICK))
    _emulator(emulated).fill_snapshot(VG, thick_member.snapshot_name, 100)
    info = emulated.driver.get_snapshot(ref)
    assert any(
        "invalid" in warning and thick_member.snapshot_id in warning for warning in info.warnings
    )
    listed = [i for i in emulated.driver.list_snapshots(emulated.volumes) if i.ref == ref]
    assert listed[0].warnings == info.warnings
    with pytest.raises(DriverError, match="is invalid"):
        emulated.driver.revert(ref)
    with pytest.raises(DriverError, match="is invalid"):
        emulated.driver.clone(ref, "x")
    assert not [c for c in _emulator(emulated).calls if c[0] in ("lvconvert", "dd")]


def test_filling_snapshot_and_thin_pool_warn(emulated: Backend) -> None:
    ref = emulated.driver.create_group_snapshot(emulated.volumes, emulated.name())
    thick_member = next(m for m in ref.members if m.volume.id.endswith(THICK))
    _emulator(emulated).fill_snapshot(VG, thick_member.snapshot_name, 85)
    _emulator(emulated).set_data_percent(VG, "pool", 92.5)
    warnings = emulated.driver.get_snapshot(ref).warnings
    assert any("85.00% used" in w for w in warnings)
    assert any(f"thin pool {VG}/pool is 92.50% full" in w for w in warnings)


def test_snapshot_commands_follow_the_lvm2_contract(emulated: Backend) -> None:
    emulator = _emulator(emulated)
    emulator.calls.clear()
    emulated.driver.create_group_snapshot(emulated.volumes, "s1")
    creates = [c for c in emulator.calls if c[0] == "lvcreate"]
    assert creates == [
        (
            "lvcreate",
            "-s",
            "-ky",
            "-n",
            "commitlog.rs.s1",
            "--addtag",
            "ringsnap.snapshot=s1",
            f"{VG}/{THIN}",
        ),
        (
            "lvcreate",
            "-s",
            "-L",
            f"{LV_SIZE // 4}b",
            "-n",
            "data.rs.s1",
            "--addtag",
            "ringsnap.snapshot=s1",
            f"{VG}/{THICK}",
        ),
    ]


def test_failed_member_removes_the_ones_made(emulated: Backend) -> None:
    emulator = _emulator(emulated)
    before = emulator.names(VG)
    emulator.fail_next(
        "data.rs.",
        returncode=5,
        stderr=f'  Volume group "{VG}" has insufficient free space (3 extents): 4 required.\n',
    )
    with pytest.raises(QuotaExceededError, match="insufficient free space") as caught:
        emulated.driver.create_group_snapshot(emulated.volumes, "s2")
    assert not caught.value.left_on_array and ARRAY in str(caught.value)
    assert emulator.names(VG) == before


def test_cleanup_failure_is_reported_as_leftover(emulated: Backend) -> None:
    emulator = _emulator(emulated)
    emulator.fail_next("lvcreate -s -L", returncode=5, stderr="  Internal error: boom.\n")
    emulator.fail_next(
        "lvremove -y rsvg/commitlog.rs.s3", returncode=5, stderr="  Can't remove: busy.\n"
    )
    with pytest.raises(DriverError) as caught:
        emulated.driver.create_group_snapshot(emulated.volumes, "s3")
    assert caught.value.left_on_array and "rsvg/commitlog.rs.s3" in caught.value.left_on_array[0]


def test_incomplete_set_from_an_earlier_attempt_is_taken_again(emulated: Backend) -> None:
    emulator = _emulator(emulated)
    thin_only = [v for v in emulated.volumes if v.id.endswith(THIN)]
    emulated.driver.create_group_snapshot(thin_only, "s4")
    old = emulator.names(VG)
    ref = emulated.driver.create_group_snapshot(emulated.volumes, "s4")
    assert len(ref.members) == 2
    assert ("lvremove", "-y", f"{VG}/commitlog.rs.s4") in emulator.calls
    assert set(emulator.names(VG)) == set(old) | {"data.rs.s4"}


def test_same_name_for_other_volumes_is_already_exists(emulated: Backend) -> None:
    thin_only = [v for v in emulated.volumes if v.id.endswith(THIN)]
    thick_only = [v for v in emulated.volumes if v.id.endswith(THICK)]
    emulated.driver.create_group_snapshot(thin_only, "s5")
    with pytest.raises(AlreadyExistsError, match="other volumes"):
        emulated.driver.create_group_snapshot(thick_only, "s5")


def test_busy_lvm_is_retried_by_the_middleware(emulated: Backend) -> None:
    _emulator(emulated).fail_next("lvcreate", returncode=5, stderr="  Can't get lock for rsvg.\n")
    ref = emulated.driver.create_group_snapshot(emulated.volumes, "s6")
    assert len(ref.members) == 2


def test_delayed_merge_is_reported_not_hidden(emulated: Backend) -> None:
    ref = emulated.driver.create_group_snapshot(emulated.volumes, "s7")
    emulator = _emulator(emulated)
    thick_member = next(m for m in ref.members if m.volume.id.endswith(THICK))
    # Something opened the origin between the driver's check and the merge.
    emulator.fail_next(
        f"lvconvert --merge -y {thick_member.snapshot_id}",
        returncode=0,
        stdout=(
            "  Delaying merge since origin is open.\n"
            f"  Merging of snapshot {thick_member.snapshot_id} will occur on next activation of"
            f" {VG}/{THICK}.\n"
        ),
    )
    with pytest.raises(DriverError, match="not complete") as caught:
        emulated.driver.revert(ref)
    assert any("next activation" in item for item in caught.value.left_on_array)


def test_thin_merge_leaves_a_plain_volume(emulated: Backend) -> None:
    thin_only = [v for v in emulated.volumes if v.id.endswith(THIN)]
    ref = emulated.driver.create_group_snapshot(thin_only, "s8")
    emulated.driver.revert(ref)
    assert _emulator(emulated).tags(VG, THIN) == []
    (volume,) = [v for v in emulated.driver.list_volumes() if v.id.endswith(THIN)]
    assert volume.size_bytes == LV_SIZE


def test_clones_come_back_in_the_order_of_the_members(tmp_path: Path) -> None:
    """`lvs` lists `cassandra-commitlog.rs.*` before `cassandra.rs.*` ('-' sorts before '.'); the
    restore pairs clones with members by position, so the driver must keep the members' order."""
    with _emulated_vg(tmp_path) as emulator:
        for name in ("cassandra", "cassandra-commitlog"):
            emulator.add_linear(VG, name, LV_SIZE)
        driver = wrap(LvmDriver(ARRAY, LvmSettings(volume_groups=[VG]), runner=emulator))
        volumes = sorted(driver.list_volumes(), key=lambda v: v.id)
        assert [v.id for v in volumes] == [f"{VG}/cassandra", f"{VG}/cassandra-commitlog"]
        ref = driver.create_group_snapshot(volumes, "order")
        clones = driver.clone(ref, "c1")
        assert [c.id for c in clones] == [f"{VG}/cassandra-c1", f"{VG}/cassandra-commitlog-c1"]


def test_delete_clone_refuses_volumes_it_did_not_make(emulated: Backend) -> None:
    with pytest.raises(DriverError, match="not a clone made by ringsnap"):
        emulated.driver.delete_clone(emulated.volumes[0])


class _Slow:
    def __init__(self, inner: CommandRunner) -> None:
        self.inner = inner

    def run(self, argv: Sequence[str], *, timeout: float) -> CommandResult:
        if argv[0] == "lvcreate":
            raise CommandTimeout(f"{argv[0]} did not finish within {timeout:g} s")
        return self.inner.run(argv, timeout=timeout)


def test_command_timeout_is_array_timeout(emulated: Backend) -> None:
    driver = LvmDriver(
        ARRAY,
        LvmSettings(volume_groups=[VG], command_timeout_seconds=1),
        _Slow(_emulator(emulated)),
    )
    with pytest.raises(ArrayTimeoutError, match="did not finish within 1 s") as caught:
        driver.create_group_snapshot(emulated.volumes, "s9")
    assert caught.value.retryable


def test_snapshot_ref_round_trips_through_get(emulated: Backend) -> None:
    ref = emulated.driver.create_group_snapshot(emulated.volumes, "s10")
    stored: dict[str, Any] = {"name": ref.snapshot_name, "members": [m.volume for m in ref.members]}
    again = SnapshotRef(
        array=ARRAY,
        driver="lvm",
        group=ref.group,
        snapshot_id=stored["name"],
        snapshot_name=stored["name"],
        created_at=ref.created_at,
        members=ref.members,
    )
    assert emulated.driver.get_snapshot(again).ref == ref
