"""Certificates for TLS and mutual-TLS tests, made at test time with `cryptography`.

`make_tls_files(directory)` writes a CA, a server certificate (SAN IP:127.0.0.1 and
DNS:localhost, serverAuth), a client certificate (clientAuth) signed by the same CA, and a
second, unrelated CA for "untrusted" tests. Keys are EC P-256 (fast to make), certificates
are valid from one hour ago for one day. Everything is PEM; keys are unencrypted PKCS#8.

The session-scoped fixture `tls_files` makes them once per test run. A test module uses it
by importing it (pytest finds fixtures in the test module's namespace):

    from tests.certs import tls_files  # noqa: F401  (a fixture, used by name)

    def test_something(tls_files: TlsFiles) -> None:  # noqa: F811
        ...

or, for several modules, by importing it in a `conftest.py` the same way. For gRPC:

    server_creds = grpc.ssl_server_credentials(
        [(tls_files.server_key.read_bytes(), tls_files.server_cert.read_bytes())],
        root_certificates=tls_files.ca_cert.read_bytes(),
        require_client_auth=True,
    )
    channel_creds = grpc.ssl_channel_credentials(
        root_certificates=tls_files.ca_cert.read_bytes(),
        private_key=tls_files.client_key.read_bytes(),
        certificate_chain=tls_files.client_cert.read_bytes(),
    )
    grpc.secure_channel(f"127.0.0.1:{port}", channel_creds)  # SAN IP matches
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class TlsFiles:
    """Paths of PEM files made by `make_tls_files`."""

    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    #: A second CA that signed none of the above (for "untrusted" tests).
    other_ca_cert: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "pykka-delivery tests"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _validity(builder: x509.CertificateBuilder) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return builder.not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(
        now + datetime.timedelta(days=1)
    )


def _make_ca(common_name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = _new_key()
    name = _name(common_name)
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    builder = (
        _validity(x509.CertificateBuilder())
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
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
        .add_extension(ski, critical=False)
    )
    return key, builder.sign(key, hashes.SHA256())


def _make_leaf(
    common_name: str,
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    *,
    usage: x509.ObjectIdentifier,
    san: list[x509.GeneralName] | None = None,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = _new_key()
    builder = (
        _validity(x509.CertificateBuilder())
        .subject_name(_name(common_name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if san:
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def _write_cert(path: Path, cert: x509.Certificate) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> Path:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)
    return path


def make_tls_files(directory: Path) -> TlsFiles:
    """Write a CA, a server and a client certificate, and an unrelated CA, to `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = _make_ca("pykka-delivery test CA")
    server_key, server_cert = _make_leaf(
        "localhost",
        ca_key,
        ca_cert,
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
        san=[
            x509.IPAddress(ipaddress.IPv4Address("127.0.0.1")),
            x509.DNSName("localhost"),
        ],
    )
    client_key, client_cert = _make_leaf(
        "pykka-delivery test client",
        ca_key,
        ca_cert,
        usage=ExtendedKeyUsageOID.CLIENT_AUTH,
    )
    _other_key, other_ca_cert = _make_ca("pykka-delivery unrelated CA")
    return TlsFiles(
        ca_cert=_write_cert(directory / "ca.pem", ca_cert),
        server_cert=_write_cert(directory / "server.pem", server_cert),
        server_key=_write_key(directory / "server.key", server_key),
        client_cert=_write_cert(directory / "client.pem", client_cert),
        client_key=_write_key(directory / "client.key", client_key),
        other_ca_cert=_write_cert(directory / "other-ca.pem", other_ca_cert),
    )


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    """TLS files made once per test run (see the module docstring for how to use it)."""
    return make_tls_files(tmp_path_factory.mktemp("tls"))
