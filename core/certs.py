"""What is wrong with a TLS certificate, its key and its CA, before a handshake finds out.

Used by the `check` commands, so that an operator learns of an expired or mismatched certificate
from a command that names the file, not from a refused connection in the middle of a backup.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

#: A certificate that expires sooner than this is reported (as a warning).
EXPIRY_WARNING = timedelta(days=30)


@dataclass
class CertificateReport:
    subject: str = ""
    not_after: datetime | None = None
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def inspect(
    cert_pem: bytes,
    key_pem: bytes,
    ca_pem: bytes,
    *,
    now: datetime | None = None,
    issuer_required: bool = True,
) -> CertificateReport:
    """Expiry, key match and issuer of `cert_pem`; never raises for bad input, reports it.

    `issuer_required=False` when the CA file is for checking the peers, not this certificate
    (one CA for both is usual, so a different issuer is then a warning, not an error).
    """
    report = CertificateReport()
    now = now or datetime.now(UTC)
    try:
        certificate = x509.load_pem_x509_certificate(cert_pem)
    except ValueError as exc:
        report.errors.append(f"the certificate is not a PEM X.509 certificate ({exc})")
        return report
    report.subject = certificate.subject.rfc4514_string()
    report.not_after = certificate.not_valid_after_utc
    if now < certificate.not_valid_before_utc:
        report.errors.append(
            f"the certificate is not valid before {certificate.not_valid_before_utc:%Y-%m-%d %H:%M} UTC"
        )
    if now >= certificate.not_valid_after_utc:
        report.errors.append(
            f"the certificate expired on {certificate.not_valid_after_utc:%Y-%m-%d %H:%M} UTC; renew it"
        )
    elif certificate.not_valid_after_utc - now < EXPIRY_WARNING:
        report.warnings.append(
            f"the certificate expires on {certificate.not_valid_after_utc:%Y-%m-%d %H:%M} UTC; renew it soon"
        )
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as exc:
        report.errors.append(f"the private key cannot be read ({exc})")
    else:
        if key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        ) != certificate.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        ):
            report.errors.append("the private key does not belong to the certificate")
    try:
        authorities = x509.load_pem_x509_certificates(ca_pem)
    except ValueError as exc:
        report.errors.append(f"the CA file holds no PEM certificate ({exc})")
        return report
    if not any(_issued_by(certificate, authority) for authority in authorities):
        (report.errors if issuer_required else report.warnings).append(
            "the certificate was not issued by a certificate of the CA file; peers that trust"
            " only that CA will refuse it"
        )
    return report


def _issued_by(certificate: x509.Certificate, authority: x509.Certificate) -> bool:
    try:
        certificate.verify_directly_issued_by(authority)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True
