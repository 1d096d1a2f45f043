"""The node's part of a restore: let go of its Cassandra volumes, take them back, discard replay state.

The coordinator stops Cassandra, then asks the agent to *release* the volumes (unmount, detach
hook), has the array revert or clone them, asks the agent to *attach* them (attach hook, mount,
identity check) and to *discard* the replay state that lives outside the restored volumes, then
checks the manifest and starts Cassandra. For a backup of native snapshots (direct-attached storage)
nothing is released or attached: *restore_snapshot* puts the tables back to the snapshot in place
(`ringsnap.agent.snapshot_restore`), then discard runs as after an attach.

Rules:
- nothing here runs while Cassandra answers; a filesystem a process holds is never unmounted (never
  lazily either), and an unmount counts only once the kernel no longer holds the block device;
- `/`, the filesystem of the agent's state and the one of its own program are never released;
- nothing is released, attached or discarded by an agent that demonstrably could not do it right:
  one in a mount namespace of its own (what it mounts would not be the host's) or one that cannot
  see which processes hold a filesystem (see `mounts.restore_obstacles`; under systemd the restore
  drop-in, systemd/ringsnap-agent.service.d/restore.conf, is what makes restores possible);
- every released volume is recorded (fsynced, mode 0600) in
  `<[volumes] state_directory>/restores/<operation>.json` BEFORE it is unmounted; the record is
  what attach trusts (possibly after a reboot), and it stays as the audit trail. Records an older
  agent left in `<[freeze] state_directory>/restores/` are read too, never moved;
- attach mounts only what the same operation released, and keeps it mounted only if its filesystem
  UUID is the recorded one (a revert and a clone both keep it); a device the attach hook attached
  that fails the check is handed to the detach hook before the call fails;
- discard empties, never removes, the replay-state directories that are not on a filesystem the
  operation released and attached again (after a snapshot restore: all of them, the commit log
  first of all, since it holds writes newer than the snapshot), and logs each at warning level;
- the hooks are argv lists from the agent's configuration, run without a shell; what they need to
  know arrives in RINGSNAP_* environment variables.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import stat
import sys
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from ringsnap import logs
from ringsnap.agent import process, volumes
from ringsnap.agent.config import VolumesSection
from ringsnap.agent.durable import write_durably
from ringsnap.agent.errors import CommandFailed, CommandTimeout, Conflict
from ringsnap.agent.freezestate import valid_operation_id
from ringsnap.agent.mounts import RESTORE_DROP_IN, Host, describe_holders
from ringsnap.agent.snapshot_restore import DONE as SNAPSHOT_DONE
from ringsnap.agent.snapshot_restore import RestoredTable, SnapshotRestorer
from ringsnap.errors import ValidationError
from ringsnap.mountinfo import Mount
from ringsnap.names import snapshot_tag

log = logs.get_logger(__name__)

#: Kinds of configured Cassandra directory, in the order they are reported.
KINDS = ("data", "commitlog", "saved_caches", "hints", "cdc_raw")
#: What Cassandra replays or reloads at start, besides its data: discarded outside restored volumes.
REPLAY_KINDS = ("commitlog", "cdc_raw", "saved_caches", "hints")
RELEASED = "released"
ATTACHED = "attached"
RECORDS_DIRECTORY = "restores"
#: Under the records directory: what each native snapshot restore did (`snapshot_restore`).
SNAPSHOT_RECORDS = "snapshots"
_VOLUME_NAME = re.compile(r"[A-Za-z0-9_.:/-]{1,255}")
_ENV_PREFIX = "RINGSNAP_"
_T = TypeVar("_T")


# -- values -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CassandraStatus:
    running: bool
    #: How that was determined, or why Cassandra is taken as not running.
    detail: str


@dataclass(frozen=True, slots=True)
class VolumeFacts:
    """A filesystem of the node's Cassandra directories: mounted, or released by a restore."""

    mount_point: str
    device: str
    fs_type: str
    fs_uuid: str
    kinds: tuple[str, ...]
    serial: str = ""
    wwn: str = ""
    loop_backing_file: str = ""
    mounted: bool = True
    #: The operation that released it and has not attached it again; "" when mounted normally.
    released_by: str = ""


@dataclass(frozen=True, slots=True)
class VolumeState:
    cassandra: CassandraStatus
    volumes: tuple[VolumeFacts, ...]


@dataclass(frozen=True, slots=True)
class DiscardedDirectory:
    path: str
    kind: str
    files: int
    bytes: int


@dataclass(frozen=True, slots=True)
class ReleasedVolume:
    """One volume of a restore record: what was mounted where, as it was before the release."""

    mount_point: str
    device: str
    major: int
    minor: int
    fs_type: str
    fs_uuid: str
    #: Per-mount options, given back to mount(8) on attach.
    options: tuple[str, ...]
    #: The filesystem's own options as they were (for people; not replayed).
    super_options: tuple[str, ...]
    kinds: tuple[str, ...]
    cassandra_directories: tuple[str, ...]
    serial: str = ""
    wwn: str = ""
    loop_backing_file: str = ""
    #: RELEASED (unmounted, or being unmounted) or ATTACHED (mounted again and checked).
    state: str = RELEASED
    #: Whether the detach hook ran (or none is configured) after the unmount.
    detached: bool = False
    released_at: str = ""
    attached_at: str = ""
    attached_device: str = ""
    volume_name: str = ""

    @property
    def device_number(self) -> int:
        return os.makedev(self.major, self.minor)

    def facts(self, operation_id: str) -> VolumeFacts:
        attached = self.state == ATTACHED
        return VolumeFacts(
            mount_point=self.mount_point,
            device=(self.attached_device or self.device) if attached else self.device,
            fs_type=self.fs_type,
            fs_uuid=self.fs_uuid,
            kinds=self.kinds,
            serial=self.serial,
            wwn=self.wwn,
            loop_backing_file=self.loop_backing_file,
            mounted=attached,
            released_by="" if attached else operation_id,
        )


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _ordered(kinds: Iterable[str]) -> tuple[str, ...]:
    found = set(kinds)
    return tuple(kind for kind in KINDS if kind in found) + tuple(sorted(found - set(KINDS)))


