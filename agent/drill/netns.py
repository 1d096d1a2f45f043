"""A network namespace per drill: `ringsnap-drill-<id>`, with `lo` up and nothing else.

No veth, no route: inside, every 127.0.0.0/8 address is local and nothing else is reachable, so a
drill node started on a production node's own address talks to itself only. An address that is
not a loopback one (a production address on a real NIC) is added to `lo` inside the namespace.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

from ringsnap.agent import process
from ringsnap.agent.errors import CommandFailed

PREFIX = "ringsnap-drill-"
NETNS_DIRECTORY = Path("/run/netns")
IP = "ip"
_TIMEOUT_SECONDS = 30.0
#: What a drill host's agent needs under systemd (network namespaces, netlink, the mount calls).
DRILL_HOST_DROP_IN = "/etc/systemd/system/ringsnap-agent.service.d/drill-host.conf"


def name_for(drill_id: str) -> str:
    return f"{PREFIX}{drill_id}"


def exec_argv(namespace: str, argv: list[str]) -> list[str]:
    """`argv` run inside the namespace (ip netns exec setns()es, then execs: same pid)."""
    return [IP, "netns", "exec", namespace, *argv]


def existing(directory: Path = NETNS_DIRECTORY) -> list[str]:
    """Every drill namespace on the host (left by this process or a previous one)."""
    try:
        return sorted(name for name in os.listdir(directory) if name.startswith(PREFIX))
    except FileNotFoundError:
        return []


async def create(namespace: str, address: str) -> None:
    """The namespace with `lo` up; `address` on `lo` when it is not a loopback address."""
    await process.run([IP, "netns", "add", namespace], timeout=_TIMEOUT_SECONDS)
    try:
        await process.run(
            [IP, "-n", namespace, "link", "set", "lo", "up"], timeout=_TIMEOUT_SECONDS
        )
        parsed = ipaddress.ip_address(address)
        if not parsed.is_loopback:
            prefix = 32 if parsed.version == 4 else 128
            await process.run(
                [IP, "-n", namespace, "address", "add", f"{parsed}/{prefix}", "dev", "lo"],
                timeout=_TIMEOUT_SECONDS,
            )
    except BaseException:
        await delete(namespace)
        raise


async def pids(namespace: str) -> list[int]:
    """The processes inside the namespace ([] when it does not exist)."""
    if namespace not in existing():
        return []
    result = await process.run([IP, "netns", "pids", namespace], timeout=_TIMEOUT_SECONDS)
    return sorted(int(word) for word in result.stdout.split() if word.isdigit())


async def delete(namespace: str) -> bool:
    """Delete the namespace; False when there was none."""
    if namespace not in existing():
        return False
    try:
        await process.run([IP, "netns", "delete", namespace], timeout=_TIMEOUT_SECONDS)
    except CommandFailed:
        if namespace in existing():
            raise
    return True
