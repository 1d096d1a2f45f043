"""The host's side of letting go of a filesystem and taking it back (restores).

Facts: the mount table with options, filesystem UUIDs, the processes that hold something on a
filesystem, whether the kernel still holds a block device. Actions: mount and umount (argv, no
shell, through `ringsnap.agent.process`). `Host` bundles them so that tests can replace the host.

Who holds a filesystem is read from /proc: every process's open files (`fd/*`), working directory,
root and memory-mapped files, compared by device number (`os.stat` follows the magic links). That
names the culprit; the kernel's own refusal (`umount` without `-l` fails while the filesystem is
busy, an exclusive open of the block device fails while it is mounted in any mount namespace) is
what makes a release safe.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ringsnap import logs
from ringsnap.agent import process, volumes
from ringsnap.agent.errors import CommandFailed
from ringsnap.mountinfo import MOUNTINFO, Mount, read

log = logs.get_logger(__name__)

PROC = Path("/proc")
BY_UUID = Path("/dev/disk/by-uuid")
#: mount(8), umount(8) and blkid(8) are argv[0] of every call here, found on PATH.
MOUNT = "mount"
UMOUNT = "umount"
BLKID = "blkid"
MOUNT_TIMEOUT_SECONDS = 300.0
BLKID_TIMEOUT_SECONDS = 60.0
_DELETED = " (deleted)"


@dataclass(frozen=True, slots=True)
class Holder:
    """A process that holds something on a filesystem."""

    pid: int
    comm: str
    #: What it holds: "fd 7 /mnt/data/x", "cwd /mnt/data", "mapped /mnt/data/lib.so" ...
    what: str

    def __str__(self) -> str:
        return f"pid {self.pid} ({self.comm}): {self.what}"


# -- who holds a filesystem -------------------------------------------------------------------------


def _comm(pid_dir: Path) -> str:
    try:
        return (pid_dir / "comm").read_text(errors="replace").strip()
    except OSError:
        return "?"


@dataclass(frozen=True, slots=True)
class _Reference:
    """One thing a process holds: a magic link to stat, or a mapping with its device number."""

    what: str
    path: str
    link: Path | None = None
    device: int | None = None

    def device_number(self) -> int:
        if self.device is not None:
            return self.device
        assert self.link is not None
        return os.stat(self.link).st_dev  # follows the magic link to the open file itself


def _maps_references(pid_dir: Path) -> Iterator[_Reference]:
    """Every file-backed mapping of one process (maps: address perms offset dev inode path)."""
    with (pid_dir / "maps").open(errors="replace") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) < 6 or fields[4] == "0":
                continue
            major, _, minor = fields[3].partition(":")
            try:
                device = os.makedev(int(major, 16), int(minor, 16))
            except ValueError:
                continue
            path = fields[5].strip()
            yield _Reference(f"mapped {path}", path.removesuffix(_DELETED), device=device)


def _references(pid_dir: Path) -> Iterator[_Reference]:
    """Everything one process holds: working directory, root, open files, mapped files."""
    for name in ("cwd", "root"):
        link = pid_dir / name
        path = os.readlink(link)
        yield _Reference(f"{name} {path}", path.removesuffix(_DELETED), link=link)
    fd_dir = pid_dir / "fd"
    for name in os.listdir(fd_dir):
        link = fd_dir / name
        try:
            path = os.readlink(link)
        except FileNotFoundError:
            continue  # closed meanwhile
        yield _Reference(f"fd {name} {path}", path.removesuffix(_DELETED), link=link)
    yield from _maps_references(pid_dir)


def _scan(
    matches: Callable[[_Reference], bool], proc: Path = PROC
) -> tuple[list[Holder], list[int]]:
    """(holders, pids that could not be inspected) over every process of `proc`."""
    holders: list[Holder] = []
    hidden: list[int] = []
    try:
        pids = sorted(int(name) for name in os.listdir(proc) if name.isdigit())
    except OSError:
        return holders, hidden
    for pid in pids:
        pid_dir = proc / str(pid)
        try:
            found = [ref.what for ref in _references(pid_dir) if matches(ref)]
        except PermissionError:
            hidden.append(pid)
            continue
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ESRCH, errno.ENOTDIR):
                hidden.append(pid)
            continue  # else the process ended while we looked
        if found:
            comm = _comm(pid_dir)
            holders.extend(Holder(pid, comm, what) for what in found)
    return holders, hidden


def holders_of_device(device_number: int, proc: Path = PROC) -> tuple[list[Holder], list[int]]:
    """Processes holding anything on the filesystem of `device_number`, and uninspectable pids."""

    def on_device(ref: _Reference) -> bool:
        try:
            return ref.device_number() == device_number
        except (FileNotFoundError, ProcessLookupError):
            return False  # closed, or the process ended, meanwhile

    return _scan(on_device, proc)


def holders_under(directory: str, proc: Path = PROC) -> tuple[list[Holder], list[int]]:
    """Processes holding anything at or below `directory` (by path), and uninspectable pids.

    Paths only: nothing is stat'ed, so no filesystem but /proc is touched."""
    prefix = directory.rstrip("/") + "/"

    def below(ref: _Reference) -> bool:
        return ref.path == directory or ref.path.startswith(prefix)

    return _scan(below, proc)


