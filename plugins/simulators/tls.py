"""A throw-away certificate authority for simulators served over TLS.

certs = make_test_ca(tmp_path)            # CA + server certificate for 127.0.0.1/localhost
SimulatorServer(app, tls=certs.server_tls)
# clients verify with certs.ca_file; a second make_test_ca() gives a CA they must reject
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

from ringsnap.plugins.simulators.server import ServerTls
from ringsnap.plugins.testing.pki import TestCA


@dataclass(frozen=True)
class TestCertificates:
    ca_file: Path
    cert_file: Path
    key_file: Path

    @property
    def server_tls(self) -> ServerTls:
        return ServerTls(self.cert_file, self.key_file)


def make_test_ca(
    directory: Path,
    *,
    hosts: tuple[str, ...] = ("127.0.0.1", "localhost"),
    name: str = "ringsnap test CA",
) -> TestCertificates:
    """Write `ca.pem`, `server.pem` (leaf then CA) and `server-key.pem` into `directory`."""
    ips, dns = [], []
    for host in hosts:
        try:
            ips.append(str(ipaddress.ip_address(host)))
        except ValueError:
            dns.append(host)
    ca = TestCA.create(name)
    leaf = ca.issue(hosts[0], dns=dns, ips=ips)
    ca_file = ca.write_ca(directory / "ca.pem")
    cert_file = directory / "server.pem"
    cert_file.write_bytes(leaf.cert_pem + ca.cert_pem)
    key_file = directory / "server-key.pem"
    key_file.touch(mode=0o600)
    key_file.write_bytes(leaf.key_pem)
    return TestCertificates(ca_file, cert_file, key_file)