# -- validation ---------------------------------------------------------------------------------


def check_operation_id(value: str) -> str:
    if not valid_operation_id(value):
        raise ValidationError(
            f"invalid operation id {value!r}: use 1-128 letters, digits, '.', '-' or '_',"
            " starting with a letter or digit"
        )
    return value


def check_mount_point(value: str) -> str:
    if not value or "\x00" in value or not value.startswith("/"):
        raise ValidationError(f"mount point {value!r} must be an absolute path")
    if ".." in value.split("/"):
        raise ValidationError(f"mount point {value!r} must not contain '..'")
    return os.path.normpath(value)


def check_volume_name(value: str) -> str:
    """An array volume name, passed to the attach hook in RINGSNAP_VOLUME: nothing a shell, a path
    or an option parser could take for anything but a name."""
    if not _VOLUME_NAME.fullmatch(value) or ".." in value or value.startswith("-"):
        raise ValidationError(
            f"invalid volume name {value!r}: use 1-255 letters, digits, '_', '.', ':', '/' or"
            " '-', not starting with '-' and without '..'"
        )
    return value


# -- records ------------------------------------------------------------------------------------


class RestoreRecords:
    """`<directory>/<operation>.json`: the volumes each restore operation released.

    Records are written to `directory` only. Each directory of `fallbacks` (where an older agent
    kept them) is read too: a record there counts unless `directory` has one for the same
    operation, which then shadows it. Nothing is moved.
    """

    def __init__(self, directory: Path, fallbacks: Sequence[Path] = ()) -> None:
        self.directory = directory
        self.fallbacks = tuple(dict.fromkeys(path for path in fallbacks if path != directory))

    def path(self, operation_id: str) -> Path:
        """Where the operation's record is written."""
        return self.directory / f"{check_operation_id(operation_id)}.json"

    def location(self, operation_id: str) -> Path:
        """Where the operation's record is read from: the first directory that has one."""
        name = f"{check_operation_id(operation_id)}.json"
        for directory in (self.directory, *self.fallbacks):
            if os.path.lexists(directory / name):
                return directory / name
        return self.directory / name

    def load(self, operation_id: str) -> list[ReleasedVolume]:
        """The operation's volumes ([] if it has no record); an unreadable record is a Conflict."""
        path = self.location(operation_id)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise Conflict(f"restore record {path} cannot be read: {exc.strerror}") from None
        try:
            return _decode(data)
        except (ValueError, KeyError, TypeError) as exc:
            raise Conflict(
                f"restore record {path} is unreadable ({exc}); inspect it, put the volumes it"
                " names back by hand, then remove it"
            ) from None

    def all(self) -> tuple[dict[str, list[ReleasedVolume]], list[str]]:
        """Every record by operation id, and a problem per record that could not be read."""
        found: dict[str, list[ReleasedVolume]] = {}
        problems: list[str] = []
        seen: set[str] = set()
        for directory in (self.directory, *self.fallbacks):
            try:
                names = sorted(os.listdir(directory))
            except FileNotFoundError:
                continue
            except OSError as exc:
                problems.append(f"restore records in {directory} cannot be listed: {exc.strerror}")
                continue
            for name in names:
                operation_id = name.removesuffix(".json")
                if name.startswith(".") or not name.endswith(".json") or operation_id in seen:
                    continue
                if not valid_operation_id(operation_id):
                    problems.append(f"restore record {directory / name} has an unsafe name")
                    continue
                seen.add(operation_id)
                try:
                    found[operation_id] = self.load(operation_id)
                except Conflict as exc:
                    problems.append(str(exc))
        return found, problems

    def remove(self, operation_id: str) -> None:
        """Remove the operation's record where it is written (fallback directories are left)."""
        self.path(operation_id).unlink(missing_ok=True)

    def save(self, operation_id: str, released: Sequence[ReleasedVolume]) -> None:
        """Write the record atomically and durably (file and directory fsynced), mode 0600."""
        payload = json.dumps(
            {"operation_id": operation_id, "volumes": [asdict(volume) for volume in released]},
            indent=1,
        ).encode()
        write_durably(self.path(operation_id), payload)


_TUPLE_FIELDS = {"options", "super_options", "kinds", "cassandra_directories"}


def _decode(data: bytes) -> list[ReleasedVolume]:
    document = json.loads(data)
    if not isinstance(document, dict) or not isinstance(document.get("volumes"), list):
        raise ValueError("not a restore record (no list of volumes)")
    known = {field.name: field for field in fields(ReleasedVolume)}
    released: list[ReleasedVolume] = []
    for item in document["volumes"]:
        if not isinstance(item, dict):
            raise TypeError("a volume entry is not an object")
        values: dict[str, Any] = {}
        for name, value in item.items():
            if name not in known:
                continue  # written by a newer agent: ignored
            if name in _TUPLE_FIELDS:
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise TypeError(f"{name} is not a list of strings")
                values[name] = tuple(value)
                continue
            if name in ("major", "minor"):
                if not isinstance(value, int) or isinstance(value, bool):
                    raise TypeError(f"{name} is not an integer")
            elif name == "detached":
                if not isinstance(value, bool):
                    raise TypeError("detached is not a boolean")
            elif not isinstance(value, str):
                raise TypeError(f"{name} is not a string")
            values[name] = value
        volume = ReleasedVolume(**values)
        if volume.state not in (RELEASED, ATTACHED):
            raise ValueError(f"unknown state {volume.state!r}")
        released.append(volume)
    return released


