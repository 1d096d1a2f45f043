"""Attaching a released volume again: the attach hook (which may name the device to mount) or,
without one, the clone the coordinator presented to this host found by its identity (a clone-mode
restore; else the released device itself), the checks that it is the released filesystem (UUID
before and after the mount), the mount, and a refused device handed to the detach hook so that
nothing stays attached."""

from __future__ import annotations

import asyncio
import os
from dataclasses import replace

from ringsnap import logs
from ringsnap.agent import volumes
from ringsnap.agent.config import VolumesSection
from ringsnap.agent.discovery import Rescan, SysfsRescan, wait_for_device
from ringsnap.agent.errors import CommandFailed, CommandTimeout, Conflict
from ringsnap.agent.mounts import Host
from ringsnap.agent.restore.hooks import run_hook
from ringsnap.agent.restore.model import ATTACHED, ReleasedVolume, now, on_top

log = logs.get_logger(__name__)


class VolumeAttacher:
    """Attaches one released volume at a time; the caller holds the restore lock."""

    def __init__(self, host: Host, settings: VolumesSection, rescan: Rescan | None = None) -> None:
        self.host = host
        self.settings = settings
        #: How a clone attached by identity is looked for (SCSI host scans, NVMe rescans).
        self.rescan: Rescan = rescan or SysfsRescan()

    async def attach_one(
        self, run_id: str, volume: ReleasedVolume, volume_name: str, identity: str = ""
    ) -> ReleasedVolume:
        """`identity`: the clone's, as presented to this host; used when no hook is set."""
        point = volume.mount_point
        current = on_top(await asyncio.to_thread(self.host.entries)).get(point)
        if current is not None:
            uuid = await self._uuid_of(current.source)
            if uuid != volume.fs_uuid:
                raise Conflict(
                    f"another filesystem is mounted at {point} ({current.source}, UUID"
                    f" {uuid or 'none'}), not the one released (UUID {volume.fs_uuid});"
                    " unmount it first"
                )
            log.info("already attached", run_id=run_id, mount_point=point)
            return replace(
                volume,
                state=ATTACHED,
                attached_device=current.source,
                attached_at=volume.attached_at or now(),
                volume_name=volume.volume_name or volume_name,
            )
        device = volume.device
        from_hook = hooked = False
        if self.settings.attach_command:
            result = await run_hook(
                self.settings,
                "attach_command",
                self.settings.attach_command,
                run_id,
                volume,
                volume_name=volume_name,
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
        elif identity:
            # A clone-mode restore with no hook: the released device is the original volume;
            # what must be mounted is the clone the array mapped to this host, found by its id.
            device = await wait_for_device(
                identity,
                self.settings.by_id_dir,
                rescan=self.rescan,
                is_block_device=lambda path: self.host.block_device_number(path) is not None,
            )
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
        # A device the attach hook attached and a check refuses goes to the detach hook.
        refused = (run_id, volume, device, volume_name) if hooked else None
        if uuid != volume.fs_uuid:
            raise await self._refusal(
                f"{device} holds filesystem UUID {uuid or 'none'}, but {point} held"
                f" {volume.fs_uuid} when operation {run_id!r} released it: not the restored"
                f" volume (attached {volume_name}); nothing was mounted",
                refused,
            )
        if not await asyncio.to_thread(self.host.is_directory, point):
            raise Conflict(f"the mount point {point} is not a directory any more; create it first")
        log.warning(
            "mounting for a restore",
            run_id=run_id,
            mount_point=point,
            device=device,
            volume=volume_name,
        )
        await self.host.mount(device, point, volume.fs_type, volume.options)
        mounted = on_top(await asyncio.to_thread(self.host.entries)).get(point)
        mounted_uuid = await self._uuid_of(mounted.source) if mounted is not None else ""
        if mounted is None or mounted.device_number != number or mounted_uuid != volume.fs_uuid:
            if mounted is not None:
                await self.host.umount(point)
            raise await self._refusal(
                f"what got mounted at {point} ({mounted.source if mounted else 'nothing'}, UUID"
                f" {mounted_uuid or 'none'}) is not the released filesystem (UUID"
                f" {volume.fs_uuid}); it was unmounted again",
                refused,
            )
        log.warning(
            "attached after a restore",
            run_id=run_id,
            mount_point=point,
            device=device,
            volume=volume_name,
            fs_uuid=volume.fs_uuid,
        )
        return replace(
            volume,
            state=ATTACHED,
            attached_device=device,
            attached_at=now(),
            volume_name=volume_name,
        )

    async def _refusal(
        self, message: str, refused: tuple[str, ReleasedVolume, str, str] | None
    ) -> Conflict:
        """The Conflict of a refused attach; `refused` (operation, volume, device, volume name),
        when the attach hook attached the device, hands it to the detach hook first."""
        if refused is not None:
            message += await self._detach_refused(*refused)
        return Conflict(message)

    async def _detach_refused(
        self, run_id: str, volume: ReleasedVolume, device: str, volume_name: str
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
            run_id=run_id,
            mount_point=volume.mount_point,
            device=device,
            volume=volume_name,
        )
        try:
            await run_hook(
                self.settings,
                "detach_command",
                self.settings.detach_command,
                run_id,
                attached,
                volume_name=volume_name,
            )
        except (CommandFailed, CommandTimeout) as exc:
            log.error(
                "the detach hook failed for a refused device",
                run_id=run_id,
                device=device,
                error=str(exc)[:500],
            )
            return f"; detaching {device} failed too ({exc}): detach it by hand"
        return f"; {device} was handed to [volumes] detach_command"

    async def _uuid_of(self, device: str) -> str:
        if self.host.block_device_number(device) is None:
            return ""
        return await self.host.fs_uuid(device)
