"""The node's part of a restore: let go of its Cassandra volumes, take them back, discard replay state.

The coordinator stops Cassandra, then asks the agent to *release* the volumes (unmount, detach
hook), has the array revert or clone them, asks the agent to *attach* them (attach hook, mount,
identity check) and to *discard* the replay state that lives outside the restored volumes, then
checks the manifest and starts Cassandra. For a backup of native snapshots (direct-attached storage)
nothing is released or attached: *restore_snapshot* puts the tables back to the snapshot in place,
and for a restore from S3 *install* puts the staged copy in place (the one installer,
`ringsnap.agent.restore.install`, with either source), then discard runs as after an attach.

Rules:
- nothing here runs while Cassandra answers; a filesystem a process holds is never unmounted (never
  lazily either), and an unmount counts only once the kernel no longer holds the block device;
- `/`, the filesystem of the agent's state, of its restore records and the one of its own program
  are never released (`ringsnap.agent.protected`, the rule freezes follow too);
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
  operation released and attached again (after an install in place: all of them, the commit log
  first of all, since it holds writes newer than the snapshot), and logs each at warning level;
- the hooks are argv lists from the agent's configuration, run without a shell; what they need to
  know arrives in RINGSNAP_* environment variables.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from ringsnap import logs
from ringsnap.agent import volumes
from ringsnap.agent.config import VolumesSection
from ringsnap.agent.errors import CommandFailed, CommandTimeout, Conflict
from ringsnap.agent.mounts import RESTORE_DROP_IN, Host, describe_holders
from ringsnap.agent.protected import existing, protected_devices, protected_paths
from ringsnap.agent.restore.attach import VolumeAttacher
from ringsnap.agent.restore.hooks import run_hook
from ringsnap.agent.restore.install import Installer, Source
from ringsnap.agent.restore.install_record import InstallRecords, RestoredTable
from ringsnap.agent.restore.model import (
    CassandraStatus,
    DiscardedDirectory,
    ReleasedVolume,
    VolumeState,
    attach_requests,
    check_mount_point,
    check_operation_id,
    now,
    on_top,
    ordered,
)
from ringsnap.agent.restore.release import Release, release_plan
from ringsnap.agent.restore.release_records import RestoreRecords, released_not_attached
from ringsnap.agent.restore.replay_state import discard_plan, empty_directory
from ringsnap.agent.restore.snapshot import NativeSnapshot
from ringsnap.mountinfo import Mount
from ringsnap.names import snapshot_tag
from ringsnap.volume_facts import VolumeFacts

log = logs.get_logger(__name__)

RECORDS_DIRECTORY = "restores"
#: Under the records directory: what each install in place did (`record`; the directory keeps the
#: name it had when only native snapshots were installed in place).
INSTALL_RECORDS = "snapshots"
_T = TypeVar("_T")

# -- the restorer -------------------------------------------------------------------------------


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
        self.host = host or Host(settings.by_id_dir)
        self._attacher = VolumeAttacher(self.host, settings)
        self._lock = asyncio.Lock()
        #: Installs in place, recorded beside the volume records (in a directory of their own,
        #: which `RestoreRecords.all` does not read).
        self.installs = InstallRecords(self.records.directory / INSTALL_RECORDS)
        self.installer = Installer(self.directories.get("data", []), self.installs)

    # -- what is where ------------------------------------------------------------------------

    def _protected_paths(self) -> list[tuple[str, str]]:
        """Paths whose filesystems are never released, with the reason; "/" first."""
        records = self.records.directory
        return protected_paths(
            self.state_directory, [(records, f"it holds the agent's restore records ({records})")]
        )

    def records_on_cassandra_filesystem(self) -> str:
        """Why the restore records' place is wrong ("" if it is not): it is on a filesystem of
        the Cassandra directories, which the agent then never releases (`ringsnap-agent check`)."""
        directory = self.records.directory
        device = self.host.device_of(str(existing(directory)))
        for filesystem in self._filesystems(self.host.entries(), {}):
            if filesystem.device_number == device and filesystem.mount_point != "/":
                return (
                    f"the restore records directory {directory} is on {filesystem.mount_point},"
                    f" which holds Cassandra {', '.join(ordered(filesystem.kinds))}: the agent"
                    " never releases it; set [volumes] state_directory elsewhere"
                )
        return ""

    def _protected_devices(self) -> dict[int, str]:
        return protected_devices(self._protected_paths(), self.host.device_of)

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
        pending = released_not_attached(records)
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
                    kinds=ordered(filesystem.kinds),
                    serial=identity.serial,
                    wwn=identity.wwn,
                    loop_backing_file=identity.loop_backing_file,
                    mounted=True,
                    released_by=releasing[0] if releasing else "",
                )
            )
        for point, (run_id, volume) in sorted(pending.items()):
            if point not in mounted:
                found.append(volume.facts(run_id))
        return VolumeState(cassandra, tuple(found))

    # -- release --------------------------------------------------------------------------------

    async def release(
        self, run_id: str, mount_points: Sequence[str] = ()
    ) -> tuple[VolumeFacts, ...]:
        check_operation_id(run_id)
        requested = list(dict.fromkeys(check_mount_point(point) for point in mount_points))
        action = f"release {', '.join(requested) or 'the Cassandra volumes'}"
        self._refuse_without_host_access(action)
        async with self._lock:
            await self._refuse_while_running(action)
            entries, records, _ = await asyncio.to_thread(self._read, strict=True)
            plan = await asyncio.to_thread(
                self._release_plan, run_id, requested, entries, records
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
            mine = {volume.mount_point: volume for volume in records.get(run_id, [])}
            done: dict[str, ReleasedVolume] = {}
            for item in plan:
                done[item.mount_point] = await self._release_one(
                    run_id, item, mine, uuids.get(item.mount_point, "")
                )
            return tuple(done[item.mount_point].facts(run_id) for item in plan)

    def _release_plan(
        self,
        run_id: str,
        requested: list[str],
        entries: list[Mount],
        records: Mapping[str, list[ReleasedVolume]],
    ) -> list[Release]:
        return release_plan(
            run_id,
            requested,
            entries=entries,
            records=records,
            filesystems=self._filesystems(entries, released_not_attached(records)),
            protected=self._protected_devices(),
            frozen=self._frozen(),
            host=self.host,
            record_location=self.records.location,
        )

    async def _release_one(
        self,
        run_id: str,
        item: Release,
        mine: dict[str, ReleasedVolume],
        uuid: str,
    ) -> ReleasedVolume:
        point = item.mount_point
        if item.step == "done":
            assert item.recorded is not None
            log.info("already released", run_id=run_id, mount_point=point)
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
                    kinds=ordered(filesystem.kinds),
                    cassandra_directories=filesystem.cassandra_directories,
                    serial=identity.serial,
                    wwn=identity.wwn,
                    loop_backing_file=identity.loop_backing_file,
                    released_at=now(),
                )
                mine[point] = volume
                # Durable before the unmount: whatever happens next, attach knows what was here.
                await asyncio.to_thread(self.records.save, run_id, list(mine.values()))
            else:
                assert item.recorded is not None
                volume = item.recorded
            log.warning(
                "unmounting for a restore",
                run_id=run_id,
                mount_point=point,
                device=volume.device,
                fs_uuid=volume.fs_uuid,
            )
            try:
                await self.host.umount(point)
            except (CommandFailed, CommandTimeout):
                still = on_top(await asyncio.to_thread(self.host.entries)).get(point)
                if still is not None and still.device_number == volume.device_number:
                    # Nothing was released: the record must not say otherwise.
                    mine.pop(point, None)
                    await asyncio.to_thread(self._save_or_remove, run_id, mine)
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
            await run_hook(
                self.settings,
                "detach_command",
                self.settings.detach_command,
                run_id,
                volume,
            )
        volume = replace(volume, detached=True)
        mine[point] = volume
        await asyncio.to_thread(self.records.save, run_id, list(mine.values()))
        log.warning(
            "released for a restore",
            run_id=run_id,
            mount_point=point,
            device=volume.device,
            fs_uuid=volume.fs_uuid,
        )
        return volume

    def _save_or_remove(self, run_id: str, mine: Mapping[str, ReleasedVolume]) -> None:
        if mine:
            self.records.save(run_id, list(mine.values()))
        else:
            self.records.remove(run_id)

    # -- attach ---------------------------------------------------------------------------------

    async def attach(
        self,
        run_id: str,
        requested: Sequence[tuple[str, str]],
        identities: Mapping[str, str] | None = None,
    ) -> tuple[VolumeFacts, ...]:
        """Mount (mount point, volume) pairs `run_id` released; `identities`, by mount point,
        that of a clone presented to this host, found by it when no attach hook is set."""
        check_operation_id(run_id)
        wanted = attach_requests(requested, identities or {})
        self._refuse_without_host_access(f"attach {', '.join(wanted)}")
        async with self._lock:
            await self._refuse_while_running(f"attach {', '.join(wanted)}")
            released = await asyncio.to_thread(self.records.load, run_id)
            mine = {volume.mount_point: volume for volume in released}
            for point in wanted:
                if point not in mine:
                    raise Conflict(
                        f"{point} was not released by operation {run_id!r} on this node"
                        f" (it released: {', '.join(mine) or 'nothing'}); only what an operation"
                        " released can be attached under it"
                    )
            results: list[VolumeFacts] = []
            for point, (name, identity) in wanted.items():
                volume = await self._attacher.attach_one(run_id, mine[point], name, identity)
                mine[point] = volume
                await asyncio.to_thread(self.records.save, run_id, list(mine.values()))
                results.append(volume.facts(run_id))
            return tuple(results)

    # -- installs in place ------------------------------------------------------------------------

    async def restore_snapshot(self, run_id: str, tag: str) -> tuple[RestoredTable, ...]:
        """Put the node back to native snapshot `tag`, in place."""
        snapshot_tag(tag)
        source = NativeSnapshot(self.directories.get("data", []), tag)
        return await self.install(run_id, source, f"restore snapshot {tag}")

    async def install(
        self, run_id: str, source: Source, action: str
    ) -> tuple[RestoredTable, ...]:
        """Put the node's tables back to `source` in place (`ringsnap.agent.restore.install`);
        refused while Cassandra runs or anything holds a file under a data directory, or while a
        restore's released volumes are not attached again."""
        check_operation_id(run_id)
        return await self.while_stopped(
            action, lambda: self.installer.install(run_id, source)
        )

    async def while_stopped(self, action: str, work: Callable[[], _T]) -> _T:
        """`work` in a thread under this restorer's lock, with `install`'s checks first."""
        self._refuse_without_host_access(action)
        async with self._lock:
            await self._refuse_while_running(action)
            await asyncio.to_thread(self._check_installable, action)
            return await asyncio.to_thread(work)

    def _check_installable(self, action: str) -> None:
        _, records, _ = self._read(strict=True)
        away = released_not_attached(records)
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

    async def discard(self, run_id: str, *, hints: bool) -> tuple[DiscardedDirectory, ...]:
        check_operation_id(run_id)
        self._refuse_without_host_access("discard the replay state")
        async with self._lock:
            await self._refuse_while_running("discard the replay state")
            plan = await asyncio.to_thread(self._discard_plan, run_id, hints)
            done: list[DiscardedDirectory] = []
            for shown, real, kind in plan:
                log.warning(
                    "discarding replay state outside the restored volumes",
                    run_id=run_id,
                    path=shown,
                    kind=kind,
                )
                files, size = await asyncio.to_thread(empty_directory, real)
                log.warning(
                    "discarded replay state",
                    run_id=run_id,
                    path=shown,
                    kind=kind,
                    files=files,
                    bytes=size,
                )
                done.append(DiscardedDirectory(shown, kind, files, size))
            return tuple(done)

    def _discard_plan(self, run_id: str, hints: bool) -> list[tuple[str, str, str]]:
        entries, records, _ = self._read(strict=True)
        return discard_plan(
            run_id,
            hints=hints,
            entries=entries,
            records=records,
            snapshot_phase=self.installs.phase(run_id),
            directories=self.directories,
            protected=[os.path.realpath(path) for path, _ in self._protected_paths()[1:]],
            host=self.host,
        )


def _covers(volume: ReleasedVolume, path: Path) -> bool:
    if str(path) in volume.cassandra_directories:
        return True
    point = volume.mount_point
    return any(
        candidate == point or candidate.startswith(point.rstrip("/") + "/")
        for candidate in (os.path.normpath(path), os.path.realpath(path))
    )
