"""The sandbox's storage plumbing for the agent's `[volumes]` hooks (restore).

    python -m ringsnap.sandbox.hooks detach --pool <pool dir>
    python -m ringsnap.sandbox.hooks attach --pool <pool dir>

On a real host these hooks log a LUN out of its iSCSI/FC session and back in; in the sandbox a
LUN is an image file `<pool>/luns/<volume>.img` on a loop device, so:

- `detach` (run by the agent after it unmounted the filesystem): detach the loop device named by
  $RINGSNAP_DEVICE, if it is still attached. It refuses (exit 1) anything but a `/dev/loopN`
  whose backing file is a LUN image of this pool, and a device that is still mounted: detaching a
  mounted loop device would only defer the detach to the unmount, and the array would then revert
  an image the kernel still caches. A by-id link that named the device names its image afterwards:
  the host logged out, the array still maps the LUN, and `attach` finds it again.
- `attach` (run before mounting): attach `<pool>/luns/$RINGSNAP_VOLUME.img` to a loop device and
  print the device on the last line of stdout (the agent mounts that). An image already attached
  to a loop device (a retried attach) is given that device again, not a second one. Only a LUN
  the fabric shows to hosts is attached (a by-id link names its image, or the loop device the
  array's mapping made: `plugins.simulators.fabric`): a clone no one presented is refused, as a
  real host would not see it.

With `--lvm-store <dir>` the node's disks are local, LVs of the lvm2 emulator
(`plugins.simulators.lvm2`, a DAS node: `sandbox.das`): $RINGSNAP_VOLUME is `<vg>/<lv>`, its image
`<dir>/<vg>/<lv>.img` (a LUN image adopted as the LV, or a snapshot's or clone's own file);
attach needs no fabric (a local disk is seen by its host alone), and detach lets go of a loop
device whose backing file is a LUN image of the pool or a file of the store.

Exit codes: 0 done (also: nothing to detach); 1 refused or failed (the message says why);
2 usage. Commands run without a shell; the environment names nothing that reaches a shell.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from ringsnap.plugins.simulators import fabric
from ringsnap.plugins.simulators.lunpool import LunPoolError, check_name

DEVICE_ENV = "RINGSNAP_DEVICE"
VOLUME_ENV = "RINGSNAP_VOLUME"
_LOOP_DEVICE = re.compile(r"^/dev/loop(\d{1,6})$")
_DELETED = " (deleted)"
SYS_BLOCK = Path("/sys/block")
MOUNTINFO = Path("/proc/self/mountinfo")
LOSETUP_TIMEOUT = 60.0

Runner = Callable[[Sequence[str]], str]


class HookRefused(Exception):
    """The hook will not (or could not) do what it was asked; the message says why."""


# -- pure checks (unit-tested) ---------------------------------------------------------------------


def loop_name(device: str) -> str:
    """`loop3` for `/dev/loop3`; refuses anything that is not a loop device path."""
    match = _LOOP_DEVICE.match(device)
    if match is None:
        raise HookRefused(
            f"${DEVICE_ENV}={device!r} is not a loop device (/dev/loopN): the sandbox's LUNs are"
            " loop devices, and this hook detaches nothing else"
        )
    return f"loop{match.group(1)}"


def pool_luns_dir(pool: Path) -> Path:
    """`<pool>/luns`, resolved (the kernel reports backing files by their resolved path)."""
    luns = Path(os.path.realpath(pool)) / "luns"
    if not luns.is_dir():
        raise HookRefused(f"{pool} is not a LUN pool: it has no luns/ directory")
    return luns


def lun_volume_of(backing_file: str, luns_dir: Path) -> str:
    """The volume whose image `backing_file` is, if it is a LUN image directly in `luns_dir`."""
    path = Path(backing_file.removesuffix(_DELETED))
    if path.parent != luns_dir or path.suffix != ".img":
        raise HookRefused(
            f"its backing file {backing_file} is not a LUN image of the pool ({luns_dir}/*.img)"
        )
    try:
        return check_name(path.stem, "volume")
    except LunPoolError as exc:
        raise HookRefused(f"its backing file {backing_file} is not a LUN image: {exc}") from None


def mounted_sources(mountinfo: str) -> set[str]:
    """The mount sources (field after the filesystem type) of /proc/self/mountinfo text."""
    sources: set[str] = set()
    for line in mountinfo.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        separator = fields.index("-")
        if separator + 2 < len(fields):
            sources.add(fields[separator + 2])
    return sources


def required_env(environ: Mapping[str, str], name: str) -> str:
    value = environ.get(name, "")
    if not value:
        raise HookRefused(f"${name} is not set: the agent sets it when it runs this hook")
    return value


def volume_image(pool: Path, volume: str) -> Path:
    """`<pool>/luns/<volume>.img`, which must exist."""
    try:
        check_name(volume, "volume")
    except LunPoolError as exc:
        raise HookRefused(f"${VOLUME_ENV}: {exc}") from None
    image = pool_luns_dir(pool) / f"{volume}.img"
    if not image.is_file():
        raise HookRefused(
            f"volume {volume!r} has no LUN image {image}: the array has no such volume (was the"
            " clone made?)"
        )
    return image


# -- the system --------------------------------------------------------------------------------------


def backing_file(loop: str, sys_block: Path = SYS_BLOCK) -> str | None:
    """The backing file of `loop` (e.g. loop3) as the kernel reports it; None if not attached."""
    try:
        return (sys_block / loop / "loop" / "backing_file").read_text().strip() or None
    except FileNotFoundError:
        return None


def attached_devices(image: Path, sys_block: Path = SYS_BLOCK) -> list[str]:
    """Loop devices whose backing file is `image` (same inode, or same path if it is gone)."""
    target = os.stat(image)
    found = []
    for entry in sorted(sys_block.glob("loop*/loop/backing_file")):
        try:
            backing = entry.read_text().strip()
            other = os.stat(backing)
        except OSError:
            continue
        if (other.st_dev, other.st_ino) == (target.st_dev, target.st_ino):
            found.append(f"/dev/{entry.parent.parent.name}")
    return found


def _losetup(argv: Sequence[str]) -> str:
    try:
        done = subprocess.run(
            ["losetup", *argv],
            capture_output=True,
            text=True,
            check=False,
            timeout=LOSETUP_TIMEOUT,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HookRefused(f"losetup {' '.join(argv)} failed: {exc}") from None
    if done.returncode != 0:
        raise HookRefused(
            f"losetup {' '.join(argv)} failed (exit {done.returncode}):"
            f" {done.stderr.strip() or done.stdout.strip()}"
        )
    return done.stdout


# -- the two hooks -----------------------------------------------------------------------------------


_LV_PART = re.compile(r"^[A-Za-z0-9+_.][A-Za-z0-9+_.-]{0,127}$")


def lv_image(store: Path, volume: str) -> Path:
    """`<store>/<vg>/<lv>.img` of $RINGSNAP_VOLUME = `<vg>/<lv>`, which must exist."""
    vg, _, lv = volume.partition("/")
    if not all(_LV_PART.match(part) for part in (vg, lv)):
        raise HookRefused(f"${VOLUME_ENV}={volume!r} is not a logical volume name <vg>/<lv>")
    image = store / vg / f"{lv}.img"
    if not image.is_file():
        raise HookRefused(f"logical volume {volume!r} has no image {image}: lvm2 has no such LV")
    return image


def store_volume_of(backing_file: str, store: Path) -> str:
    """`<vg>/<lv>` of a backing file directly in a VG directory of the lvm2 emulator's store."""
    path = Path(backing_file.removesuffix(_DELETED))
    root = Path(os.path.realpath(store))
    if path.parent.parent != root or path.suffix != ".img":
        raise HookRefused(f"its backing file {backing_file} is no LV image of {root}")
    return f"{path.parent.name}/{path.stem}"


