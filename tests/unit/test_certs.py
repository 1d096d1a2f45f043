"""Certificate inspection for the `check` commands: every problem named, nothing raised."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from ringsnap.certs import inspect
from ringsnap.plugins.testing.pki import TestCA


def test_a_good_certificate_has_no_errors_and_one_that_expires_soon_warns() -> None:
    ca = TestCA.create()
    leaf = ca.issue("ringsnap-agent")
    report = inspect(leaf.cert_pem, leaf.key_pem, ca.cert_pem)
    assert report.errors == []
    assert report.subject == "CN=ringsnap-agent"
    assert [w for w in report.warnings if "renew it soon" in w]  # test certificates live 2 days


def test_expired_and_not_yet_valid() -> None:
    ca = TestCA.create()
    leaf = ca.issue("ringsnap-agent")
    later = inspect(
        leaf.cert_pem, leaf.key_pem, ca.cert_pem, now=datetime.now(UTC) + timedelta(days=30)
    )
    assert any("expired on" in e for e in later.errors)
    earlier = inspect(
        leaf.cert_pem, leaf.key_pem, ca.cert_pem, now=datetime.now(UTC) - timedelta(days=1)
    )
    assert any("not valid before" in e for e in earlier.errors)


def test_wrong_key_wrong_ca_and_garbage() -> None:
    ca, other_ca = TestCA.create(), TestCA.create("another CA")
    leaf, stranger = ca.issue("ringsnap-agent"), ca.issue("someone-else")
    assert inspect(leaf.cert_pem, stranger.key_pem, ca.cert_pem).errors == [
        "the private key does not belong to the certificate"
    ]
    (error,) = inspect(leaf.cert_pem, leaf.key_pem, other_ca.cert_pem).errors
    assert "not issued by a certificate of the CA file" in error
    # A bundle that holds the issuer among others is fine.
    assert inspect(leaf.cert_pem, leaf.key_pem, other_ca.cert_pem + ca.cert_pem).errors == []
    assert "not a PEM X.509 certificate" in inspect(b"junk", leaf.key_pem, ca.cert_pem).errors[0]
    assert "cannot be read" in inspect(leaf.cert_pem, b"junk", ca.cert_pem).errors[0]
    assert "holds no PEM certificate" in inspect(leaf.cert_pem, leaf.key_pem, b"junk").errors[0]
