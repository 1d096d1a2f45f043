"""A process confined as the coordinator's systemd unit runs it, for tests that must show the
coordinator needs no privilege, no device and no lvm2:

    result = run_confined(function, *args, reachable=[workdir])

`function(*args)` runs in a fresh (spawned) process that, before it runs anything of the test:
- has a mount namespace of its own (a slave of the host's), without the nodes' mounts (loop
  devices, container roots and namespaces: the coordinator's host has none of them, and a copy
  here would keep the kernel holding a node's device after the agent unmounted it);
- has a /dev holding only what PrivateDevices=yes leaves (null, zero, full, random, urandom);
- runs as uid and gid 65534 (nobody), no supplementary group, every capability dropped for good
  (bounding set too) and no_new_privs.

The interpreter may live where nobody cannot go (this machine's under /root, mode 0700; a CI
checkout anywhere): while still root, each directory the process needs (the interpreter's
prefixes, the checkout, `reachable`) that lies below a directory others may not search is bound
again at its own path over a tmpfs (mode 0755) mounted on that directory, in the private
namespace only. The host is not changed; what `reachable` holds must be readable (or writable)
by uid 65534 itself: the test chowns what the coordinator writes (`give_to_nobody`).
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import stat
import sys
import traceback
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import TypeVar, cast

from ringsnap import mountinfo
from ringsnap.mountinfo import Mount

T = TypeVar("T")
NOBODY = 65534
CLONE_NEWNS = 0x00020000
MS_NOSUID, MS_NOEXEC, MS_BIND, MS_REC, MS_SLAVE = 0x2, 0x8, 0x1000, 0x4000, 0x80000
PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP = 38, 24
#: What systemd's PrivateDevices=yes leaves in /dev (besides tty and pseudo-terminals).
PRIVATE_DEVICES = {"null": 3, "zero": 5, "full": 7, "random": 8, "urandom": 9}


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _searchable_by_others(path: Path) -> bool:
    return bool(path.stat().st_mode & stat.S_IXOTH)


def blocked_below(paths: Iterable[Path], top: Path = Path("/")) -> tuple[list[Path], list[Path]]:
    """(directories to cover with a tmpfs, paths to bind back over them): for each path, the
    outermost ancestor below `top` (itself excluded) that others may not search; paths inside
    another path to bind are left out (the outer bind carries them)."""
    covers: set[Path] = set()
    binds: set[Path] = set()
    for path in paths:
        for ancestor in reversed(path.parents):
            if top in ancestor.parents and not _searchable_by_others(ancestor):
                covers.add(ancestor)
                binds.add(path)
                break
    outer_covers = sorted(c for c in covers if not any(o in c.parents for o in covers))
    outer_binds = sorted(b for b in binds if not any(o in b.parents for o in binds))
    return outer_covers, outer_binds


def needed_paths(reachable: Sequence[str]) -> list[Path]:
    """The interpreter's prefixes, the checkout (parents of the `ringsnap` and `tests` packages:
    modules not imported yet come from there) and `reachable`, resolved."""
    import ringsnap
    import tests

    found = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(sys.executable)}
    found |= {os.path.dirname(os.path.realpath(sys.executable))}
    found |= {os.path.dirname(p) for p in [*ringsnap.__path__, *tests.__path__]}
    found |= set(reachable)
    return sorted({Path(os.path.realpath(p)) for p in found if os.path.exists(p)})


#: Mounts of the nodes and their containers, which the coordinator's host would not have: loop
#: devices (the nodes' LUNs and the pool), container roots and namespaces.
FOREIGN_FS_TYPES = ("overlay", "nsfs")
MNT_DETACH = 2


def _related(point: str, kept: Sequence[str]) -> bool:
    """`point` is one of `kept`, below one, or above one (a parent carries what is below it)."""
    path = Path(point)
    return any(path == k or k in path.parents or path in k.parents for k in map(Path, kept))


def foreign_mounts(mounts: Sequence[Mount], keep_below: Sequence[str] = ()) -> list[str]:
    """Mount points of `mounts` the confined process lets go of, deepest first; the mounts
    below `keep_below` (and those holding them) stay."""
    foreign = [
        m.mount_point
        for m in mounts
        if (m.source.startswith("/dev/loop") or m.fs_type in FOREIGN_FS_TYPES)
        and not _related(m.mount_point, keep_below)
    ]
    return sorted(set(foreign), key=lambda point: (-point.count("/"), point))


def _let_go_of_the_nodes_mounts(libc: ctypes.CDLL, keep_below: Sequence[str]) -> None:
    """Detach this namespace's copies of the nodes' mounts. The host's mounts here are private
    (no propagation), so a copy would outlive the host's unmount and keep the kernel holding the
    device: an agent releasing a volume for a revert would rightly refuse ("mounted elsewhere"),
    and a container's overlay could not be mounted again. A test whose coordinator reads the
    nodes' files itself keeps them (`keep_below`), below a shared mount that propagates here."""
    for point in foreign_mounts(mountinfo.read(), keep_below):
        libc.umount2(point.encode(), MNT_DETACH)  # gone already with a parent: fine


