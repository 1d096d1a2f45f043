"""Objects that hold a private key show no key material in their repr or str: a failing test prints
its fixtures and locals, an error message or a log line may format the object, and either would
put the key in CI output (the test PKI's keys and the product's own TLS keys alike)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from ringsnap.config import TlsFiles, validate
from ringsnap.coordinator.agents.connection import ClientTls
from ringsnap.coordinator.api import access
from ringsnap.coordinator.api.listeners import RemoteListener
from ringsnap.coordinator.cli.client import RemoteTls, Target
from ringsnap.plugins.testing.pki import TestCA
from ringsnap.sandbox.agents import TestPki
from tests.support import secrets


def _pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _key_lines(key_pem: bytes) -> secrets.SecretRegistry:
    """A registry that finds any line of the key's body (as the secrets check does)."""
    registry = secrets.SecretRegistry()
    registry.register(key_pem, "the private key")
    return registry


def _assert_no_key(obj: object, *keys: bytes) -> None:
    for text in (repr(obj), str(obj)):
        assert "PRIVATE KEY" not in text, text
        for key in keys:
            assert _key_lines(key).scan(text, "repr") == [], f"{type(obj).__name__} shows its key"


@pytest.fixture(scope="module")
def ca() -> TestCA:
    return TestCA.create()


def test_the_test_pki_shows_no_private_key(ca: TestCA, tmp_path: Path) -> None:
    issued = ca.issue("ringsnap-agent")
    ca_key = _pem(ca.key)
    _assert_no_key(ca, ca_key)
    _assert_no_key(issued, issued.key_pem)
    pki = TestPki.create(tmp_path)
    _assert_no_key(pki, _pem(pki.ca.key), pki.client.key_pem)
    # The certificate itself is public: still shown, so a failure says which one it was.
    assert issued.cert_pem.decode().splitlines()[1] in repr(issued)


def test_the_products_tls_types_show_no_private_key(ca: TestCA, tmp_path: Path) -> None:
    issued = ca.issue("ringsnap-coordinator")
    paths = issued.write(tmp_path, "coordinator")
    ca_file = ca.write_ca(tmp_path / "ca.crt")
    key = issued.key_pem
    client_tls = ClientTls.from_files(paths.cert, paths.key, ca_file)
    remote_tls = RemoteTls(issued.cert_pem, key, ca.cert_pem, "coordinator.example")
    target = Target("10.0.0.1:7444", tmp_path / "api.token", "--coordinator", remote_tls)
    listener = RemoteListener(
        "127.0.0.1:7445", issued.cert_pem, key, ca.cert_pem, {"alice": access.Role.OPERATOR}
    )
    files = validate(
        {"cert_file": str(paths.cert), "key_file": str(paths.key), "ca_file": str(ca_file)},
        TlsFiles,
        source="<test>",
    )
    assert files.key_file.get_secret_value().strip() == key.decode().strip()  # it holds the key
    for holder in (client_tls, remote_tls, target, listener, files):
        _assert_no_key(holder, key)