# -- emptying a directory ---------------------------------------------------------------------------


def empty_directory(path: str) -> tuple[int, int]:
    """Delete everything below `path` (not `path` itself); returns (files, bytes) deleted.

    Works on directory file descriptors: symbolic links are deleted, never followed, and nothing on
    another filesystem (something mounted inside) is touched.
    """
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    root = os.open(path, flags)
    try:
        device = os.fstat(root).st_dev
        return _empty(root, device, path)
    finally:
        os.close(root)


def _empty(directory: int, device: int, shown: str) -> tuple[int, int]:
    files = size = 0
    with os.scandir(directory) as entries:
        names = [entry.name for entry in entries]
    for name in names:
        info = os.stat(name, dir_fd=directory, follow_symlinks=False)
        if stat.S_ISDIR(info.st_mode):
            if info.st_dev != device:
                log.warning(
                    "not emptied: another filesystem is mounted here", path=f"{shown}/{name}"
                )
                continue
            child = os.open(
                name,
                os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                dir_fd=directory,
            )
            try:
                child_files, child_size = _empty(child, device, f"{shown}/{name}")
            finally:
                os.close(child)
            files, size = files + child_files, size + child_size
            os.rmdir(name, dir_fd=directory)
        else:
            os.unlink(name, dir_fd=directory)
            files += 1
            size += info.st_size if stat.S_ISREG(info.st_mode) else 0
    return files, size


# -- the restorer -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Release:
    """One mount point of a release request, and what is left to do for it."""

    mount_point: str
    #: "new": mounted, not recorded yet; "resume": recorded and still mounted (an earlier attempt
    #: stopped before the unmount); "finish": unmounted, the detach hook has not run; "done".
    step: str
    filesystem: volumes.NodeFilesystem | None = None
    entry: Mount | None = None
    recorded: ReleasedVolume | None = None