def describe_holders(holders: Sequence[Holder], limit: int = 5) -> str:
    shown = "; ".join(str(holder) for holder in holders[:limit])
    more = len(holders) - limit
    return shown + (f"; and {more} more" if more > 0 else "")


# -- block devices ------------------------------------------------------------------------------


def block_device_number(path: str) -> int | None:
    """The device number of the block device at `path`, or None if it is not one (or missing)."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_rdev if stat.S_ISBLK(info.st_mode) else None


def busy_reason(device: str) -> str:
    """Why the kernel still holds `device` ("" if it does not): an exclusive open fails while the
    device is mounted in any mount namespace or claimed by device-mapper, md and the like."""
    try:
        fd = os.open(device, os.O_RDONLY | os.O_EXCL | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.EBUSY:
            return (
                f"the kernel still holds {device} (it is mounted elsewhere, e.g. in another"
                " mount namespace or container, or claimed by device-mapper/md)"
            )
        return f"{device} cannot be opened to check that it is free: {os.strerror(exc.errno or 0)}"
    os.close(fd)
    return ""


def _uuid_from_links(device: str, by_uuid: Path = BY_UUID) -> str:
    wanted = os.path.realpath(device)
    try:
        names = sorted(os.listdir(by_uuid))
    except OSError:
        return ""
    for name in names:
        if os.path.realpath(by_uuid / name) == wanted:
            return name
    return ""


async def fs_uuid(device: str) -> str:
    """The UUID of the filesystem on `device` ("" if none is found): `blkid -p` (bypasses blkid's
    cache: a device that was just attached may carry another filesystem than last time), else
    /dev/disk/by-uuid."""
    try:
        result = await process.run(
            [BLKID, "-p", "-o", "value", "-s", "UUID", device],
            timeout=BLKID_TIMEOUT_SECONDS,
            check=False,
        )
        value = result.stdout.strip() if result.returncode == 0 else ""
    except CommandFailed:  # blkid missing
        value = ""
    return value.splitlines()[-1].strip() if value else _uuid_from_links(device)


# -- can this process restore at all? ------------------------------------------------------------

#: Where the systemd drop-in that lets the agent restore goes (shipped as
#: systemd/ringsnap-agent.service.d/restore.conf).
RESTORE_DROP_IN = "/etc/systemd/system/ringsnap-agent.service.d/restore.conf"
#: capability(7) number of CAP_SYS_PTRACE: reading another user's /proc/<pid>/fd, maps, ns links.
CAP_SYS_PTRACE = 19


def _mount_namespace(pid_dir: Path) -> tuple[int, int] | None:
    """(device, inode) of a process's mount namespace, or None if this process may not look."""
    try:
        info = os.stat(pid_dir / "ns" / "mnt")
    except OSError:
        return None
    return info.st_dev, info.st_ino


def _reference_namespace(proc: Path) -> tuple[str, tuple[int, int]] | None:
    """The host's mount namespace as PID 1 holds it, else as kthreadd (PID 2 of the initial PID
    namespace, always in the initial mount namespace) does; None when neither can be inspected."""
    found = _mount_namespace(proc / "1")
    if found is not None:
        return "PID 1", found
    try:
        is_kthreadd = (proc / "2" / "comm").read_text().strip() == "kthreadd"
    except OSError:
        is_kthreadd = False
    found = _mount_namespace(proc / "2") if is_kthreadd else None
    return ("kthreadd (PID 2)", found) if found is not None else None


def _effective_capabilities(proc: Path) -> int | None:
    try:
        status = (proc / "self" / "status").read_text()
    except OSError:
        return None
    match = re.search(r"^CapEff:\s*([0-9a-fA-F]+)$", status, re.MULTILINE)
    return int(match.group(1), 16) if match else None


