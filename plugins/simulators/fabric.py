"""The sandbox's SAN fabric: how a host comes to know a LUN image by the id its array gives it.

On a real SAN udev names each disk in /dev/disk/by-id by its WWN (`wwn-0x600a0980…`); the agent
reads those links to tell which array volume is under each Cassandra directory. In the sandbox a
LUN is an image file in the pool, loop-mounted; the simulators, which play the arrays, put a
`wwn-0x<host id>` link to each volume's image in `<pool>/by-id`, and the agents are configured to
read that directory (`[volumes] by_id_dir`). A loop device is named by its backing file, so the
link stays right however often the image is detached and attached again, and the agent's
discovery code is the one that runs in production.

A clone is different: like a new LUN on a real SAN it is seen by no host until the array maps it
(issue 20, presentation). The simulators link it only when a mapping is made (`LunPool.
map_to_host`): with `fabric_loops` (the sandbox) to a loop device of its image, which is what an
agent finds by the identity and mounts with no hook at all; when the last mapping goes, the link
goes and the loop device is detached. One by-id directory serves every host of the sandbox (they
share one machine): a clone mapped to any host is seen by all of them; a flow that forgot to
present is seen by none.

A node's detach hook (a host logging the LUN out) lets go of the loop device but not of the
mapping, which is the array's: on a real SAN the by-id link goes with the device and comes back,
same WWN, at the next rescan, for as long as the array maps the LUN. The sandbox has no rescan, so
the link is re-pointed at the clone's image (`release_device`), as a volume's own link is, and the
attach hook (the log-in) finds it there; the clone-mode restore's clones, which stay mapped to
their nodes, can be detached, reverted and attached again.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from ringsnap import device_ids

BY_ID = "by-id"


def by_id_dir(pool_root: Path) -> Path:
    """The by-id directory of the pool at `pool_root` (what agents read as `by_id_dir`)."""
    return pool_root / BY_ID


def present(pool_root: Path, image: Path, host_id: str) -> None:
    """Name `image` by `host_id` (any spelling of an NAA id): `<pool>/by-id/wwn-0x<hex>` ->
    the image, and by nothing else. Idempotent; a link of that name to another image is
    replaced."""
    value = device_ids.canonical(host_id)
    if not value:
        return
    directory = by_id_dir(pool_root)
    link = directory / f"wwn-0x{value}"
    target = str(image)
    with contextlib.suppress(OSError):
        if os.readlink(link) == target:
            return
    withdraw(pool_root, image)  # an id it had before (a volume made again under its name)
    directory.mkdir(parents=True, exist_ok=True)
    staged = directory / f".{link.name}.{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        staged.unlink()
    os.symlink(target, staged)
    os.replace(staged, link)


def withdraw(pool_root: Path, image: Path) -> None:
    """Remove every by-id link that names `image` (its LUN was deleted), however the pool's path
    is spelt in the link (a detach hook may have written the resolved path)."""
    directory = by_id_dir(pool_root)
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return
    wanted = os.path.realpath(image)
    for name in names:
        link = directory / name
        with contextlib.suppress(OSError):
            if os.path.islink(link) and os.path.realpath(link) == wanted:
                link.unlink()


def withdraw_id(pool_root: Path, host_id: str) -> None:
    """Remove the link that names `host_id` (its mapping went)."""
    value = device_ids.canonical(host_id)
    if value:
        with contextlib.suppress(FileNotFoundError):
            (by_id_dir(pool_root) / f"wwn-0x{value}").unlink()


def forget_device(pool_root: Path, device: str) -> None:
    """Remove every link that names the block device `device` (it was detached)."""
    directory = by_id_dir(pool_root)
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(directory):
            with contextlib.suppress(OSError):
                if os.readlink(directory / name) == device:
                    (directory / name).unlink()


def release_device(pool_root: Path, device: str, image: Path) -> None:
    """The host let go of `device`, a loop device of `image`, while the array still maps the LUN:
    every link that named the device names the image now (the LUN stays visible to hosts, a
    later attach finds it by the same id; see the module's note)."""
    directory = by_id_dir(pool_root)
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(directory):
            link = directory / name
            with contextlib.suppress(OSError):
                if os.readlink(link) != device:
                    continue
                staged = directory / f".{name}.{os.getpid()}"
                with contextlib.suppress(FileNotFoundError):
                    staged.unlink()
                os.symlink(str(image), staged)
                os.replace(staged, link)


def forget_devices(pool_root: Path) -> None:
    """Remove every link that names a device rather than an image: the mappings of a simulator
    that is gone (a new one starts with none)."""
    directory = by_id_dir(pool_root)
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(directory):
            with contextlib.suppress(OSError):
                if os.readlink(directory / name).startswith("/dev/"):
                    (directory / name).unlink()


def named(pool_root: Path, target: Path) -> bool:
    """Whether a link in the by-id directory names `target` (an image or a device)."""
    directory = by_id_dir(pool_root)
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return False
    wanted = os.path.realpath(target)
    return any(os.path.realpath(directory / name) == wanted for name in names)
