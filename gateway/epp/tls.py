"""The gRPC server's TLS identity: a certificate from ``--cert-path``, or a self-signed one made at start.

Gateways (Envoy Gateway, Istio, agentgateway) connect to an Endpoint Picker over TLS without verifying
it, so a fresh self-signed certificate is what GIE's pickers serve by default.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gateway.errors import ConfigError


@dataclass(frozen=True, slots=True)
class TlsIdentity:
    """A PEM private key and its certificate chain."""

    key_pem: bytes
    cert_pem: bytes


def self_signed(common_name: str = "kvgate-epp", *, days: int = 365) -> TlsIdentity:
    """A new EC P-256 key and a self-signed certificate for it (SANs: localhost, 127.0.0.1)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    san = x509.SubjectAlternativeName(
        [
            x509.DNSName(common_name),
            x509.DNSName("localhost"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        ]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(san, critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return TlsIdentity(key_pem, cert.public_bytes(serialization.Encoding.PEM))


def load_identity(cert_dir: str) -> TlsIdentity:
    """``tls.key`` and ``tls.crt`` from ``cert_dir`` (a Kubernetes TLS secret's layout).

    Raises:
        ConfigError: either file cannot be read.
    """
    base = Path(cert_dir)
    try:
        return TlsIdentity((base / "tls.key").read_bytes(), (base / "tls.crt").read_bytes())
    except OSError as exc:
        raise ConfigError(
            f"--cert-path {cert_dir!r}: cannot read tls.key / tls.crt ({exc.strerror})"
        ) from None