def detach(
    pool: Path,
    environ: Mapping[str, str],
    *,
    losetup: Runner = _losetup,
    sys_block: Path = SYS_BLOCK,
    mountinfo: Path = MOUNTINFO,
    lvm_store: Path | None = None,
) -> str:
    """Detach $RINGSNAP_DEVICE if it is an attached LUN of `pool` (or an LV image of
    `lvm_store`); returns what was done."""
    device = required_env(environ, DEVICE_ENV)
    loop = loop_name(device)
    luns = pool_luns_dir(pool)
    backing = backing_file(loop, sys_block)
    if backing is None:
        return f"{device} is not attached: nothing to detach"
    try:
        volume = lun_volume_of(backing, luns)
    except HookRefused as exc:
        try:
            if lvm_store is None:
                raise
            volume = store_volume_of(backing, lvm_store)
        except HookRefused:
            raise HookRefused(f"refusing to detach {device}: {exc}") from None
    if device in mounted_sources(mountinfo.read_text()):
        raise HookRefused(
            f"refusing to detach {device} (volume {volume}): it is still mounted; unmount it first"
        )
    losetup(["--detach", device])
    # No by-id link may name a loop device that is gone (it would name the next image attached
    # to it). A LUN image still there stays mapped (the array's doing, not the host's): its links
    # name the image, as a rescan on a real host would find the LUN again by its WWN.
    image = Path(backing)
    if not backing.endswith(_DELETED) and image.parent == luns:
        fabric.release_device(pool, device, image)
    else:
        fabric.forget_device(pool, device)
    return f"detached {device} (volume {volume}, {backing})"


