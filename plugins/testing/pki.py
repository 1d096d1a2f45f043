"""A throw-away certificate authority for tests and the sandbox: a CA and the certificates it
issues (ECDSA P-256). Agents, coordinators and array simulators all take theirs from here.

    ca = TestCA.create("ringsnap test CA")
    ca.write_ca(tmp / "ca.pem")
    server = ca.issue("agent-node1", dns=["localhost"], ips=["127.0.0.1"])
    server_files = server.write(tmp, "agent")        # TlsPaths(cert, key)
    client = ca.issue("ringsnap-coordinator")
    creds = grpc.ssl_channel_credentials(ca.cert_pem, client.key_pem, client.cert_pem)

Every certificate is usable as server and as client (both extended key usages), so one helper
serves agents, coordinators, simulators and hostile clients alike. Never use these in production.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=2)


@dataclass(frozen=True)
class TlsPaths:
    cert: Path
    key: Path


@dataclass(frozen=True)
class IssuedCert:
    cert_pem: bytes
    #: Never in a repr: a failing test prints its fixtures (and the secrets check flags the key).
    key_pem: bytes = field(repr=False)

    def write(self, directory: Path, name: str) -> TlsPaths:
        """Write `<name>.crt` and `<name>.key` (mode 0600) into `directory`."""
        directory.mkdir(parents=True, exist_ok=True)
        cert, key = directory / f"{name}.crt", directory / f"{name}.key"
        cert.write_bytes(self.cert_pem)
        key.touch(mode=0o600)
        key.write_bytes(self.key_pem)
        return TlsPaths(cert, key)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


@dataclass(frozen=True)
class TestCA:
    key: ec.EllipticCurvePrivateKey = field(repr=False)
    cert: x509.Certificate

    __test__ = False  # not a pytest test class

    @classmethod
    def create(cls, common_name: str = "ringsnap test CA") -> TestCA:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(_name(common_name))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
            )
            .sign(key, hashes.SHA256())
        )
        return cls(key, cert)

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def write_ca(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.cert_pem)
        return path

    def issue(
        self,
        common_name: str | None,
        *,
        dns: Iterable[str] = (),
        ips: Iterable[str] = (),
        uris: Iterable[str] = (),
    ) -> IssuedCert:
        """A leaf certificate; `common_name=None` gives one with an empty subject (SANs only)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        alternatives: list[x509.GeneralName] = [x509.DNSName(name) for name in dns]
        alternatives += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        alternatives += [x509.UniformResourceIdentifier(uri) for uri in uris]
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name) if common_name else x509.Name([]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                critical=False,
            )
        )
        if alternatives:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(alternatives), critical=not common_name
            )
        cert = builder.sign(self.key, hashes.SHA256())
        return IssuedCert(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))
