"""Clones of backed-up volumes attached beside the live ones (drills, table restores, exports).

    mounter = CloneMounter(settings, state_directory)
    mounts = await mounter.mount("drill-1", volumes, read_only=False)
    ...
    await mounter.unmount("drill-1")

Each clone is attached by the configured `[volumes] attach_command` (the same hook a clone restore
uses: RINGSNAP_VOLUME, RINGSNAP_ARRAY, RINGSNAP_SERIAL, RINGSNAP_WWN in its environment; its last
stdout line is the device) or, without a hook, found by the identity the array gave when the
coordinator presented it to this host (`agent.discovery`: rescans until its by-id link appears),
then checked to hold the source volume's filesystem (its UUID, when the coordinator gives it), and
mounted at `<state>/clones/<purpose>/<role>[-n]`. A clone carries
the filesystem UUID of the live volume, possibly on the same host, so XFS is mounted with `nouuid`;
read-only mounts also skip log recovery (`norecovery` for XFS, `noload` for ext4) so that nothing
is written to the clone at all.

Safety: the record `<state>/clones/<purpose>.json` is written (fsynced) before each attach and
after each step, so that a restarted agent finds and tears down what a crash left; a purpose is
mounted once, with the same volumes (asking again returns the same mounts, other volumes are
refused); unmounting never is lazy: a busy clone stays mounted and the call fails naming why.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shlex
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ringsnap import logs
from ringsnap.agent import process
from ringsnap.agent.clone_options import mount_options
from ringsnap.agent.config import VolumesSection
from ringsnap.agent.device_removal import DeviceRemoval
from ringsnap.agent.discovery import Rescan, SysfsRescan, check_fs_uuid, wait_for_device
from ringsnap.agent.durable import write_durably
from ringsnap.agent.errors import CommandFailed, CommandTimeout, Conflict, NotFound
from ringsnap.agent.mounts import Host
from ringsnap.agent.restore.model import check_mount_point, check_volume_name
from ringsnap.errors import ValidationError

log = logs.get_logger(__name__)

CLONES_DIRECTORY = "clones"
ROLES = ("data", "commitlog")
_PURPOSE_ID = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
#: Array names, serials and WWNs reach the hook's environment: nothing but plain words.
_WORD = re.compile(r"[A-Za-z0-9_.:-]{0,255}")
_ENV_PREFIX = "RINGSNAP_"
_BLKID_TIMEOUT_SECONDS = 60.0
#: States of one clone in its record, in order.
ATTACHING = "attaching"
ATTACHED = "attached"
MOUNTED = "mounted"


def check_purpose_id(value: str, field: str = "run_id") -> str:
    """`value` if it is a valid run id of clones (a drill's, a table restore's, an export's);
    `field` names the request's field in the error."""
    if not _PURPOSE_ID.fullmatch(value):
        raise ValidationError(
            f"invalid run id {value!r} ({field}): use 1-63 lowercase letters, digits and '-',"
            " starting with a letter or digit"
        )
    return value


def _check_word(value: str, what: str) -> str:
    if not _WORD.fullmatch(value) or value.startswith("-"):
        raise ValidationError(
            f"invalid {what} {value!r}: use letters, digits, '_', '.', ':' or '-' only"
        )
    return value


@dataclass(frozen=True, slots=True)
class CloneVolume:
    """One clone to attach, as the coordinator names it."""

    role: str
    array: str
    volume: str
    serial: str = ""
    wwn: str = ""
    source_mount_point: str = ""
    #: The filesystem UUID of the volume it is a clone of ("": not checked).
    fs_uuid: str = ""

    def checked(self) -> CloneVolume:
        if self.role not in ROLES:
            raise ValidationError(
                f"clone {self.volume!r}: role {self.role!r} is not one of {', '.join(ROLES)}"
            )
        check_volume_name(self.volume)
        _check_word(self.array, "array name")
        _check_word(self.serial, "serial")
        _check_word(self.wwn, "WWN")
        _check_word(self.fs_uuid, "filesystem UUID")
        return replace(self, source_mount_point=check_mount_point(self.source_mount_point))


@dataclass(frozen=True, slots=True)
class MountedClone:
    """One clone of a purpose: what was asked, and how far attaching and mounting went."""

    role: str
    array: str
    volume: str
    serial: str
    wwn: str
    source_mount_point: str
    mount_point: str
    state: str = ATTACHING
    device: str = ""
    fs_type: str = ""
    options: tuple[str, ...] = ()
    expected_fs_uuid: str = ""

    @property
    def request(self) -> CloneVolume:
        return CloneVolume(
            self.role,
            self.array,
            self.volume,
            self.serial,
            self.wwn,
            self.source_mount_point,
            self.expected_fs_uuid,
        )


@dataclass(slots=True)
class CloneRecord:
    run_id: str
    read_only: bool
    clones: list[MountedClone] = field(default_factory=list)


class CloneRecords:
    """`<directory>/<purpose>.json`, one per purpose, written durably (0600)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, run_id: str) -> Path:
        return self.directory / f"{check_purpose_id(run_id)}.json"

    def load(self, run_id: str) -> CloneRecord | None:
        path = self.path(run_id)
        try:
            document = json.loads(path.read_bytes())
            clones = [
                MountedClone(**{**item, "options": tuple(item.get("options", ()))})
                for item in document["clones"]
            ]
            return CloneRecord(run_id, bool(document["read_only"]), clones)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise Conflict(
                f"clone record {path} is unreadable ({exc}); unmount and detach what it names by"
                " hand, then remove it"
            ) from None

    def save(self, record: CloneRecord) -> None:
        payload = {
            "run_id": record.run_id,
            "read_only": record.read_only,
            "clones": [asdict(clone) for clone in record.clones],
        }
        write_durably(self.path(record.run_id), json.dumps(payload, indent=1).encode())

    def remove(self, run_id: str) -> None:
        self.path(run_id).unlink(missing_ok=True)

    def purposes(self) -> list[str]:
        try:
            names = sorted(os.listdir(self.directory))
        except FileNotFoundError:
            return []
        return [
            name.removesuffix(".json")
            for name in names
            if name.endswith(".json") and _PURPOSE_ID.fullmatch(name.removesuffix(".json"))
        ]


def mount_points_for(base: Path, volumes: Sequence[CloneVolume]) -> list[str]:
    """`<base>/<role>`, then `<role>-2`, `<role>-3` for further volumes of the same role."""
    seen: dict[str, int] = {}
    points = []
    for volume in volumes:
        seen[volume.role] = seen.get(volume.role, 0) + 1
        suffix = "" if seen[volume.role] == 1 else f"-{seen[volume.role]}"
        points.append(str(base / f"{volume.role}{suffix}"))
    return points


#: A clone the kernel finds busy is tried again this many times in all, this far apart, before the
#: unmount is refused (never lazily): a reader that has just ended (an export's transfers winding
#: down after a cancel) may let go of it a moment later. Each retry is logged.
UNMOUNT_ATTEMPTS = 3
UNMOUNT_RETRY_SECONDS = 1.0


class CloneMounter:
    """MountClones and UnmountClones for one agent; one call at a time."""

    def __init__(
        self,
        settings: VolumesSection,
        state_directory: Path,
        *,
        host: Host | None = None,
        before_unmount: Callable[[str], Awaitable[None]] | None = None,
        rescan: Rescan | None = None,
        remove_device: Callable[[str], Awaitable[list[str]]] | None = None,
    ) -> None:
        self.settings = settings
        self.directory = state_directory / CLONES_DIRECTORY
        self.records = CloneRecords(self.directory)
        self.host = host or Host()
        #: Called with the purpose before its clones are unmounted (a drill stops its node).
        self.before_unmount = before_unmount
        #: How a clone attached by identity is looked for (SCSI host scans, NVMe rescans).
        self.rescan: Rescan = rescan or SysfsRescan()
        #: How a clone found by identity is let go of before the array unmaps it.
        self.remove_device = remove_device or DeviceRemoval()
        self._lock = asyncio.Lock()

    def base(self, run_id: str) -> Path:
        return self.directory / check_purpose_id(run_id)

    def mounted(self, run_id: str) -> list[MountedClone]:
        """The clones of a purpose that are mounted now (NotFound if it has none)."""
        record = self.records.load(run_id)
        if record is None or not record.clones:
            raise NotFound(f"no clones are mounted for {run_id!r}; call MountClones first")
        missing = [c.volume for c in record.clones if c.state != MOUNTED]
        if missing:
            raise Conflict(
                f"clones {', '.join(missing)} of {run_id!r} are not mounted (a MountClones"
                " did not finish); call MountClones again"
            )
        return record.clones

    async def mount(
        self, run_id: str, volumes: Sequence[CloneVolume], *, read_only: bool
    ) -> list[MountedClone]:
        check_purpose_id(run_id)
        wanted = [volume.checked() for volume in volumes]
        if not wanted:
            raise ValidationError(f"MountClones for {run_id!r} names no volume")
        names = [volume.volume for volume in wanted]
        if len(set(names)) != len(names):
            raise ValidationError(f"MountClones for {run_id!r} names a volume twice")
        unknown = [v.volume for v in wanted if not v.wwn]
        if not self.settings.attach_command and unknown:
            raise Conflict(
                f"clones {', '.join(unknown)} come with no identity (the coordinator did not"
                " present them to this host: is the array's driver able to?) and this agent has"
                " no [volumes] attach_command to attach them otherwise"
            )
        async with self._lock:
            record = self.records.load(run_id)
            points = mount_points_for(self.base(run_id), wanted)
            if record is None:
                record = CloneRecord(
                    run_id,
                    read_only,
                    [
                        MountedClone(
                            volume.role,
                            volume.array,
                            volume.volume,
                            volume.serial,
                            volume.wwn,
                            volume.source_mount_point,
                            point,
                            expected_fs_uuid=volume.fs_uuid,
                        )
                        for volume, point in zip(wanted, points, strict=True)
                    ],
                )
            elif [c.request for c in record.clones] != wanted or record.read_only != read_only:
                raise Conflict(
                    f"{run_id!r} was mounted with other clones"
                    f" ({', '.join(c.volume for c in record.clones)},"
                    f" read_only={record.read_only}); UnmountClones it first"
                )
            self.records.save(record)
            for index, clone in enumerate(record.clones):
                if clone.state != MOUNTED:
                    record.clones[index] = await self._mount_one(record, index)
            log.warning(
                "clones mounted",
                run_id=run_id,
                read_only=read_only,
                mounts={c.volume: c.mount_point for c in record.clones},
            )
            return list(record.clones)

    async def _mount_one(self, record: CloneRecord, index: int) -> MountedClone:
        clone = record.clones[index]

        def save(updated: MountedClone) -> MountedClone:
            record.clones[index] = updated
            self.records.save(record)
            return updated

        if (clone.state == ATTACHING or not clone.device) and not self.settings.attach_command:
            device = await wait_for_device(
                clone.wwn,
                self.settings.by_id_dir,
                rescan=self.rescan,
                is_block_device=lambda path: self.host.block_device_number(path) is not None,
            )
            clone = save(replace(clone, state=ATTACHED, device=device))
        if clone.state == ATTACHING or not clone.device:
            assert self.settings.attach_command is not None
            result = await self._hook(
                "attach_command", self.settings.attach_command, record.run_id, clone
            )
            lines = result.stdout.rstrip().splitlines()
            device = lines[-1].strip() if lines else ""
            if not device and clone.wwn:
                device = f"/dev/disk/by-id/wwn-0x{clone.wwn.lower().removeprefix('0x')}"
            if not device.startswith("/") or "\x00" in device:
                raise CommandFailed(
                    f"[volumes] attach_command gave {device[:200]!r} for clone {clone.volume}:"
                    " its last stdout line must be the device's absolute path"
                )
            device = os.path.normpath(device)
            if self.host.block_device_number(device) is None:
                raise CommandFailed(
                    f"[volumes] attach_command named {device} for clone {clone.volume}, but it is"
                    " not a block device"
                )
            clone = save(replace(clone, state=ATTACHED, device=device))
        current = {entry.mount_point: entry for entry in self.host.entries()}.get(clone.mount_point)
        if current is not None:
            if self.host.block_device_number(current.source) != self.host.block_device_number(
                clone.device
            ):
                raise Conflict(
                    f"{clone.mount_point} has {current.source} mounted, not clone {clone.volume}"
                    f" ({clone.device}); unmount it by hand"
                )
            return save(replace(clone, state=MOUNTED))
        busy = await asyncio.to_thread(self.host.busy_reason, clone.device)
        if busy:
            raise Conflict(f"clone {clone.volume} ({clone.device}) cannot be mounted: {busy}")
        if clone.expected_fs_uuid:
            found = await self.host.fs_uuid(clone.device)
            check_fs_uuid(clone.volume, clone.device, found, clone.expected_fs_uuid)
        fs_type = await self.fs_type(clone.device)
        if not fs_type:
            raise Conflict(f"clone {clone.volume} ({clone.device}) holds no filesystem blkid knows")
        options = mount_options(fs_type, record.read_only)
        Path(clone.mount_point).mkdir(mode=0o700, parents=True, exist_ok=True)
        await self.host.mount(clone.device, clone.mount_point, fs_type, options)
        log.warning(
            "clone mounted",
            run_id=record.run_id,
            volume=clone.volume,
            device=clone.device,
            mount_point=clone.mount_point,
            options=list(options),
        )
        return save(replace(clone, state=MOUNTED, fs_type=fs_type, options=options))

    async def unmount(self, run_id: str) -> list[str]:
        """Unmount and detach every clone recorded for the purpose; [] if there is none."""
        check_purpose_id(run_id)
        if self.before_unmount is not None:
            await self.before_unmount(run_id)
        async with self._lock:
            return await self._unmount(run_id)

    async def _unmount(self, run_id: str) -> list[str]:
        record = self.records.load(run_id)
        if record is None:
            return []
        detached: list[str] = []
        mounted = {entry.mount_point for entry in self.host.entries()}
        for index, clone in reversed(list(enumerate(record.clones))):
            if clone.mount_point in mounted:
                try:
                    await self._umount(run_id, clone.mount_point)
                except (CommandFailed, CommandTimeout) as exc:
                    raise Conflict(
                        f"clone {clone.volume} at {clone.mount_point} cannot be unmounted ({exc});"
                        " stop what holds it, then call UnmountClones again"
                    ) from None
                log.warning("clone unmounted", run_id=run_id, mount_point=clone.mount_point)
            if clone.device and self.settings.detach_command:
                await self._hook("detach_command", self.settings.detach_command, run_id, clone)
            elif clone.device and not self.settings.attach_command:
                # Found by identity: flushed and removed, so that the unmap leaves no dead path.
                for problem in await self.remove_device(clone.device):
                    log.warning(
                        "clone device not let go of; the array's unmap leaves a stale path",
                        run_id=run_id,
                        volume=clone.volume,
                        problem=problem,
                    )
            record.clones[index] = replace(clone, state=ATTACHING, device="")
            self.records.save(record)
            detached.append(clone.volume)
            _remove_empty(Path(clone.mount_point))
        _remove_empty(self.base(run_id))
        self.records.remove(run_id)
        log.warning("clones detached", run_id=run_id, volumes=detached)
        return sorted(detached)

    async def _umount(self, run_id: str, mount_point: str) -> None:
        for attempt in range(1, UNMOUNT_ATTEMPTS + 1):
            try:
                await self.host.umount(mount_point)
                return
            except CommandFailed as exc:
                if attempt == UNMOUNT_ATTEMPTS:
                    raise
                log.warning(
                    "clone busy: unmount tried again shortly",
                    run_id=run_id,
                    mount_point=mount_point,
                    attempt=attempt,
                    error=str(exc)[:300],
                )
                await asyncio.sleep(UNMOUNT_RETRY_SECONDS)

    async def recover(self, why: str = "left by a previous agent") -> None:
        """Tear down every recorded clone, logged: at start (a previous process left them) and
        at stop (nobody will use them; a caller that still needs them mounts them again)."""
        for run_id in self.records.purposes():
            log.warning("tearing down clones", run_id=run_id, why=why)
            try:
                await self.unmount(run_id)
            except (Conflict, CommandFailed, CommandTimeout) as exc:
                log.error(
                    "clones could not be torn down",
                    run_id=run_id,
                    error=str(exc)[:500],
                )

    async def fs_type(self, device: str) -> str:
        """The filesystem type on `device` (blkid, bypassing its cache); "" if none."""
        return await filesystem_type(device)

    async def _hook(
        self, key: str, argv: Sequence[str], run_id: str, clone: MountedClone
    ) -> process.CommandResult:
        environment = {k: v for k, v in os.environ.items() if not k.startswith(_ENV_PREFIX)}
        environment.update(
            RINGSNAP_OPERATION=run_id,
            RINGSNAP_MOUNT_POINT=clone.mount_point,
            RINGSNAP_DEVICE=clone.device,
            RINGSNAP_FS_UUID="",
            RINGSNAP_KINDS=clone.role,
            RINGSNAP_SERIAL=clone.serial,
            RINGSNAP_WWN=clone.wwn,
            RINGSNAP_ARRAY=clone.array,
            RINGSNAP_VOLUME=clone.volume,
        )
        result = await process.run(
            argv,
            timeout=self.settings.hook_timeout_seconds,
            env=environment,
            display=f"[volumes] {key} ({shlex.join(argv)})",
        )
        log.info("clone hook ran", hook=key, volume=clone.volume, seconds=round(result.seconds, 3))
        return result


async def filesystem_type(device: str) -> str:
    result = await process.run(
        ["blkid", "-p", "-o", "value", "-s", "TYPE", device],
        timeout=_BLKID_TIMEOUT_SECONDS,
        check=False,
    )
    lines = result.stdout.strip().splitlines() if result.returncode == 0 else []
    return lines[-1].strip() if lines else ""


def _remove_empty(path: Path) -> None:
    # Not empty (then never deleted) or already gone: either way nothing to do.
    with contextlib.suppress(OSError):
        path.rmdir()
