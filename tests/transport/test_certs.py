"""Tests of tests/certs.py (trustme): the files make a working mutual-TLS gRPC setup, and only
that."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tests.certs import TlsFiles, tls_files  # noqa: F401  (tls_files is a fixture)

WAIT = 5.0
SERVING = health_pb2.HealthCheckResponse.SERVING


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


@pytest.fixture(scope="module")
def mtls_port(tls_files: TlsFiles) -> Iterator[int]:  # noqa: F811
    credentials = grpc.ssl_server_credentials(
        [(tls_files.server_key.read_bytes(), tls_files.server_cert.read_bytes())],
        root_certificates=tls_files.ca_cert.read_bytes(),
        require_client_auth=True,
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    yield port
    server.stop(grace=None).wait(WAIT)


def check(port: int, credentials: grpc.ChannelCredentials, **options: str) -> int:
    with grpc.secure_channel(f"127.0.0.1:{port}", credentials, list(options.items())) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        return stub.Check(health_pb2.HealthCheckRequest(), timeout=WAIT).status  # type: ignore[no-any-return]


def client_credentials(
    files: TlsFiles, *, trust: str = "ca", with_cert: bool = True
) -> grpc.ChannelCredentials:
    root = (files.ca_cert if trust == "ca" else files.other_ca_cert).read_bytes()
    if not with_cert:
        return grpc.ssl_channel_credentials(root_certificates=root)
    return grpc.ssl_channel_credentials(
        root_certificates=root,
        private_key=files.client_key.read_bytes(),
        certificate_chain=files.client_cert.read_bytes(),
    )


def test_a_client_with_the_ca_and_a_client_cert_gets_serving(
    tls_files: TlsFiles,  # noqa: F811
    mtls_port: int,
) -> None:
    assert check(mtls_port, client_credentials(tls_files)) == SERVING


def test_the_server_cert_is_valid_for_localhost_as_well(
    tls_files: TlsFiles,  # noqa: F811
    mtls_port: int,
) -> None:
    creds = client_credentials(tls_files)
    assert check(mtls_port, creds, **{"grpc.ssl_target_name_override": "localhost"}) == SERVING


def test_a_client_without_a_client_cert_is_refused(
    tls_files: TlsFiles,  # noqa: F811
    mtls_port: int,
) -> None:
    with pytest.raises(grpc.RpcError) as info:
        check(mtls_port, client_credentials(tls_files, with_cert=False))
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_a_client_trusting_only_the_other_ca_is_refused(
    tls_files: TlsFiles,  # noqa: F811
    mtls_port: int,
) -> None:
    with pytest.raises(grpc.RpcError) as info:
        check(mtls_port, client_credentials(tls_files, trust="other"))
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_a_server_name_outside_the_san_is_refused(
    tls_files: TlsFiles,  # noqa: F811
    mtls_port: int,
) -> None:
    creds = client_credentials(tls_files)
    with pytest.raises(grpc.RpcError) as info:
        check(mtls_port, creds, **{"grpc.ssl_target_name_override": "example.invalid"})
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_the_server_cert_san_has_ip_127_0_0_1_and_dns_localhost(
    tls_files: TlsFiles,  # noqa: F811
) -> None:
    san = load(tls_files.server_cert).extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    )
    assert ipaddress.IPv4Address("127.0.0.1") in san.value.get_values_for_type(x509.IPAddress)
    assert "localhost" in san.value.get_values_for_type(x509.DNSName)


def test_the_client_cert_san_has_ip_127_0_0_1_so_a_node_can_use_it(
    tls_files: TlsFiles,  # noqa: F811
) -> None:
    san = load(tls_files.client_cert).extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    )
    assert ipaddress.IPv4Address("127.0.0.1") in san.value.get_values_for_type(x509.IPAddress)


def test_the_leaf_certs_are_signed_by_the_ca_with_the_right_usages(
    tls_files: TlsFiles,  # noqa: F811
) -> None:
    ca = load(tls_files.ca_cert)
    for path, usage in (
        (tls_files.server_cert, ExtendedKeyUsageOID.SERVER_AUTH),
        (tls_files.client_cert, ExtendedKeyUsageOID.CLIENT_AUTH),
    ):
        cert = load(path)
        cert.verify_directly_issued_by(ca)  # raises if not
        eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert usage in list(eku)
        assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        key = cert.public_key()
        assert isinstance(key, ec.EllipticCurvePublicKey)
        assert isinstance(key.curve, ec.SECP256R1)


def test_the_other_ca_signed_none_of_the_leaf_certs(
    tls_files: TlsFiles,  # noqa: F811
) -> None:
    other = load(tls_files.other_ca_cert)
    ca = load(tls_files.ca_cert)
    assert other.public_key() != ca.public_key()
    for path in (tls_files.server_cert, tls_files.client_cert):
        with pytest.raises(ValueError):  # issuer name does not match
            load(path).verify_directly_issued_by(other)


def test_the_leaf_certs_are_valid_from_an_hour_ago_for_a_day(
    tls_files: TlsFiles,  # noqa: F811
) -> None:
    now = datetime.datetime.now(datetime.UTC)
    for path in (tls_files.server_cert, tls_files.client_cert):
        cert = load(path)
        # Session-scoped files may have been made a while before this test runs.
        assert now - datetime.timedelta(hours=2) < cert.not_valid_before_utc
        assert cert.not_valid_before_utc <= now - datetime.timedelta(minutes=59)
        lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
        assert lifetime == datetime.timedelta(days=1, hours=1)


def test_the_key_files_are_private_pem_keys_matching_their_certs(
    tls_files: TlsFiles,  # noqa: F811
) -> None:
    for cert_path, key_path in (
        (tls_files.server_cert, tls_files.server_key),
        (tls_files.client_cert, tls_files.client_key),
    ):
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        assert key.public_key() == load(cert_path).public_key()
        assert key_path.stat().st_mode & 0o077 == 0
