"""Letting go of a clone's device before the array unmaps it (issue 20).

A clone the agent found by its identity (no attach hook: `agent.discovery`) is a device the kernel
made when the array presented it. Once the clone is unmounted, the coordinator asks the array to
unmap it; a device still there then is a dead path the kernel keeps retrying (and multipathd keeps
a map of failed paths) until the next rescan. So, after the unmount and before the unmap:

- a multipath map (`/dev/dm-N` whose `dm/uuid` starts with `mpath-`): its buffers flushed
  (`blockdev --flushbufs`), the map removed (`multipath -f <name>`), then each SCSI path below it
  deleted (`/sys/block/sdX/device/delete`);
- a SCSI disk (`/dev/sdX`): flushed, then deleted;
- anything else is left alone: an NVMe namespace goes when its controller reports it gone, and the
  sandbox's fabric detaches its loop devices itself.

`root` and `run` are seams for tests. A step that fails is returned as a problem (logged by the
caller): the filesystem was unmounted already, so nothing of the clone is lost; the host is left
with a stale device a rescan removes.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from ringsnap import logs
from ringsnap.agent import process
from ringsnap.agent.errors import CommandFailed, CommandTimeout

log = logs.get_logger(__name__)

Run = Callable[[Sequence[str]], Awaitable[None]]

#: How long `blockdev --flushbufs` and `multipath -f` may take.
COMMAND_TIMEOUT_SECONDS = 60.0


async def _run(argv: Sequence[str]) -> None:
    await process.run(argv, timeout=COMMAND_TIMEOUT_SECONDS)


class DeviceRemoval:
    """Flush and remove a device the array is about to unmap from this host."""

    def __init__(self, root: Path = Path("/"), run: Run = _run) -> None:
        self.root = root
        self.run = run

    async def __call__(self, device: str) -> list[str]:
        """What could not be done for `device` ([] when all went), having done the rest."""
        name = os.path.basename(os.path.realpath(device))
        block = self.root / "sys/block" / name
        if name.startswith("dm-") and _text(block / "dm/uuid").startswith("mpath-"):
            return await self._multipath(device, name, block)
        if name.startswith("sd") and (block / "device/delete").exists():
            problems = await self._flush(device)
            return problems + self._delete(name)
        return []

    async def _multipath(self, device: str, name: str, block: Path) -> list[str]:
        paths = sorted(p.name for p in (block / "slaves").glob("*"))
        problems = await self._flush(device)
        mapped = _text(block / "dm/name") or name
        try:
            await self.run(["multipath", "-f", mapped])
        except (CommandFailed, CommandTimeout) as exc:
            # The map is still there, over paths that would fail once unmapped: keep them.
            return [
                *problems,
                f"multipath map {mapped} not removed ({exc}); run `multipath -f"
                f" {mapped}` on this host, then delete its paths {', '.join(paths)}",
            ]
        log.info("multipath map removed", map=mapped, paths=paths)
        for path in paths:
            if path.startswith("sd"):
                problems += self._delete(path)
        return problems

    async def _flush(self, device: str) -> list[str]:
        try:
            await self.run(["blockdev", "--flushbufs", device])
        except (CommandFailed, CommandTimeout) as exc:
            return [f"{device}: buffers not flushed ({exc})"]
        return []

    def _delete(self, name: str) -> list[str]:
        delete = self.root / "sys/block" / name / "device/delete"
        try:
            delete.write_text("1")
        except OSError as exc:
            return [f"SCSI device {name} not deleted ({exc}); write 1 to {delete} on this host"]
        log.info("SCSI device deleted", device=name)
        return []


def _text(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""