def attach(
    pool: Path,
    environ: Mapping[str, str],
    *,
    losetup: Runner = _losetup,
    sys_block: Path = SYS_BLOCK,
) -> str:
    """Attach $RINGSNAP_VOLUME's image to a loop device; returns the device."""
    volume = required_env(environ, VOLUME_ENV)
    image = volume_image(pool, volume)
    return _attach_image(pool, image, volume, losetup=losetup, sys_block=sys_block)


def attach_lv(
    store: Path,
    environ: Mapping[str, str],
    *,
    losetup: Runner = _losetup,
    sys_block: Path = SYS_BLOCK,
) -> str:
    """Attach the image of the local LV $RINGSNAP_VOLUME (`<vg>/<lv>`); returns the device. An
    image already attached (a retried attach) is given its device again."""
    image = lv_image(store, required_env(environ, VOLUME_ENV))
    existing = attached_devices(image, sys_block)
    if existing:
        return existing[0]
    return _new_loop(image, losetup)


def _attach_image(pool: Path, image: Path, volume: str, *, losetup: Runner, sys_block: Path) -> str:
    existing = attached_devices(image, sys_block)
    seen = [d for d in existing if fabric.named(pool, Path(d))]
    if seen:
        return seen[0]  # the loop device a mapping made
    if not fabric.named(pool, image):
        raise HookRefused(
            f"volume {volume!r} is not presented to this host: no link in"
            f" {fabric.by_id_dir(pool)} names it (the array maps a clone to a host when ringsnap"
            " presents it)"
        )
    if existing:
        print(f"{image} is already attached to {existing[0]}: using it", file=sys.stderr)
        return existing[0]
    return _new_loop(image, losetup)


def _new_loop(image: Path, losetup: Runner) -> str:
    device = losetup(["--find", "--show", str(image)]).strip().splitlines()
    if not device or _LOOP_DEVICE.match(device[-1]) is None:
        raise HookRefused(f"losetup gave no loop device for {image}: {device!r}")
    return device[-1]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ringsnap.sandbox.hooks",
        description="The sandbox's [volumes] detach/attach hooks: loop devices of LUN images.",
    )
    parser.add_argument("action", choices=["detach", "attach"])
    parser.add_argument(
        "--pool", type=Path, required=True, help="the XFS pool (its LUNs are luns/*.img)"
    )
    parser.add_argument(
        "--lvm-store",
        type=Path,
        help="local disks: the lvm2 emulator's store (<vg>/<lv>.img); $RINGSNAP_VOLUME is vg/lv",
    )
    return parser


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    arguments = _parser().parse_args(argv)
    env = os.environ if environ is None else environ
    try:
        if arguments.action == "detach":
            print(detach(arguments.pool, env, lvm_store=arguments.lvm_store), file=sys.stderr)
        elif arguments.lvm_store is not None:
            print(attach_lv(arguments.lvm_store, env), flush=True)
        else:
            device = attach(arguments.pool, env)
            print(device, flush=True)
    except HookRefused as exc:
        print(f"sandbox {arguments.action} hook: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
