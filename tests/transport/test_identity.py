"""The mutual-TLS rule of transport/identity.py on its own: which claimed node addresses a
certificate (as gRPC's ``auth_context()`` shows it) names."""

from __future__ import annotations

from pykka_delivery.transport.identity import certificate_names, claim_problem


def context(*sans: str, cn: str = "node") -> dict[str, list[bytes]]:
    """An ``auth_context()`` as gRPC gives it for a certificate with these SANs and CN."""
    ctx = {"x509_common_name": [cn.encode()], "transport_security_type": [b"ssl"]}
    if sans:
        ctx["x509_subject_alternative_name"] = [san.encode() for san in sans]
    return ctx


def test_an_ip_address_named_by_an_ip_san_matches() -> None:
    assert claim_problem("10.0.0.7:7001", context("node-b.test", "10.0.0.7")) is None


def test_an_ipv6_address_matches_its_san_written_another_way() -> None:
    assert claim_problem("[::1]:7001", context("0:0:0:0:0:0:0:1")) is None


def test_a_dns_name_matches_its_san_ignoring_case() -> None:
    assert claim_problem("Node-B.Test:7001", context("node-b.test")) is None


def test_a_wildcard_san_matches_one_leftmost_label_only() -> None:
    ctx = context("*.nodes.test")

    assert claim_problem("a.nodes.test:1", ctx) is None
    assert claim_problem("a.b.nodes.test:1", ctx) is not None
    assert claim_problem("nodes.test:1", ctx) is not None


def test_an_ip_address_is_not_matched_by_a_dns_san_spelling_it() -> None:
    # "*.0.0.7" would match "10.0.0.7" as a DNS name: an IP claim is compared as an IP only.
    assert claim_problem("10.0.0.7:1", context("10.0.0.8", "*.0.0.7", "other.test")) is not None


def test_a_dns_name_is_not_matched_by_another_name() -> None:
    assert claim_problem("node-a.test:1", context("node-b.test")) is not None


def test_the_port_plays_no_part() -> None:
    ctx = context("127.0.0.1")

    assert claim_problem("127.0.0.1:1", ctx) is None
    assert claim_problem("127.0.0.1:65535", ctx) is None


def test_the_common_name_counts_only_without_any_san() -> None:
    assert claim_problem("legacy.test:1", context(cn="legacy.test")) is None
    assert claim_problem("legacy.test:1", context("other.test", cn="legacy.test")) is not None
    assert certificate_names(context("other.test", cn="legacy.test")) == ["other.test"]


def test_a_refusal_names_the_claim_the_certificate_and_the_fix() -> None:
    problem = claim_problem("10.0.0.9:7001", context("node-b.test", "10.0.0.7"))

    assert problem is not None
    assert "claims to be node '10.0.0.9:7001'" in problem
    assert "node-b.test, 10.0.0.7" in problem
    assert "TlsSettings.verify_peer_address=False" in problem


def test_a_certificate_without_names_matches_nothing() -> None:
    problem = claim_problem("127.0.0.1:1", {"transport_security_type": [b"ssl"]})

    assert problem is not None
    assert "certificate names no host" in problem
