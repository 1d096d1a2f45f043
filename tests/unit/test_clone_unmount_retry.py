"""A clone the kernel finds busy is tried again briefly before its unmount is refused (a reader that
has just ended, such as an export's transfers winding down after a cancel, lets go a moment later);
never lazily, and a clone that stays busy is refused as before."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ringsnap.agent import clones
from ringsnap.agent.clones import CloneMounter
from ringsnap.agent.config import VolumesSection
from ringsnap.agent.errors import CommandFailed
from ringsnap.agent.mounts import Host


class BusyFor(Host):
    """umount refused as busy `busy` times, then done; every attempt recorded."""

    def __init__(self, busy: int) -> None:
        self.busy = busy
        self.attempts: list[str] = []

    async def umount(self, mount_point: str) -> None:
        self.attempts.append(mount_point)
        if self.busy:
            self.busy -= 1
            raise CommandFailed(f"umount: {mount_point}: target is busy")


@pytest.fixture(autouse=True)
def _no_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clones, "UNMOUNT_RETRY_SECONDS", 0.0)


def _mounter(tmp_path: Path, host: Host) -> CloneMounter:
    return CloneMounter(VolumesSection(), tmp_path, host=host)


@pytest.mark.parametrize("busy", [1, clones.UNMOUNT_ATTEMPTS - 1])
def test_a_clone_busy_for_a_moment_is_unmounted_on_a_retry(tmp_path: Path, busy: int) -> None:
    host = BusyFor(busy)
    asyncio.run(_mounter(tmp_path, host)._umount("export-1", "/clones/export-1/data"))
    assert host.attempts == ["/clones/export-1/data"] * (busy + 1)


def test_a_clone_that_stays_busy_is_refused_after_the_last_attempt(tmp_path: Path) -> None:
    host = BusyFor(clones.UNMOUNT_ATTEMPTS)
    with pytest.raises(CommandFailed, match="target is busy"):
        asyncio.run(_mounter(tmp_path, host)._umount("export-1", "/clones/export-1/data"))
    assert len(host.attempts) == clones.UNMOUNT_ATTEMPTS
