"""nodetool from the host against one node's JMX port, and parsing what `nodetool status` says."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ringsnap.sandbox.commands import run
from ringsnap.sandbox.errors import SandboxError
from ringsnap.sandbox.image import nodetool_argv

_STATUS_LINE = re.compile(r"^(?P<status>[UD])(?P<state>[NLJM])\s+(?P<address>\S+)\s")


@dataclass(frozen=True)
class RingMember:
    """One line of `nodetool status`: e.g. `UN 127.0.1.2`."""

    address: str
    status: str  # "U" up or "D" down
    state: str  # "N" normal, "L" leaving, "J" joining, "M" moving

    @property
    def up_normal(self) -> bool:
        return self.status == "U" and self.state == "N"


def parse_status(text: str) -> dict[str, RingMember]:
    """Ring members by address, from the output of `nodetool status`.

    Addresses may carry a port (`127.0.1.2:7000`); it is dropped.
    """
    members: dict[str, RingMember] = {}
    for line in text.splitlines():
        match = _STATUS_LINE.match(line.strip())
        if match:
            address = match["address"]
            if address.count(":") == 1:
                address = address.split(":", 1)[0]
            members[address] = RingMember(
                address=address, status=match["status"], state=match["state"]
            )
    return members


def nodetool(jmx_port: int, *args: str, timeout: float = 180, check: bool = True) -> str:
    """Run nodetool against the node whose JMX listens on 127.0.0.1:jmx_port; returns its stdout."""
    proc = run([*nodetool_argv(jmx_port), *args], timeout=timeout, check=False)
    if check and proc.returncode != 0:
        detail = (proc.stderr.strip() or proc.stdout.strip())[-1500:]
        raise SandboxError(
            f"nodetool {' '.join(args)} on JMX port {jmx_port} failed ({proc.returncode}): {detail}"
        )
    return proc.stdout
