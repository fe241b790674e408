"""Mutual TLS: does the node address a peer claims match its certificate?

A link's opener says who it is in its first frame (``Hello``: its ``host:port``), and the
accepting node then sends that address's messages back on the link. With mutual TLS the
claim is checked against the peer's certificate, so that a peer holding a certificate of
the cluster's CA (and the token) cannot pose as another node.

The rule is the one a TLS client applies to a server's name, so the certificate a node
already serves with proves its claim:

* the claimed host is an IP address: it must equal one of the certificate's IP subject
  alternative names;
* it is a DNS name: it must equal one of the certificate's DNS subject alternative names
  (ignoring case), where a name starting with ``*.`` stands for any one leftmost label;
* only a certificate with no subject alternative name at all is matched by its common
  name (as gRPC does for a server's name).

The port is not part of a certificate: nodes sharing a host share its identity.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping

__all__ = ["certificate_names", "claim_problem"]

_SAN = "x509_subject_alternative_name"
_CN = "x509_common_name"


def certificate_names(auth_context: Mapping[str, Iterable[bytes]]) -> list[str]:
    """The names a peer's certificate is valid for, from gRPC's ``auth_context()``: its
    subject alternative names, else its common name."""
    names = [value.decode(errors="replace") for value in auth_context.get(_SAN, ())]
    if not names:
        names = [value.decode(errors="replace") for value in auth_context.get(_CN, ())]
    return names


def _host_of(address: str) -> str:
    host = address.rpartition(":")[0] or address
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def _as_ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _dns_matches(pattern: str, host: str) -> bool:
    pattern, host = pattern.lower().rstrip("."), host.lower().rstrip(".")
    if pattern.startswith("*."):
        label, _, rest = host.partition(".")
        return bool(label) and rest == pattern[2:]
    return pattern == host


def _matches(host: str, names: list[str]) -> bool:
    ip = _as_ip(host)
    if ip is not None:
        return any(_as_ip(name) == ip for name in names)
    return any(_as_ip(name) is None and _dns_matches(name, host) for name in names)


def claim_problem(claimed: str, auth_context: Mapping[str, Iterable[bytes]]) -> str | None:
    """None if the peer's certificate (gRPC's ``auth_context()`` of its call) is valid
    for the host of ``claimed`` (``host:port``, the peer's ``Hello``), else why not, naming
    the claim, the certificate's names and the fix."""
    names = certificate_names(auth_context)
    if _matches(_host_of(claimed), names):
        return None
    shown = ", ".join(names) if names else "no host"
    return (
        f"the peer claims to be node {claimed!r} but its certificate names {shown}: a "
        "node's certificate must name the host of its advertised address (a DNS or IP "
        "subject alternative name), or set TlsSettings.verify_peer_address=False"
    )
