"""A network namespace per drill: `ringsnap-drill-<id>`, with `lo` up and nothing else.

No veth, no route: inside, every 127.0.0.0/8 address is local and nothing else is reachable, so a
drill node started on a production node's own address talks to itself only. An address that is
not a loopback one (a production address on a real NIC) is added to `lo` inside the namespace.

Processes enter the namespace with `nsenter --net` (network namespace only), not `ip netns exec`
or `ip -n`: those also make a mount namespace (to mount that namespace's /sys), a copy of every
mount of the host at that moment. Where the host's mounts are private (no systemd as PID 1), the
copies do not follow the host's unmounts, so a drill node running for minutes would keep every
other filesystem of the host busy — a restore beside it could not release its volumes ("still
holds /dev/loopN"). Nothing a drill runs needs the namespace's /sys.
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
NSENTER = "nsenter"
_TIMEOUT_SECONDS = 30.0
#: What a drill host's agent needs under systemd (network namespaces, netlink, the mount calls).
DRILL_HOST_DROP_IN = "/etc/systemd/system/ringsnap-agent.service.d/drill-host.conf"


def name_for(run_id: str) -> str:
    return f"{PREFIX}{run_id}"


def exec_argv(namespace: str, argv: list[str]) -> list[str]:
    """`argv` run inside the network namespace (nsenter setns()es, then execs: same pid), in the
    caller's mount namespace (see the module's docstring)."""
    return [NSENTER, f"--net={NETNS_DIRECTORY / namespace}", "--", *argv]


def program_of(argv: list[str]) -> str:
    """The program an `exec_argv` command line runs."""
    return argv[argv.index("--") + 1]


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
            exec_argv(namespace, [IP, "link", "set", "lo", "up"]), timeout=_TIMEOUT_SECONDS
        )
        parsed = ipaddress.ip_address(address)
        if not parsed.is_loopback:
            prefix = 32 if parsed.version == 4 else 128
            await process.run(
                exec_argv(namespace, [IP, "address", "add", f"{parsed}/{prefix}", "dev", "lo"]),
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
