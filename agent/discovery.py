"""Finding a presented clone on this host by its identity (issue 20): after the array mapped it,
rescan until a by-id link names the identity, then use the device behind it.

The coordinator gives the identity the array reported for the mapping (an NAA WWN for SCSI, the
NGUID for NVMe; `ringsnap.device_ids` spelling). udev names each device by it in
`[volumes] by_id_dir` (`wwn-0x…`, `nvme-eui.…`, `dm-uuid-mpath-3…` for a multipath map, which is
preferred when multipathd made one: the paths below it must not be mounted directly).

A SCSI LUN appears after a scan of each SCSI host (`/sys/class/scsi_host/host*/scan`, "- - -");
an NVMe namespace after a rescan of each controller (`/sys/class/nvme/nvme*/rescan_controller`).
Both are written under `root` (a seam for tests); a host without them has nothing to scan.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from ringsnap import device_ids, logs
from ringsnap.agent.errors import Conflict

log = logs.get_logger(__name__)

#: How long an attach waits for a presented device to appear, and how often it rescans.
APPEAR_TIMEOUT_SECONDS = 60.0
RESCAN_INTERVAL_SECONDS = 1.0
#: Which by-id names count, best first: a multipath map over its paths.
_PREFERENCE = ("dm-uuid-mpath-", "wwn-", "nvme-eui.", "scsi-")

Rescan = Callable[[], Awaitable[None]]


class DeviceNotFound(Conflict):
    """The presented device did not appear in time."""


def _write(path: Path, text: str) -> bool:
    try:
        path.write_text(text)
    except OSError as exc:
        log.warning("rescan not written", path=str(path), error=str(exc))
        return False
    return True


class SysfsRescan:
    """Ask the kernel to look for new LUNs and namespaces (sysfs writes, under `root`)."""

    def __init__(self, root: Path = Path("/")) -> None:
        self.root = root

    def rescan_now(self) -> int:
        """Write every scan trigger; how many were written."""
        written = 0
        for scan in sorted((self.root / "sys/class/scsi_host").glob("host*/scan")):
            written += _write(scan, "- - -")
        for rescan in sorted((self.root / "sys/class/nvme").glob("nvme*/rescan_controller")):
            written += _write(rescan, "1")
        return written

    async def __call__(self) -> None:
        await asyncio.to_thread(self.rescan_now)


def find_link(identity: str, by_id_dir: Path) -> Path | None:
    """The by-id link that names `identity` (any spelling), the multipath map first."""
    wanted = device_ids.canonical(identity)
    if not wanted:
        return None
    try:
        names = sorted(os.listdir(by_id_dir))
    except OSError:
        return None
    found = [
        name
        for name in names
        if name.startswith(_PREFERENCE) and device_ids.canonical(name) == wanted
    ]
    found.sort(key=lambda name: next(i for i, p in enumerate(_PREFERENCE) if name.startswith(p)))
    return by_id_dir / found[0] if found else None


async def wait_for_device(
    identity: str,
    by_id_dir: Path,
    *,
    rescan: Rescan,
    is_block_device: Callable[[str], bool],
    timeout: float = APPEAR_TIMEOUT_SECONDS,
    interval: float = RESCAN_INTERVAL_SECONDS,
    clock: Callable[[], float] = time.monotonic,
) -> str:
    """The block device named by `identity` in `by_id_dir`, rescanning until it appears; raises
    DeviceNotFound after `timeout` seconds, saying what to check on the array and the host."""
    deadline = clock() + timeout
    scans = 0
    while True:
        link = find_link(identity, by_id_dir)
        if link is not None:
            device = os.path.realpath(link)
            if is_block_device(device):
                log.info("presented device found", identity=identity, device=device, scans=scans)
                return device
        if clock() >= deadline:
            raise DeviceNotFound(
                f"no device with identity {identity} appeared in {by_id_dir} within {timeout:g} s"
                f" ({scans} rescans): check that the array mapped the clone to this host's"
                " initiators (its host object) and that this host is logged in to the array"
                " (iSCSI session, FC zoning, NVMe connect)"
            )
        await rescan()
        scans += 1
        await asyncio.sleep(interval)


def check_fs_uuid(volume: str, device: str, found: str, expected: str) -> None:
    """Refuse a device whose filesystem is not the source volume's (a clone keeps its UUID)."""
    if found.lower() != expected.lower():
        raise Conflict(
            f"clone {volume} ({device}) holds filesystem UUID {found or '(none)'}, not {expected}"
            " of the volume it is a clone of: it is another disk (a stale by-id link, or the"
            " array mapped another volume); nothing was mounted"
        )
