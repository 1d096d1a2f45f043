"""The drill's network namespace, for real (root, ip, nsenter): a process run in it is alone on
its `lo` but shares the agent's mount namespace, so it holds none of the host's filesystems.

The regression this guards: `ip netns exec` gave the drill node a mount namespace of its own, a
copy of every host mount; where the host's mounts are private, an unmount on the host left the
copy mounted, and the loop device behind it stayed busy until the drill ended.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ringsnap.agent.drill import netns


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root (ip netns add, mount)"
    for tool in (netns.IP, netns.NSENTER, "mount", "umount"):
        if shutil.which(tool) is None:
            return f"needs the {tool} command (Debian: iproute2, util-linux)"
    return None


pytestmark = pytest.mark.skipif(_missing() is not None, reason=str(_missing()))


@pytest.fixture
def namespace() -> Iterator[str]:
    name = netns.name_for(f"t{uuid.uuid4().hex[:8]}")
    asyncio.run(netns.create(name, "10.231.9.9"))
    try:
        yield name
    finally:
        asyncio.run(netns.delete(name))
    assert name not in netns.existing()


def test_a_process_in_the_namespace_is_alone_on_lo_with_the_nodes_address(namespace: str) -> None:
    shown = subprocess.run(
        netns.exec_argv(namespace, [netns.IP, "-o", "address", "show"]),
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    devices = {line.split()[1] for line in shown.splitlines()}
    assert devices == {"lo"}
    assert "127.0.0.1/8" in shown and "10.231.9.9/32" in shown
    assert netns.program_of(netns.exec_argv(namespace, ["java", "-jar"])) == "java"


def test_the_drill_process_shares_the_mount_namespace_and_holds_no_unmounted_fs(
    namespace: str, tmp_path: Path
) -> None:
    mount_point = tmp_path / "other-ring"
    mount_point.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(mount_point)], check=True, timeout=30)
    child = subprocess.Popen(
        netns.exec_argv(namespace, [sys.executable, "-c", "import time; time.sleep(60)"])
    )
    try:
        asyncio.run(_wait_for_pids(namespace, child.pid))
        assert os.readlink(f"/proc/{child.pid}/ns/mnt") == os.readlink("/proc/self/ns/mnt")
        assert os.readlink(f"/proc/{child.pid}/ns/net") != os.readlink("/proc/self/ns/net")
        subprocess.run(["umount", str(mount_point)], check=True, timeout=30)
        held = Path(f"/proc/{child.pid}/mountinfo").read_text()
        assert f" {mount_point} " not in held, "the drill process still holds the unmounted fs"
    finally:
        child.kill()
        child.wait(timeout=30)
        subprocess.run(["umount", str(mount_point)], check=False, capture_output=True)


async def _wait_for_pids(namespace: str, pid: int) -> None:
    for _ in range(100):
        if pid in await netns.pids(namespace):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"pid {pid} never appeared in {namespace}")