def confine(
    uid: int, reachable: Sequence[str], preload: Sequence[str], keep_below: Sequence[str] = ()
) -> None:
    """The initializer of the confined process (see the module doc)."""
    libc = ctypes.CDLL(None, use_errno=True)
    covers, binds = blocked_below(needed_paths(reachable))
    _check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _check(libc.mount(b"none", b"/", None, MS_REC | MS_SLAVE, None), "make / a slave")
    _let_go_of_the_nodes_mounts(libc, keep_below)
    # Held open across the tmpfs that hides them, then bound back from /proc/self/fd.
    held = [os.open(path, os.O_PATH) for path in binds]
    for cover in covers:
        _check(
            libc.mount(b"tmpfs", str(cover).encode(), b"tmpfs", MS_NOSUID, b"mode=0755"),
            f"a tmpfs over {cover}",
        )
    for path, fd in zip(binds, held, strict=True):
        os.makedirs(path, mode=0o755, exist_ok=True)
        source = f"/proc/self/fd/{fd}".encode()
        _check(libc.mount(source, str(path).encode(), None, MS_BIND | MS_REC, None), f"bind {path}")
        os.close(fd)
    _check(
        libc.mount(b"tmpfs", b"/dev", b"tmpfs", MS_NOSUID | MS_NOEXEC, b"mode=0755"),
        "mount a private /dev",
    )
    for name, minor in PRIVATE_DEVICES.items():
        os.mknod(f"/dev/{name}", 0o666 | stat.S_IFCHR, os.makedev(1, minor))
        os.chmod(f"/dev/{name}", 0o666)
    for module in preload:
        __import__(module)
    for capability in range(64):
        libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0)  # EINVAL past the last one: fine
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)  # to a non-zero uid: permitted and effective capabilities are cleared
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable (x2): all empty
    _check(libc.capset(header, data), "capset")
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    os.environ["HOME"] = "/nonexistent"


def run_confined(
    function: Callable[..., T],
    *args: object,
    uid: int = NOBODY,
    reachable: Sequence[Path] = (),
    preload: Sequence[str] = (),
    keep_below: Sequence[Path] = (),
    timeout: float = 900,
) -> T:
    """`function(*args)` in a fresh confined process (see the module doc); `preload`: modules
    imported while still root; `keep_below`: the nodes' mounts there stay visible."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(
        1,
        mp_context=context,
        initializer=confine,
        initargs=(uid, [str(p) for p in reachable], list(preload), [str(p) for p in keep_below]),
    ) as pool:
        failed, value = pool.submit(_call, function, *args).result(timeout=timeout)
    if failed:
        raise AssertionError(f"the confined process failed:\n{value}")
    return cast(T, value)


def _call(function: Callable[..., object], *args: object) -> tuple[bool, object]:
    """(False, result), or (True, the traceback): not every exception pickles (ConfigError)."""
    try:
        return False, function(*args)
    except BaseException:
        return True, traceback.format_exc()


def give_to_nobody(directory: Path, uid: int = NOBODY) -> None:
    """`directory` and everything below it owned by `uid` (what the confined process writes)."""
    for root, dirs, files in os.walk(directory):
        for name in [*dirs, *files]:
            os.chown(os.path.join(root, name), uid, uid, follow_symlinks=False)
    os.chown(directory, uid, uid)


def confinement() -> dict[str, object]:
    """What the confined process can see and do, for the test to check (`assert_confined`)."""
    status = Path("/proc/self/status").read_text()
    caps = {
        line.split(":")[0]: int(line.split()[1], 16)
        for line in status.splitlines()
        if line.startswith("Cap")
    }
    no_new_privs = next(
        int(line.split()[1]) for line in status.splitlines() if line.startswith("NoNewPrivs")
    )
    try:
        os.mknod("/dev/loop-probe", 0o600 | stat.S_IFBLK, os.makedev(7, 0))
        mknod = "allowed"
    except OSError as exc:
        mknod = exc.strerror or str(exc)
    return {
        "uid": os.getuid(),
        "euid": os.geteuid(),
        "gid": os.getgid(),
        "groups": os.getgroups(),
        "dev": sorted(os.listdir("/dev")),
        "caps": caps,
        "no_new_privs": no_new_privs,
        "mknod": mknod,
        "mapper": Path("/dev/mapper/control").exists(),
    }


def assert_confined(seen: dict[str, object], uid: int = NOBODY) -> None:
    assert seen["uid"] == seen["euid"] == seen["gid"] == uid, seen
    assert seen["groups"] == [], seen
    assert seen["dev"] == sorted(PRIVATE_DEVICES), seen
    assert seen["mapper"] is False, seen
    caps = seen["caps"]
    assert isinstance(caps, dict)
    assert caps["CapEff"] == caps["CapPrm"] == caps["CapBnd"] == caps["CapInh"] == 0, caps
    assert seen["no_new_privs"] == 1, seen
    assert seen["mknod"] != "allowed", seen
