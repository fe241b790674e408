"""Certificates for TLS and mutual-TLS tests, made at test time with `trustme`.

`make_tls_files(directory)` writes a CA, a server certificate (SAN IP:127.0.0.1 and
DNS:localhost), a client certificate (SAN IP:127.0.0.1 and DNS:client.localhost, so that a
node on 127.0.0.1 can use it too: with mutual TLS a node's certificate must name the host
of its address) signed by the same CA, and a second, unrelated CA for "untrusted" tests.
trustme's leaf certificates serve both as server and as client certificates; keys are EC
P-256. Certificates are valid from one hour ago for one day. Everything is PEM.

`TlsFiles.issue(name, *identities)` writes one more certificate of the CA, for the
identities given (host names or IP addresses), and `TlsFiles.node_tls(...)` gives the
`TlsSettings` of a node using one.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trustme

from pykka_delivery.transport import TlsSettings


@dataclass(frozen=True)
class TlsFiles:
    """Paths of PEM files made by `make_tls_files`, and the CA to issue more."""

    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    #: A second CA that signed none of the above (for "untrusted" tests).
    other_ca_cert: Path
    ca: trustme.CA
    directory: Path

    def issue(self, name: str, *identities: str) -> tuple[Path, Path]:
        """A certificate of the CA for ``identities`` (host names, IP addresses), written
        as ``<name>.pem`` with its key ``<name>.key``: (certificate, key)."""
        return _write_leaf(self.ca, self.directory, name, identities, common_name=name)

    def node_tls(self, name: str, *identities: str, **options: Any) -> TlsSettings:
        """`TlsSettings` (mutual TLS, trusting the CA) of a node whose certificate names
        ``identities``; ``options`` are further `TlsSettings` fields."""
        cert, key = self.issue(name, *identities)
        return TlsSettings(cert, key, self.ca_cert, **options)


def _validity() -> dict[str, datetime.datetime]:
    now = datetime.datetime.now(datetime.UTC)
    return {
        "not_before": now - datetime.timedelta(hours=1),
        "not_after": now + datetime.timedelta(days=1),
    }


def _write_leaf(
    ca: trustme.CA,
    directory: Path,
    name: str,
    identities: tuple[str, ...],
    *,
    common_name: str,
) -> tuple[Path, Path]:
    leaf = ca.issue_cert(*identities, common_name=common_name, **_validity())
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    leaf.cert_chain_pems[0].write_to_path(str(cert))
    leaf.private_key_pem.write_to_path(str(key))
    key.chmod(0o600)
    return cert, key


def make_tls_files(directory: Path) -> TlsFiles:
    """Write a CA, a server and a client certificate, and an unrelated CA, to `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA(organization_name="pykka-delivery tests")
    other_ca = trustme.CA(organization_name="pykka-delivery unrelated CA")
    ca.cert_pem.write_to_path(str(directory / "ca.pem"))
    other_ca.cert_pem.write_to_path(str(directory / "other-ca.pem"))
    server_cert, server_key = _write_leaf(
        ca, directory, "server", ("127.0.0.1", "localhost"), common_name="localhost"
    )
    client_cert, client_key = _write_leaf(
        ca,
        directory,
        "client",
        ("127.0.0.1", "client.localhost"),
        common_name="pykka-delivery test client",
    )
    return TlsFiles(
        ca_cert=directory / "ca.pem",
        server_cert=server_cert,
        server_key=server_key,
        client_cert=client_cert,
        client_key=client_key,
        other_ca_cert=directory / "other-ca.pem",
        ca=ca,
        directory=directory,
    )


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    """TLS files made once per test run (see the module docstring for how to use it)."""
    return make_tls_files(tmp_path_factory.mktemp("tls"))
