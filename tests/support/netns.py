"""A network namespace joined to the host by a veth pair, for partition tests.

    with Namespace.create("rs-part-agent", subnet=0) as ns:   # host 10.231.0.1, inside 10.231.0.2
        process = ns.popen([...])     # runs inside; killed at exit
        ns.cut()                      # every packet on the pair dropped (a partition)
        ns.heal()                     # the link works again
        ns.lossy(0.4)                 # 40 % of the packets dropped each way
        ns.slow("200kbit")            # a token bucket (tc tbf) each way
        ns.forward(8443)              # <address>:8443 reaches 127.0.0.1:8443 inside

Addresses come from the test-only 10.231.0.0/24, one /30 per namespace (`subnet` n gives
10.231.0.(4n+1) on the host and 10.231.0.(4n+2) inside), so test traffic crosses only the pair the
test made. The faults are iptables rules in the namespace's own tables (`-m statistic` for loss;
netem is not available on the test bed). Everything is removed on exit, also after a failure:
processes started inside, the namespace, the host end of the pair.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

SUBNET_PREFIX = "10.231.0."


def unavailable_reason() -> str | None:
    """Why namespaces with a veth pair and iptables cannot be made here, or None if they can."""
    if os.geteuid() != 0:
        return "needs root (ip netns, veth pairs, iptables)"
    for tool in ("ip", "iptables", "sysctl", "tc"):
        if shutil.which(tool) is None:
            return f"needs the {tool} command (Debian: iproute2, iptables, procps)"
    probe = f"rs-probe-{os.getpid()}"
    made = subprocess.run(
        ["ip", "netns", "add", probe], check=False, capture_output=True, text=True
    )
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    try:
        veth = subprocess.run(
            ["ip", "-n", probe, "link", "add", "p0", "type", "veth", "peer", "name", "p1"],
            check=False,
            capture_output=True,
            text=True,
        )
        if veth.returncode != 0:
            return f"cannot create a veth pair: {veth.stderr.strip()}"
        rule = subprocess.run(
            [
                *("ip", "netns", "exec", probe, "iptables", "-A", "INPUT", "-m", "statistic"),
                *("--mode", "random", "--probability", "0.5", "-j", "DROP"),
            ],
            check=False,
            capture_output=True,
            text=True,
        )
        if rule.returncode != 0:
            return f"iptables -m statistic does not work in a namespace: {rule.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], check=False, capture_output=True)
    return None


def _run(argv: Sequence[str]) -> None:
    result = subprocess.run(list(argv), check=False, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {result.stderr.strip()}")


@dataclass
class Namespace:
    name: str
    #: The pair's ends: on the host, and inside.
    host_link: str
    link: str
    host_address: str
    address: str
    _processes: list[subprocess.Popen[Any]] = field(default_factory=list)

    @classmethod
    def create(cls, name: str, *, subnet: int) -> Namespace:
        if not 0 <= subnet < 64:
            raise ValueError("subnet is 0..63 (one /30 of 10.231.0.0/24 each)")
        tag = f"rs{os.getpid() % 100000}n{subnet}"  # interface names: 15 characters at most
        ns = cls(
            name,
            f"{tag}h",
            f"{tag}i",
            f"{SUBNET_PREFIX}{4 * subnet + 1}",
            f"{SUBNET_PREFIX}{4 * subnet + 2}",
        )
        try:
            _run(["ip", "netns", "add", name])
            _run(["ip", "link", "add", ns.host_link, "type", "veth", "peer", "name", ns.link])
            _run(["ip", "link", "set", ns.link, "netns", name])
            _run(["ip", "addr", "add", f"{ns.host_address}/30", "dev", ns.host_link])
            _run(["ip", "link", "set", ns.host_link, "up"])
            ns.inside(["ip", "link", "set", "lo", "up"])
            ns.inside(["ip", "addr", "add", f"{ns.address}/30", "dev", ns.link])
            ns.inside(["ip", "link", "set", ns.link, "up"])
        except BaseException:
            ns.remove()
            raise
        return ns

    def inside(self, argv: Sequence[str]) -> None:
        """Run a command inside; raise if it fails."""
        _run(["ip", "netns", "exec", self.name, *argv])

    def popen(self, argv: Sequence[str], **options: Any) -> subprocess.Popen[Any]:
        """Start a process inside (in its own process group); it is killed at exit."""
        process = subprocess.Popen(
            ["ip", "netns", "exec", self.name, *argv], start_new_session=True, **options
        )
        self._processes.append(process)
        return process

    # -- faults ------------------------------------------------------------------------------------

    def cut(self) -> None:
        """Drop every packet crossing the pair, both ways: to either side the other has vanished."""
        self.heal()
        self.inside(["iptables", "-A", "INPUT", "-i", self.link, "-j", "DROP"])
        self.inside(["iptables", "-A", "OUTPUT", "-o", self.link, "-j", "DROP"])

    def lossy(self, probability: float) -> None:
        """Drop each packet crossing the pair with `probability`, each way independently."""
        self.heal()
        chance = ["-m", "statistic", "--mode", "random", "--probability", f"{probability:g}"]
        self.inside(["iptables", "-A", "INPUT", "-i", self.link, *chance, "-j", "DROP"])
        self.inside(["iptables", "-A", "OUTPUT", "-o", self.link, *chance, "-j", "DROP"])

    def slow(self, rate: str, *, latency: str = "2s") -> None:
        """Shape the pair to `rate` (tc's units, e.g. "200kbit") each way with a token bucket
        (tbf): packets queue up to `latency`, then drop. A slow link, not a dead one."""
        self.heal()
        for prefix, link in ((["ip", "netns", "exec", self.name], self.link), ([], self.host_link)):
            _run(
                [
                    *prefix,
                    *("tc", "qdisc", "replace", "dev", link, "root", "tbf"),
                    *("rate", rate, "burst", "4kb", "latency", latency),
                ]
            )

    def heal(self) -> None:
        """Remove every fault (the namespace's filter table holds nothing else; the pair's
        qdiscs go back to the default)."""
        self.inside(["iptables", "-F", "INPUT"])
        self.inside(["iptables", "-F", "OUTPUT"])
        for prefix, link in ((["ip", "netns", "exec", self.name], self.link), ([], self.host_link)):
            subprocess.run(
                [*prefix, "tc", "qdisc", "del", "dev", link, "root"],
                check=False,
                capture_output=True,
            )

    def forward(self, port: int) -> None:
        """Let `address:port` reach a server bound to 127.0.0.1:port inside (servers that bind
        loopback only, like the array simulators)."""
        self.inside(["sysctl", "-qw", "net.ipv4.conf.all.route_localnet=1"])
        self.inside(
            [
                *("iptables", "-t", "nat", "-A", "PREROUTING", "-d", self.address, "-p", "tcp"),
                *("--dport", str(port), "-j", "DNAT", "--to-destination", f"127.0.0.1:{port}"),
            ]
        )

    # -- teardown ----------------------------------------------------------------------------------

    def remove(self) -> None:
        """Kill what runs inside, delete the namespace and the host end; never raises."""
        for process in self._processes:
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGTERM)
                    process.wait(10)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    if process.poll() is None:
                        os.killpg(process.pid, signal.SIGKILL)
                        process.wait(10)
        self._processes.clear()
        subprocess.run(["ip", "netns", "del", self.name], check=False, capture_output=True)
        subprocess.run(["ip", "link", "del", self.host_link], check=False, capture_output=True)

    def __enter__(self) -> Namespace:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.remove()