def _root_is_a_slave(mountinfo: str) -> bool:
    """Whether `/` of this mount namespace is a slave mount (mountinfo's optional field master:N):
    it receives mounts from another namespace and propagates none back. That is what systemd makes
    of / for a unit with any file-system sandboxing (ProtectSystem=, PrivateTmp=, PrivateMounts=,
    ReadWritePaths=, ProtectProc=, ...)."""
    slave = False
    for line in mountinfo.splitlines():
        fields = line.split(" ")
        try:
            separator = fields.index("-", 6)
        except ValueError:
            continue
        if fields[4] == "/":  # the last mount of / listed is the one on top
            slave = any(tag.startswith("master:") for tag in fields[6:separator])
    return slave


def restore_obstacles(proc: Path = PROC, mountinfo: Path = MOUNTINFO) -> list[str]:
    """Why this process demonstrably cannot release or attach volumes: what it mounts would not be
    the host's, or it cannot see which processes hold a filesystem. [] when nothing demonstrably
    stands in the way (a root agent outside systemd, or under the restore drop-in).

    Only what is shown is reported: a reference namespace that cannot be inspected is not taken
    for a different one.
    """
    obstacles: list[str] = []
    if not (proc / "1").exists():
        obstacles.append(
            "PID 1 is not visible in /proc: other processes are hidden from the agent"
            " (ProtectProc=invisible, or /proc mounted with hidepid=), so it cannot tell which of"
            " them hold a filesystem"
        )
    capabilities = _effective_capabilities(proc)
    if capabilities is not None and not capabilities >> CAP_SYS_PTRACE & 1:
        obstacles.append(
            f"the agent (uid {os.geteuid()}) runs without CAP_SYS_PTRACE, so the files that other"
            " users' processes (Cassandra's) hold are hidden from it"
        )
    reference = _reference_namespace(proc)
    own = _mount_namespace(proc / "self")
    if reference is not None and own is not None:
        if own != reference[1]:
            obstacles.append(
                f"the agent runs in a mount namespace of its own (not the one of {reference[0]}):"
                " what it unmounts and mounts would not change the host's mounts, which Cassandra"
                " uses"
            )
    else:
        try:
            slave = _root_is_a_slave(mountinfo.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            slave = False
        if slave:
            obstacles.append(
                "the agent runs in a mount namespace of its own (its / is a slave mount, as"
                " systemd's file-system sandboxing makes it): what it unmounts and mounts would"
                " not change the host's mounts, which Cassandra uses"
            )
    return obstacles


class Host:
    """The real host. Tests replace methods (or the whole object) with fakes."""

    def __init__(self, by_id_dir: Path = volumes.BY_ID_DIR) -> None:
        #: Where udev-style by-id links name devices (`[volumes] by_id_dir`).
        self.by_id_dir = by_id_dir

    def restore_obstacles(self) -> list[str]:
        return restore_obstacles()

    def entries(self) -> list[Mount]:
        return read()

    def holders_of_device(self, device_number: int) -> tuple[list[Holder], list[int]]:
        return holders_of_device(device_number)

    def holders_under(self, directory: str) -> tuple[list[Holder], list[int]]:
        return holders_under(directory)

    def device_of(self, path: str) -> int:
        """The device number of the filesystem that holds `path`."""
        return os.stat(path).st_dev

    def is_directory(self, path: str) -> bool:
        return os.path.isdir(path)

    def block_device_number(self, path: str) -> int | None:
        return block_device_number(path)

    def busy_reason(self, device: str) -> str:
        return busy_reason(device)

    def identity(self, major: int, minor: int) -> volumes.DeviceIdentity:
        return volumes.device_identity(major, minor, by_id_dir=self.by_id_dir)

    async def fs_uuid(self, device: str) -> str:
        return await fs_uuid(device)

    async def mount(
        self, device: str, mount_point: str, fs_type: str, options: Sequence[str]
    ) -> None:
        argv = [MOUNT, "-t", fs_type]
        if options:
            argv += ["-o", ",".join(options)]
        await process.run([*argv, device, mount_point], timeout=MOUNT_TIMEOUT_SECONDS)

    async def umount(self, mount_point: str) -> None:
        # Never lazily (-l): a busy filesystem must stay mounted and the release fail.
        await process.run([UMOUNT, mount_point], timeout=MOUNT_TIMEOUT_SECONDS)