class VolumeRestorer:
    """Release, attach and discard for one node; one call at a time."""

    def __init__(
        self,
        *,
        directories: Mapping[str, Sequence[Path]],
        state_directory: Path,
        settings: VolumesSection,
        cassandra: Callable[[], Awaitable[CassandraStatus]],
        frozen: Callable[[], Iterable[str]] = tuple,
        host: Host | None = None,
        records_directory: Path | None = None,
    ) -> None:
        """`state_directory` is the freeze state's; the records go to `records_directory`
        (default: `<state_directory>/restores`, where they used to be, and which is read too)."""
        self.directories = {kind: list(paths) for kind, paths in directories.items() if paths}
        self.state_directory = state_directory
        legacy = state_directory / RECORDS_DIRECTORY
        self.records = RestoreRecords(records_directory or legacy, fallbacks=(legacy,))
        self.settings = settings
        self._cassandra = cassandra
        self._frozen = frozen
        self.host = host or Host()
        self._lock = asyncio.Lock()
        #: Native snapshot restores, recorded beside the volume records (in a directory of their
        #: own, which `RestoreRecords.all` does not read).
        self.snapshots = SnapshotRestorer(
            self.directories.get("data", []), self.records.directory / SNAPSHOT_RECORDS
        )

    # -- what is where ------------------------------------------------------------------------

    def _protected_paths(self) -> list[tuple[str, str]]:
        """Paths whose filesystems are never released, with the reason; "/" first."""
        state, records = self.state_directory, self.records.directory
        return [
            ("/", "it holds /"),
            (str(_existing(state)), f"it holds the agent's state ({state})"),
            (str(_existing(records)), f"it holds the agent's restore records ({records})"),
            (sys.prefix, f"it holds the agent's own program ({sys.prefix})"),
            (os.path.dirname(volumes.__file__), "it holds the agent's own program"),
        ]

    def records_on_cassandra_filesystem(self) -> str:
        """Why the restore records' place is wrong ("" if it is not): it is on a filesystem of
        the Cassandra directories, which the agent then never releases (`ringsnap-agent check`)."""
        directory = self.records.directory
        device = self.host.device_of(str(_existing(directory)))
        for filesystem in self._filesystems(self.host.entries(), {}):
            if filesystem.device_number == device and filesystem.mount_point != "/":
                return (
                    f"the restore records directory {directory} is on {filesystem.mount_point},"
                    f" which holds Cassandra {', '.join(_ordered(filesystem.kinds))}: the agent"
                    " never releases it; set [volumes] state_directory elsewhere"
                )
        return ""

    def _protected_devices(self) -> dict[int, str]:
        reasons: dict[int, list[str]] = {}
        for path, why in self._protected_paths():
            found = reasons.setdefault(self.host.device_of(path), [])
            if why not in found:
                found.append(why)
        return {device: " and ".join(why) for device, why in reasons.items()}

    def _filesystems(
        self, entries: Sequence[Mount], pending: Mapping[str, tuple[str, ReleasedVolume]]
    ) -> list[volumes.NodeFilesystem]:
        """The filesystems of the configured directories as mounted now. Directories of a released
        volume that is not mounted are left out: they would resolve to the filesystem below."""
        mounted = {entry.mount_point for entry in entries}
        away = [volume for point, (_, volume) in pending.items() if point not in mounted]
        chosen: dict[str, list[Path]] = {}
        for kind, paths in self.directories.items():
            for path in paths:
                if not any(_covers(volume, path) for volume in away):
                    chosen.setdefault(kind, []).append(path)
        if not chosen:
            return []
        return volumes.discover(chosen, mounts=list(entries), identities=False)

    def _read(
        self, *, strict: bool
    ) -> tuple[list[Mount], dict[str, list[ReleasedVolume]], list[str]]:
        entries = self.host.entries()
        records, problems = self.records.all()
        for problem in problems:
            log.error("restore record unreadable", problem=problem)
        if strict and problems:
            raise Conflict("; ".join(problems))
        return entries, records, problems

    def _refuse_without_host_access(self, action: str) -> None:
        """Refuse, before anything else, when this process demonstrably cannot do restores right."""
        obstacles = self.host.restore_obstacles()
        if obstacles:
            raise Conflict(
                f"this agent cannot {action}: {'; '.join(obstacles)}. Under systemd, restores need"
                f" the restore drop-in: install ringsnap's"
                f" systemd/ringsnap-agent.service.d/restore.conf as {RESTORE_DROP_IN}, then"
                " `systemctl daemon-reload && systemctl restart ringsnap-agent`"
            )

    async def _refuse_while_running(self, action: str) -> None:
        status = await self._cassandra()
        if status.running:
            raise Conflict(
                f"Cassandra is running on this node ({status.detail}); stop it first"
                f" (StopCassandra), then {action}"
            )

    # -- state ----------------------------------------------------------------------------------

    async def state(self) -> VolumeState:
        cassandra = await self._cassandra()
        entries, records, _ = await asyncio.to_thread(self._read, strict=False)
        pending = _pending(records)
        filesystems = await asyncio.to_thread(self._filesystems, entries, pending)
        mounted = {entry.mount_point for entry in entries}
        found: list[VolumeFacts] = []
        for filesystem in filesystems:
            identity = await asyncio.to_thread(
                self.host.identity, filesystem.major, filesystem.minor
            )
            uuid = ""
            if self.host.block_device_number(filesystem.device) is not None:
                uuid = await self.host.fs_uuid(filesystem.device)
            releasing = pending.get(filesystem.mount_point)
            found.append(
                VolumeFacts(
                    mount_point=filesystem.mount_point,
                    device=filesystem.device,
                    fs_type=filesystem.fs_type,
                    fs_uuid=uuid,
                    kinds=_ordered(filesystem.kinds),
                    serial=identity.serial,
                    wwn=identity.wwn,
                    loop_backing_file=identity.loop_backing_file,
                    mounted=True,
                    released_by=releasing[0] if releasing else "",
                )
            )
        for point, (operation_id, volume) in sorted(pending.items()):
            if point not in mounted:
                found.append(volume.facts(operation_id))
        return VolumeState(cassandra, tuple(found))

    # -- release --------------------------------------------------------------------------------

    async def release(
        self, operation_id: str, mount_points: Sequence[str] = ()
    ) -> tuple[VolumeFacts, ...]:
        check_operation_id(operation_id)
        requested = list(dict.fromkeys(check_mount_point(point) for point in mount_points))
        action = f"release {', '.join(requested) or 'the Cassandra volumes'}"
        self._refuse_without_host_access(action)
        async with self._lock:
            await self._refuse_while_running(action)
            entries, records, _ = await asyncio.to_thread(self._read, strict=True)
            plan = await asyncio.to_thread(
                self._release_plan, operation_id, requested, entries, records
            )
            uuids: dict[str, str] = {}
            for item in plan:
                if item.step == "new":
                    assert item.filesystem is not None
                    uuid = await self.host.fs_uuid(item.filesystem.device)
                    if not uuid:
                        raise Conflict(
                            f"the filesystem at {item.mount_point} ({item.filesystem.device}) has"
                            " no UUID, so a restored volume could not be recognised; refusing to"
                            " release it"
                        )
                    uuids[item.mount_point] = uuid
            mine = {volume.mount_point: volume for volume in records.get(operation_id, [])}
            done: dict[str, ReleasedVolume] = {}
            for item in plan:
                done[item.mount_point] = await self._release_one(
                    operation_id, item, mine, uuids.get(item.mount_point, "")
                )
            return tuple(done[item.mount_point].facts(operation_id) for item in plan)

    def _release_plan(
        self,
        operation_id: str,
        requested: list[str],
        entries: list[Mount],
        records: Mapping[str, list[ReleasedVolume]],
    ) -> list[_Release]:
        pending = _pending(records)
        mine = {volume.mount_point: volume for volume in records.get(operation_id, [])}
        on_top = _on_top(entries)
        filesystems = self._filesystems(entries, pending)
        protected = self._protected_devices()
        by_name = {name: fs for fs in filesystems for name in (fs.mount_point, *fs.aliases)}

        def protection(filesystem: volumes.NodeFilesystem) -> str:
            if filesystem.mount_point == "/":
                return "it is /"
            return protected.get(filesystem.device_number, "")

        if not requested:
            for filesystem in filesystems:
                why = protection(filesystem)
                if not why:
                    requested.append(filesystem.mount_point)
                elif "data" in filesystem.kinds:
                    # The node's layout, not the request, is at fault: FAILED_PRECONDITION.
                    raise Conflict(
                        f"Cassandra data ({', '.join(filesystem.cassandra_directories)}) is on"
                        f" {filesystem.mount_point}, which the agent never releases ({why}); data"
                        " comes back only with its own volume: move it to its own filesystem"
                    )
                else:
                    log.info(
                        "not released: holds only replay state (DiscardReplayState handles it)",
                        mount_point=filesystem.mount_point,
                        reason=why,
                    )
            requested += [
                point
                for point, volume in mine.items()
                if volume.state == RELEASED and point not in requested
            ]
            if not requested:
                raise Conflict("no Cassandra filesystem of this node can be released")

        plan: list[_Release] = []
        for point in requested:
            if point == "/":
                raise ValidationError(
                    "refusing to release mount point '/': the agent never unmounts /"
                )
            recorded = mine.get(point)
            entry = on_top.get(point)
            if recorded is not None and recorded.state == RELEASED:
                if entry is None:
                    step = "done" if recorded.detached else "finish"
                    plan.append(_Release(point, step, recorded=recorded))
                    continue
                if entry.device_number != recorded.device_number:
                    raise Conflict(
                        f"{point} was released by operation {operation_id!r}, but another"
                        f" filesystem is mounted there now ({entry.source}); unmount it first"
                    )
            other = pending.get(point)
            if other is not None and other[0] != operation_id:
                raise Conflict(
                    f"{point} was released by operation {other[0]!r} and not attached again;"
                    f" attach it under that operation first (or, once the volume is checked,"
                    f" remove {self.records.location(other[0])})"
                )
            match = by_name.get(point)
            if match is None:
                names = sorted(by_name) or ["none"]
                raise ValidationError(
                    f"{point} is not the mount point of a filesystem that holds a configured"
                    f" Cassandra directory (those are: {', '.join(names)})"
                )
            filesystem = match
            why = protection(filesystem)
            if why:
                raise ValidationError(f"refusing to release mount point {point}: {why}")
            if filesystem.mount_point != point or filesystem.aliases:
                names = [filesystem.mount_point, *filesystem.aliases]
                raise Conflict(
                    f"the filesystem of {point} is mounted at {', '.join(names)}; unmount the"
                    " other mounts (bind mounts) first"
                )
            assert entry is not None
            self._check_releasable(point, filesystem, entries)
            step = "resume" if recorded is not None and recorded.state == RELEASED else "new"
            plan.append(_Release(point, step, filesystem, entry, recorded))
        return plan

    def _check_releasable(
        self, point: str, filesystem: volumes.NodeFilesystem, entries: Sequence[Mount]
    ) -> None:
        if point in set(self._frozen()):
            raise Conflict(f"{point} is frozen by a backup; thaw it (or wait for its lease) first")
        elsewhere = sorted(
            entry.mount_point
            for entry in entries
            if entry.device_number == filesystem.device_number and entry.mount_point != point
        )
        if elsewhere:
            raise Conflict(
                f"the filesystem of {point} is also mounted at {', '.join(elsewhere)}; unmount"
                " it there first"
            )
        nested = sorted(
            entry.mount_point for entry in entries if entry.mount_point.startswith(point + "/")
        )
        if nested:
            raise Conflict(f"{', '.join(nested)} is mounted inside {point}; unmount it first")
        if self.host.block_device_number(filesystem.device) != filesystem.device_number:
            raise Conflict(
                f"{point} is not mounted from a block device ({filesystem.device}); only a"
                " filesystem on an array volume can be released"
            )
        holders, hidden = self.host.holders_of_device(filesystem.device_number)
        if holders:
            raise Conflict(
                f"{point} is busy: {describe_holders(holders)}; stop these processes (or have them"
                f" let go of {point}) and release again"
            )
        if hidden:
            log.warning(
                "processes that could not be inspected for files open on a filesystem to release",
                mount_point=point,
                pids=hidden[:20],
            )

    async def _release_one(
        self,
        operation_id: str,
        item: _Release,
        mine: dict[str, ReleasedVolume],
        uuid: str,
    ) -> ReleasedVolume:
        point = item.mount_point
        if item.step == "done":
            assert item.recorded is not None
            log.info("already released", operation_id=operation_id, mount_point=point)
            return item.recorded
        if item.step in ("new", "resume"):
            assert item.filesystem is not None and item.entry is not None
            filesystem, entry = item.filesystem, item.entry
            if item.step == "new":
                identity = await asyncio.to_thread(
                    self.host.identity, filesystem.major, filesystem.minor
                )
                volume = ReleasedVolume(
                    mount_point=point,
                    device=filesystem.device,
                    major=filesystem.major,
                    minor=filesystem.minor,
                    fs_type=filesystem.fs_type,
                    fs_uuid=uuid,
                    options=entry.options,
                    super_options=entry.super_options,
                    kinds=_ordered(filesystem.kinds),
                    cassandra_directories=filesystem.cassandra_directories,
                    serial=identity.serial,
                    wwn=identity.wwn,
                    loop_backing_file=identity.loop_backing_file,
                    released_at=_now(),
                )
                mine[point] = volume
                # Durable before the unmount: whatever happens next, attach knows what was here.
                await asyncio.to_thread(self.records.save, operation_id, list(mine.values()))
            else:
                assert item.recorded is not None
                volume = item.recorded
            log.warning(
                "unmounting for a restore",
                operation_id=operation_id,
                mount_point=point,
                device=volume.device,
                fs_uuid=volume.fs_uuid,
            )
            try:
                await self.host.umount(point)
            except (CommandFailed, CommandTimeout):
                still = _on_top(await asyncio.to_thread(self.host.entries)).get(point)
                if still is not None and still.device_number == volume.device_number:
                    # Nothing was released: the record must not say otherwise.
                    mine.pop(point, None)
                    await asyncio.to_thread(self._save_or_remove, operation_id, mine)
                raise
        else:
            assert item.recorded is not None
            volume = item.recorded
        if self.host.block_device_number(volume.device) == volume.device_number:
            busy = await asyncio.to_thread(self.host.busy_reason, volume.device)
            if busy:
                raise Conflict(
                    f"{point} is unmounted here, but {busy}; the array must not revert or clone"
                    " it yet: let go of it there, then release again"
                )
        if self.settings.detach_command:
            await self._hook("detach_command", self.settings.detach_command, operation_id, volume)
        volume = replace(volume, detached=True)
        mine[point] = volume
        await asyncio.to_thread(self.records.save, operation_id, list(mine.values()))
        log.warning(
            "released for a restore",
            operation_id=operation_id,
            mount_point=point,
            device=volume.device,
            fs_uuid=volume.fs_uuid,
        )
        return volume

    def _save_or_remove(self, operation_id: str, mine: Mapping[str, ReleasedVolume]) -> None:
        if mine:
            self.records.save(operation_id, list(mine.values()))
        else:
            self.records.remove(operation_id)

    # -- attach ---------------------------------------------------------------------------------

    async def attach(
        self, operation_id: str, requested: Sequence[tuple[str, str]]
    ) -> tuple[VolumeFacts, ...]:
        check_operation_id(operation_id)
        if not requested:
            raise ValidationError("name the volumes to attach: (mount point, volume name) pairs")
        wanted: dict[str, str] = {}
        for point, name in requested:
            normal = check_mount_point(point)
            check_volume_name(name)
            if normal in wanted:
                raise ValidationError(f"{normal} is named twice")
            wanted[normal] = name
        self._refuse_without_host_access(f"attach {', '.join(wanted)}")
        async with self._lock:
            await self._refuse_while_running(f"attach {', '.join(wanted)}")
            released = await asyncio.to_thread(self.records.load, operation_id)
            mine = {volume.mount_point: volume for volume in released}
            for point in wanted:
                if point not in mine:
                    raise Conflict(
                        f"{point} was not released by operation {operation_id!r} on this node"
                        f" (it released: {', '.join(mine) or 'nothing'}); only what an operation"
                        " released can be attached under it"
                    )
            results: list[VolumeFacts] = []
            for point, name in wanted.items():
                volume = await self._attach_one(operation_id, mine[point], name)
                mine[point] = volume
                await asyncio.to_thread(self.records.save, operation_id, list(mine.values()))
                results.append(volume.facts(operation_id))
            return tuple(results)

    async def _attach_one(
        self, operation_id: str, volume: ReleasedVolume, volume_name: str
    ) -> ReleasedVolume:
        point = volume.mount_point
        current = _on_top(await asyncio.to_thread(self.host.entries)).get(point)
        if current is not None:
            uuid = await self._uuid_of(current.source)
            if uuid != volume.fs_uuid:
                raise Conflict(
                    f"another filesystem is mounted at {point} ({current.source}, UUID"
                    f" {uuid or 'none'}), not the one released (UUID {volume.fs_uuid});"
                    " unmount it first"
                )
            log.info("already attached", operation_id=operation_id, mount_point=point)
            return replace(
                volume,
                state=ATTACHED,
                attached_device=current.source,
                attached_at=volume.attached_at or _now(),
                volume_name=volume.volume_name or volume_name,
            )
        device = volume.device
        from_hook = hooked = False
        if self.settings.attach_command:
            result = await self._hook(
                "attach_command", self.settings.attach_command, operation_id, volume, volume_name
            )
            hooked = True
            lines = result.stdout.rstrip().splitlines()
            named = lines[-1].strip() if lines else ""
            if named:
                if not named.startswith("/") or "\x00" in named:
                    raise CommandFailed(
                        f"[volumes] attach_command printed {named[:200]!r} as the device to mount;"
                        " its last line must be the device's absolute path (or nothing)"
                    )
                device, from_hook = os.path.normpath(named), True
        number = self.host.block_device_number(device)
        if number is None:
            if from_hook:
                raise CommandFailed(
                    f"[volumes] attach_command named {device} as the device to mount for {point},"
                    " but it is not a block device"
                )
            raise Conflict(
                f"the recorded device {device} of {point} is not there; attach the volume"
                " ([volumes] attach_command does it when configured) and retry"
            )
        busy = await asyncio.to_thread(self.host.busy_reason, device)
        if busy:
            raise Conflict(f"{device} cannot be mounted at {point}: {busy}")
        uuid = await self._uuid_of(device)
        if uuid != volume.fs_uuid:
            message = (
                f"{device} holds filesystem UUID {uuid or 'none'}, but {point} held"
                f" {volume.fs_uuid} when operation {operation_id!r} released it: not the restored"
                f" volume (attached {volume_name}); nothing was mounted"
            )
            if hooked:
                message += await self._detach_refused(operation_id, volume, device, volume_name)
            raise Conflict(message)
        if not await asyncio.to_thread(self.host.is_directory, point):
            raise Conflict(f"the mount point {point} is not a directory any more; create it first")
        log.warning(
            "mounting for a restore",
            operation_id=operation_id,
            mount_point=point,
            device=device,
            volume=volume_name,
        )
        await self.host.mount(device, point, volume.fs_type, volume.options)
        mounted = _on_top(await asyncio.to_thread(self.host.entries)).get(point)
        mounted_uuid = await self._uuid_of(mounted.source) if mounted is not None else ""
        if mounted is None or mounted.device_number != number or mounted_uuid != volume.fs_uuid:
            if mounted is not None:
                await self.host.umount(point)
            message = (
                f"what got mounted at {point} ({mounted.source if mounted else 'nothing'}, UUID"
                f" {mounted_uuid or 'none'}) is not the released filesystem (UUID"
                f" {volume.fs_uuid}); it was unmounted again"
            )
            if hooked:
                message += await self._detach_refused(operation_id, volume, device, volume_name)
            raise Conflict(message)
        log.warning(
            "attached after a restore",
            operation_id=operation_id,
            mount_point=point,
            device=device,
            volume=volume_name,
            fs_uuid=volume.fs_uuid,
        )
        return replace(
            volume,
            state=ATTACHED,
            attached_device=device,
            attached_at=_now(),
            volume_name=volume_name,
        )

    async def _detach_refused(
        self, operation_id: str, volume: ReleasedVolume, device: str, volume_name: str
    ) -> str:
        """Hand a device the attach hook attached, and the UUID check refused, to the detach hook,
        so that nothing stays attached; returns what to add to the error message.

        The hook sees RINGSNAP_DEVICE = that device, RINGSNAP_SERIAL/WWN as its own identity
        (a clone's differ from the recorded ones) and RINGSNAP_VOLUME = the volume attached."""
        if not self.settings.detach_command:
            return (
                f"; [volumes] detach_command is not configured, so {device} stays attached:"
                " detach it by hand"
            )
        number = self.host.block_device_number(device)
        identity = (
            await asyncio.to_thread(self.host.identity, os.major(number), os.minor(number))
            if number is not None
            else volumes.DeviceIdentity()
        )
        attached = replace(volume, device=device, serial=identity.serial, wwn=identity.wwn)
        log.warning(
            "detaching a device the attach hook attached but the check refused",
            operation_id=operation_id,
            mount_point=volume.mount_point,
            device=device,
            volume=volume_name,
        )
        try:
            await self._hook(
                "detach_command", self.settings.detach_command, operation_id, attached, volume_name
            )
        except (CommandFailed, CommandTimeout) as exc:
            log.error(
                "the detach hook failed for a refused device",
                operation_id=operation_id,
                device=device,
                error=str(exc)[:500],
            )
            return f"; detaching {device} failed too ({exc}): detach it by hand"
        return f"; {device} was handed to [volumes] detach_command"

    async def _uuid_of(self, device: str) -> str:
        if self.host.block_device_number(device) is None:
            return ""
        return await self.host.fs_uuid(device)

    async def _hook(
        self,
        key: str,
        argv: Sequence[str],
        operation_id: str,
        volume: ReleasedVolume,
        volume_name: str | None = None,
    ) -> process.CommandResult:
        result = await process.run(
            argv,
            timeout=self.settings.hook_timeout_seconds,
            env=hook_environment(operation_id, volume, volume_name),
            display=f"[volumes] {key} ({shlex.join(argv)})",
        )
        log.info(
            "volume hook ran",
            hook=key,
            operation_id=operation_id,
            mount_point=volume.mount_point,
            seconds=round(result.seconds, 3),
        )
        return result

    # -- native snapshots -------------------------------------------------------------------------

    async def restore_snapshot(self, operation_id: str, tag: str) -> tuple[RestoredTable, ...]:
        """Put every table that has native snapshot `tag` back to it, in place (see
        `ringsnap.agent.snapshot_restore`); refused while Cassandra runs or anything holds a file
        under a data directory, or while a restore's released volumes are not attached again."""
        check_operation_id(operation_id)
        snapshot_tag(tag)
        action = f"restore snapshot {tag}"
        self._refuse_without_host_access(action)
        async with self._lock:
            await self._refuse_while_running(action)
            await asyncio.to_thread(self._check_snapshot_restorable, action)
            return await asyncio.to_thread(self.snapshots.restore, operation_id, tag)

    async def while_stopped(self, action: str, work: Callable[[], _T]) -> _T:
        """`work` in a thread under this restorer's lock, with `restore_snapshot`'s checks first
        (an install from S3, `ringsnap.agent.s3_restore`, replaces the live files the same way)."""
        self._refuse_without_host_access(action)
        async with self._lock:
            await self._refuse_while_running(action)
            await asyncio.to_thread(self._check_snapshot_restorable, action)
            return await asyncio.to_thread(work)

    def _check_snapshot_restorable(self, action: str) -> None:
        _, records, _ = self._read(strict=True)
        away = _pending(records)
        if away:
            operations = sorted({operation for operation, _ in away.values()})
            raise Conflict(
                f"{', '.join(sorted(away))} released by restore {', '.join(operations)} and not"
                f" attached again: the data directories are not all in place; finish that restore"
                f" first, then {action}"
            )
        for path in self.directories.get("data", []):
            holders, _ = self.host.holders_under(os.path.realpath(path))
            if holders:
                raise Conflict(
                    f"{path} is in use: {describe_holders(holders)}; stop these processes, then"
                    f" {action}"
                )

    # -- discard --------------------------------------------------------------------------------

    async def discard(self, operation_id: str, *, hints: bool) -> tuple[DiscardedDirectory, ...]:
        check_operation_id(operation_id)
        self._refuse_without_host_access("discard the replay state")
        async with self._lock:
            await self._refuse_while_running("discard the replay state")
            plan = await asyncio.to_thread(self._discard_plan, operation_id, hints)
            done: list[DiscardedDirectory] = []
            for shown, real, kind in plan:
                log.warning(
                    "discarding replay state outside the restored volumes",
                    operation_id=operation_id,
                    path=shown,
                    kind=kind,
                )
                files, size = await asyncio.to_thread(empty_directory, real)
                log.warning(
                    "discarded replay state",
                    operation_id=operation_id,
                    path=shown,
                    kind=kind,
                    files=files,
                    bytes=size,
                )
                done.append(DiscardedDirectory(shown, kind, files, size))
            return tuple(done)

    def _discard_plan(self, operation_id: str, hints: bool) -> list[tuple[str, str, str]]:
        entries, records, _ = self._read(strict=True)
        mine = records.get(operation_id, [])
        snapshot_phase = self.snapshots.phase(operation_id)
        if not mine and not snapshot_phase:
            raise Conflict(
                f"operation {operation_id!r} released no volume and restored no snapshot on this"
                " node; the replay state is discarded only for a restore whose volumes this agent"
                " released and attached, or whose snapshot it restored"
            )
        if snapshot_phase and snapshot_phase != SNAPSHOT_DONE:
            raise Conflict(
                f"operation {operation_id!r} has not finished restoring its snapshot on this node"
                f" (still {snapshot_phase}); RestoreSnapshot again first"
            )
        waiting = [volume.mount_point for volume in mine if volume.state != ATTACHED]
        if waiting:
            raise Conflict(
                f"{', '.join(waiting)} released by operation {operation_id!r} is not attached"
                " again; attach it first (the directories on it must be told apart from the rest)"
            )
        others = sorted(point for point, (op, _) in _pending(records).items() if op != operation_id)
        if others:
            raise Conflict(
                f"{', '.join(others)} is released by another operation and not attached again;"
                " the directories on it cannot be told apart from the rest"
            )
        on_top = _on_top(entries)
        kept: dict[int, str] = {}
        for volume in mine:
            entry = on_top.get(volume.mount_point)
            if entry is None:
                raise Conflict(
                    f"{volume.mount_point} was attached by operation {operation_id!r} but is not"
                    " mounted now; attach it again first"
                )
            kept[entry.device_number] = volume.mount_point
        mounts = list(entries)
        protected = [os.path.realpath(path) for path, _ in self._protected_paths()[1:]]
        plan: list[tuple[str, str, str]] = []
        for kind in REPLAY_KINDS:
            if kind == "hints" and not hints:
                continue
            for path in self.directories.get(kind, []):
                real = os.path.realpath(path)
                if not os.path.isdir(real):
                    log.info("replay-state directory not there", path=str(path), kind=kind)
                    continue
                mount = volumes.mount_of(real, mounts)
                restored = kept.get(os.makedev(mount.major, mount.minor))
                if restored is not None:
                    log.info(
                        "kept: it came back with the restored volume",
                        operation_id=operation_id,
                        path=str(path),
                        kind=kind,
                        mount_point=restored,
                    )
                    continue
                inside = [p for p in protected if p == real or p.startswith(real.rstrip("/") + "/")]
                if real == "/" or inside:
                    raise Conflict(
                        f"refusing to empty {path} ({kind}): it holds {', '.join(inside) or '/'}"
                    )
                holders, _ = self.host.holders_under(real)
                if holders:
                    raise Conflict(
                        f"{path} ({kind}) is in use: {describe_holders(holders)}; stop these"
                        " processes first"
                    )
                plan.append((str(path), real, kind))
        return plan


