"""The sandbox's [volumes] detach/attach hooks: what they refuse, and (root) a real loop device."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from ringsnap.plugins.simulators import fabric
from ringsnap.sandbox import hooks
from ringsnap.sandbox.hooks import HookRefused

MODULE = "ringsnap.sandbox.hooks"


class FakeLosetup:
    def __init__(self, answer: str = "") -> None:
        self.calls: list[list[str]] = []
        self.answer = answer

    def __call__(self, argv: Sequence[str]) -> str:
        self.calls.append(list(argv))
        return self.answer


@pytest.fixture
def pool(tmp_path: Path) -> Path:
    root = tmp_path / "pool"
    (root / "luns").mkdir(parents=True)
    (root / "luns" / "play-node1-data.img").write_bytes(b"\0" * 4096)
    # The array shows the volume to hosts (`fabric`): the hook attaches nothing else.
    fabric.present(root, root / "luns" / "play-node1-data.img", "600a0980" + "ab" * 12)
    return root


def _sys_block(tmp_path: Path, backing: dict[str, str]) -> Path:
    sys_block = tmp_path / "sys-block"
    for loop, path in backing.items():
        (sys_block / loop / "loop").mkdir(parents=True)
        (sys_block / loop / "loop" / "backing_file").write_text(path + "\n")
    (sys_block / "loop9").mkdir(parents=True, exist_ok=True)  # a free loop device: no loop/ dir
    return sys_block


def _mountinfo(tmp_path: Path, *sources: str) -> Path:
    path = tmp_path / "mountinfo"
    lines = [
        f"{30 + i} 1 7:{i} / /mnt/x{i} rw,relatime shared:1 - ext4 {source} rw"
        for i, source in enumerate(sources)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


# -- detach ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "device", ["/dev/sda", "/dev/loop", "/dev/loop1/../sda", "loop1", "/dev/mapper/x", "/dev/loopx"]
)
def test_detach_refuses_anything_but_a_loop_device(device: str) -> None:
    with pytest.raises(HookRefused, match="not a loop device"):
        hooks.loop_name(device)


def test_loop_name() -> None:
    assert hooks.loop_name("/dev/loop12") == "loop12"


def test_detach_needs_the_device_variable(pool: Path) -> None:
    with pytest.raises(HookRefused, match=r"\$RINGSNAP_DEVICE is not set"):
        hooks.detach(pool, {}, losetup=FakeLosetup())


def test_detach_releases_a_lun_of_the_pool(pool: Path, tmp_path: Path) -> None:
    image = os.path.realpath(pool) + "/luns/play-node1-data.img"
    losetup = FakeLosetup()
    done = hooks.detach(
        pool,
        {"RINGSNAP_DEVICE": "/dev/loop3"},
        losetup=losetup,
        sys_block=_sys_block(tmp_path, {"loop3": image}),
        mountinfo=_mountinfo(tmp_path, "/dev/loop4"),
    )
    assert losetup.calls == [["--detach", "/dev/loop3"]]
    assert "play-node1-data" in done


def test_detach_of_a_device_no_longer_attached_is_done(pool: Path, tmp_path: Path) -> None:
    losetup = FakeLosetup()
    done = hooks.detach(
        pool,
        {"RINGSNAP_DEVICE": "/dev/loop9"},
        losetup=losetup,
        sys_block=_sys_block(tmp_path, {}),
        mountinfo=_mountinfo(tmp_path),
    )
    assert losetup.calls == []
    assert "nothing to detach" in done


@pytest.mark.parametrize(
    "backing",
    [
        "/var/lib/other/luns/play-node1-data.img",  # another pool
        "{pool}/play-node1-data.img",  # the pool, not its luns/
        "{pool}/snapshots/play-node1-data/s1.img",  # a snapshot image
        "{pool}/luns/sub/x.img",  # deeper
        "{pool}/luns/play-node1-data.raw",  # not an image
        "{pool}/luns/-x.img",  # a name the pool never makes
        "/pool.img",
    ],
)
def test_detach_refuses_a_device_backed_by_anything_else(
    pool: Path, tmp_path: Path, backing: str
) -> None:
    losetup = FakeLosetup()
    with pytest.raises(HookRefused, match="refusing to detach /dev/loop3: its backing file"):
        hooks.detach(
            pool,
            {"RINGSNAP_DEVICE": "/dev/loop3"},
            losetup=losetup,
            sys_block=_sys_block(tmp_path, {"loop3": backing.format(pool=os.path.realpath(pool))}),
            mountinfo=_mountinfo(tmp_path),
        )
    assert losetup.calls == []


def test_detach_refuses_a_mounted_device(pool: Path, tmp_path: Path) -> None:
    image = os.path.realpath(pool) + "/luns/play-node1-data.img"
    losetup = FakeLosetup()
    with pytest.raises(HookRefused, match="still mounted"):
        hooks.detach(
            pool,
            {"RINGSNAP_DEVICE": "/dev/loop3"},
            losetup=losetup,
            sys_block=_sys_block(tmp_path, {"loop3": image}),
            mountinfo=_mountinfo(tmp_path, "/dev/loop3"),
        )
    assert losetup.calls == []


def test_detach_accepts_a_deleted_lun_image(pool: Path, tmp_path: Path) -> None:
    image = os.path.realpath(pool) + "/luns/gone.img (deleted)"
    losetup = FakeLosetup()
    hooks.detach(
        pool,
        {"RINGSNAP_DEVICE": "/dev/loop3"},
        losetup=losetup,
        sys_block=_sys_block(tmp_path, {"loop3": image}),
        mountinfo=_mountinfo(tmp_path),
    )
    assert losetup.calls == [["--detach", "/dev/loop3"]]


def test_a_directory_without_luns_is_no_pool(tmp_path: Path) -> None:
    with pytest.raises(HookRefused, match="not a LUN pool"):
        hooks.detach(
            tmp_path,
            {"RINGSNAP_DEVICE": "/dev/loop3"},
            losetup=FakeLosetup(),
            sys_block=_sys_block(tmp_path, {}),
        )


def test_mounted_sources_parses_mountinfo() -> None:
    text = (
        "36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 - ext3 /dev/root rw,errors=continue\n"
        "40 36 7:3 / /a\\040b rw shared:5 - ext4 /dev/loop3 rw\n"
        "garbage\n"
    )
    assert hooks.mounted_sources(text) == {"/dev/root", "/dev/loop3"}


# -- attach ------------------------------------------------------------------------------------


def test_attach_needs_the_volume_variable(pool: Path) -> None:
    with pytest.raises(HookRefused, match=r"\$RINGSNAP_VOLUME is not set"):
        hooks.attach(pool, {"RINGSNAP_VOLUME": ""}, losetup=FakeLosetup())


@pytest.mark.parametrize("volume", ["../etc/passwd", "a/b", ".hidden", "-rf", "a b", "x" * 300])
def test_attach_refuses_names_that_are_no_volume(pool: Path, volume: str) -> None:
    losetup = FakeLosetup()
    with pytest.raises(HookRefused, match="not usable as a file name"):
        hooks.attach(pool, {"RINGSNAP_VOLUME": volume}, losetup=losetup)
    assert losetup.calls == []


def test_attach_refuses_a_missing_image_naming_it(pool: Path, tmp_path: Path) -> None:
    losetup = FakeLosetup()
    with pytest.raises(HookRefused) as refused:
        hooks.attach(
            pool,
            {"RINGSNAP_VOLUME": "play-node1-data-clone"},
            losetup=losetup,
            sys_block=_sys_block(tmp_path, {}),
        )
    assert "play-node1-data-clone" in str(refused.value)
    assert "luns/play-node1-data-clone.img" in str(refused.value)
    assert losetup.calls == []


def test_attach_runs_losetup_find_show(pool: Path, tmp_path: Path) -> None:
    losetup = FakeLosetup("/dev/loop7\n")
    device = hooks.attach(
        pool,
        {"RINGSNAP_VOLUME": "play-node1-data"},
        losetup=losetup,
        sys_block=_sys_block(tmp_path, {}),
    )
    assert device == "/dev/loop7"
    image = Path(os.path.realpath(pool)) / "luns" / "play-node1-data.img"
    assert losetup.calls == [["--find", "--show", str(image)]]


def test_attach_reuses_the_device_already_holding_the_image(pool: Path, tmp_path: Path) -> None:
    image = str(pool / "luns" / "play-node1-data.img")
    losetup = FakeLosetup("/dev/loop7\n")
    device = hooks.attach(
        pool,
        {"RINGSNAP_VOLUME": "play-node1-data"},
        losetup=losetup,
        sys_block=_sys_block(tmp_path, {"loop5": image}),
    )
    assert device == "/dev/loop5"
    assert losetup.calls == []


def test_attach_refuses_an_answer_that_is_no_loop_device(pool: Path, tmp_path: Path) -> None:
    with pytest.raises(HookRefused, match="no loop device"):
        hooks.attach(
            pool,
            {"RINGSNAP_VOLUME": "play-node1-data"},
            losetup=FakeLosetup("losetup: something odd\n"),
            sys_block=_sys_block(tmp_path, {}),
        )


def test_main_exits_1_with_the_reason(pool: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = hooks.main(["attach", "--pool", str(pool)], {"RINGSNAP_VOLUME": "nope"})
    assert code == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "sandbox attach hook: volume 'nope' has no LUN image" in captured.err


# -- a real loop device (root) -----------------------------------------------------------------


def _real_loop_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root to attach loop devices"
    if not Path("/dev/loop-control").exists():
        return "no /dev/loop-control: this kernel gives no loop devices"
    if shutil.which("losetup") is None:
        return "losetup is not installed (util-linux)"
    return None


def _run_hook(action: str, pool: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", MODULE, action, "--pool", str(pool)],
        env={"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def loops() -> Iterator[list[tuple[str, Path]]]:
    """(device, image) a test attached; detached again whatever happens, but only while the device
    still holds that image (a freed loop number may already serve someone else's test)."""
    attached: list[tuple[str, Path]] = []
    yield attached
    for device, image in attached:
        if hooks.backing_file(hooks.loop_name(device)) == os.path.realpath(image):
            subprocess.run(["losetup", "--detach", device], check=False, capture_output=True)


@pytest.mark.skipif(_real_loop_unavailable() is not None, reason=str(_real_loop_unavailable()))
def test_attach_then_detach_a_real_loop_image(
    pool: Path, tmp_path: Path, loops: list[tuple[str, Path]]
) -> None:
    image = pool / "luns" / "play-node1-data.img"
    with image.open("r+b") as handle:
        handle.truncate(8 << 20)

    attached = _run_hook("attach", pool, RINGSNAP_VOLUME="play-node1-data")
    assert attached.returncode == 0, attached.stderr
    device = attached.stdout.strip().splitlines()[-1]
    loops.append((device, image))
    loop = hooks.loop_name(device)
    assert hooks.backing_file(loop) == os.path.realpath(image)

    again = _run_hook("attach", pool, RINGSNAP_VOLUME="play-node1-data")
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip().splitlines()[-1] == device  # a retry gets the same device

    # A loop device of a file outside the pool is refused and stays attached.
    outsider = tmp_path / "outsider.img"
    outsider.write_bytes(b"\0" * (1 << 20))
    other = subprocess.run(
        ["losetup", "--find", "--show", str(outsider)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    loops.append((other, outsider))
    refused = _run_hook("detach", pool, RINGSNAP_DEVICE=other)
    assert refused.returncode == 1
    assert "is not a LUN image of the pool" in refused.stderr
    assert hooks.backing_file(hooks.loop_name(other)) is not None

    detached = _run_hook("detach", pool, RINGSNAP_DEVICE=device)
    assert detached.returncode == 0, detached.stderr
    # Not asserted by number afterwards: another session may take the freed loop device at once.
    assert hooks.attached_devices(image) == []


def test_attach_refuses_a_clone_no_one_presented(pool: Path, tmp_path: Path) -> None:
    (pool / "luns" / "play-node1-data-clone.img").write_bytes(b"\0" * 4096)
    losetup = FakeLosetup("/dev/loop7\n")
    with pytest.raises(HookRefused, match="not presented to this host") as refused:
        hooks.attach(
            pool,
            {"RINGSNAP_VOLUME": "play-node1-data-clone"},
            losetup=losetup,
            sys_block=_sys_block(tmp_path, {}),
        )
    assert str(fabric.by_id_dir(pool)) in str(refused.value)
    assert losetup.calls == []


def test_attach_gives_the_loop_device_a_mapping_made(pool: Path, tmp_path: Path) -> None:
    """A presented clone: the array's mapping attached its image to a loop device and named
    that device by its WWN; the hook hands that device over, attaching nothing."""
    clone = pool / "luns" / "play-node1-data-clone.img"
    clone.write_bytes(b"\0" * 4096)
    fabric.present(pool, Path("/dev/loop4"), "600a0980" + "cd" * 12)
    losetup = FakeLosetup("/dev/loop7\n")
    found = hooks.attach(
        pool,
        {"RINGSNAP_VOLUME": "play-node1-data-clone"},
        losetup=losetup,
        sys_block=_sys_block(tmp_path, {"loop4": str(clone)}),
    )
    assert found == "/dev/loop4"
    assert losetup.calls == []


def test_detach_points_the_devices_by_id_link_at_the_lun_it_held(
    pool: Path, tmp_path: Path
) -> None:
    """A mapped clone's link names its loop device. Once the host let go of the device, no link
    names it (the next image attached to it would be taken for the clone), but the array still
    maps the clone: its id names the clone's image, and attach finds it there again."""
    clone = pool / "luns" / "play-node1-data-clone.img"
    clone.write_bytes(b"\0" * 4096)
    clone_id = "600a0980" + "ef" * 12
    fabric.present(pool, Path("/dev/loop3"), clone_id)
    hooks.detach(
        pool,
        {"RINGSNAP_DEVICE": "/dev/loop3"},
        losetup=FakeLosetup(),
        sys_block=_sys_block(tmp_path, {"loop3": os.path.realpath(clone)}),
        mountinfo=_mountinfo(tmp_path, "/dev/loop4"),
    )
    assert not fabric.named(pool, Path("/dev/loop3"))
    link = fabric.by_id_dir(pool) / f"wwn-0x{clone_id}"
    assert os.path.realpath(link) == os.path.realpath(clone)
    assert fabric.named(pool, pool / "luns" / "play-node1-data.img"), "a volume's link stays"

    losetup = FakeLosetup("/dev/loop5\n")
    attached = hooks.attach(
        pool,
        {"RINGSNAP_VOLUME": "play-node1-data-clone"},
        losetup=losetup,
        sys_block=_sys_block(tmp_path / "after", {}),
    )
    assert attached == "/dev/loop5"
    assert losetup.calls == [["--find", "--show", os.path.realpath(clone)]]

    # The array unmaps it, then deletes it: no link is left to name it.
    fabric.withdraw(pool, clone)
    assert not link.is_symlink()


def test_detach_of_a_deleted_lun_image_leaves_no_link_to_its_device(
    pool: Path, tmp_path: Path
) -> None:
    gone = os.path.realpath(pool) + "/luns/play-node1-data-clone.img (deleted)"
    fabric.present(pool, Path("/dev/loop3"), "600a0980" + "ef" * 12)
    hooks.detach(
        pool,
        {"RINGSNAP_DEVICE": "/dev/loop3"},
        losetup=FakeLosetup(),
        sys_block=_sys_block(tmp_path, {"loop3": gone}),
        mountinfo=_mountinfo(tmp_path),
    )
    assert not fabric.named(pool, Path("/dev/loop3"))
    assert not (fabric.by_id_dir(pool) / f"wwn-0x{'600a0980' + 'ef' * 12}").is_symlink()


# -- local disks: LVs of the lvm2 emulator (--lvm-store) ---------------------------------------


@pytest.fixture
def lvm_store(pool: Path) -> Path:
    """A store whose VG das1 adopted the LUN as its data LV (a link), plus a snapshot's own file."""
    store = pool / "das"
    (store / "das1").mkdir(parents=True)
    (store / "das1" / "data.img").symlink_to(pool / "luns" / "play-node1-data.img")
    (store / "das1" / "snap.img").write_bytes(b"\0" * 4096)
    return store


def test_attach_lv_attaches_the_lv_image_without_any_fabric(
    lvm_store: Path, tmp_path: Path
) -> None:
    losetup = FakeLosetup("/dev/loop7\n")
    device = hooks.attach_lv(
        lvm_store,
        {"RINGSNAP_VOLUME": "das1/snap"},
        losetup=losetup,
        sys_block=_sys_block(tmp_path, {}),
    )
    assert device == "/dev/loop7"
    assert losetup.calls == [["--find", "--show", str(lvm_store / "das1" / "snap.img")]]


def test_attach_lv_reuses_the_device_holding_the_adopted_lun(
    pool: Path, lvm_store: Path, tmp_path: Path
) -> None:
    lun = os.path.realpath(pool / "luns" / "play-node1-data.img")
    losetup = FakeLosetup("/dev/loop7\n")
    device = hooks.attach_lv(
        lvm_store,
        {"RINGSNAP_VOLUME": "das1/data"},
        losetup=losetup,
        sys_block=_sys_block(tmp_path, {"loop2": lun}),
    )
    assert device == "/dev/loop2"
    assert losetup.calls == []


@pytest.mark.parametrize("volume", ["data", "das1/", "../das1/data", "das1/../x", "das1/missing"])
def test_attach_lv_refuses_what_is_no_lv_of_the_store(lvm_store: Path, volume: str) -> None:
    with pytest.raises(HookRefused, match=r"das1|logical volume"):
        hooks.attach_lv(lvm_store, {"RINGSNAP_VOLUME": volume}, losetup=FakeLosetup())


def test_detach_with_a_store_releases_an_lv_image_of_it(
    pool: Path, lvm_store: Path, tmp_path: Path
) -> None:
    snapshot = os.path.realpath(lvm_store / "das1" / "snap.img")
    losetup = FakeLosetup()
    done = hooks.detach(
        pool,
        {"RINGSNAP_DEVICE": "/dev/loop3"},
        losetup=losetup,
        sys_block=_sys_block(tmp_path, {"loop3": snapshot}),
        mountinfo=_mountinfo(tmp_path),
        lvm_store=lvm_store,
    )
    assert losetup.calls == [["--detach", "/dev/loop3"]]
    assert "das1/snap" in done


def test_detach_with_a_store_still_refuses_any_other_file(
    pool: Path, lvm_store: Path, tmp_path: Path
) -> None:
    other = tmp_path / "elsewhere.img"
    other.write_bytes(b"\0")
    with pytest.raises(HookRefused, match="refusing to detach /dev/loop3"):
        hooks.detach(
            pool,
            {"RINGSNAP_DEVICE": "/dev/loop3"},
            losetup=FakeLosetup(),
            sys_block=_sys_block(tmp_path, {"loop3": str(other)}),
            mountinfo=_mountinfo(tmp_path),
            lvm_store=lvm_store,
        )