def hook_environment(
    operation_id: str, volume: ReleasedVolume, volume_name: str | None = None
) -> dict[str, str]:
    """The agent's environment without any RINGSNAP_* of its own, plus what the hook needs."""
    environment = {
        key: value for key, value in os.environ.items() if not key.startswith(_ENV_PREFIX)
    }
    environment.update(
        RINGSNAP_OPERATION=operation_id,
        RINGSNAP_MOUNT_POINT=volume.mount_point,
        RINGSNAP_DEVICE=volume.device,
        RINGSNAP_FS_UUID=volume.fs_uuid,
        RINGSNAP_KINDS=",".join(volume.kinds),
        RINGSNAP_SERIAL=volume.serial,
        RINGSNAP_WWN=volume.wwn,
    )
    if volume_name is not None:
        environment["RINGSNAP_VOLUME"] = volume_name
    return environment


def _existing(path: Path) -> Path:
    """`path`, or its nearest parent that exists (the filesystem it will be created on)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _pending(
    records: Mapping[str, Sequence[ReleasedVolume]],
) -> dict[str, tuple[str, ReleasedVolume]]:
    """{mount point: (operation, volume)} of every volume released and not attached again."""
    return {
        volume.mount_point: (operation_id, volume)
        for operation_id, released in sorted(records.items())
        for volume in released
        if volume.state == RELEASED
    }


def _on_top(entries: Sequence[Mount]) -> dict[str, Mount]:
    """The visible mount at each mount point (the last one listed is on top)."""
    return {entry.mount_point: entry for entry in entries}


def _covers(volume: ReleasedVolume, path: Path) -> bool:
    if str(path) in volume.cassandra_directories:
        return True
    point = volume.mount_point
    return any(
        candidate == point or candidate.startswith(point.rstrip("/") + "/")
        for candidate in (os.path.normpath(path), os.path.realpath(path))
    )
