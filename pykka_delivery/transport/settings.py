"""Settings of a transport node: one frozen dataclass, every limit and timeout named."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path

from pykka_delivery._fields import check_field_types

__all__ = ["NodeSettings", "TlsSettings"]


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """TLS for a node's server and for the links it opens (PEM file paths).

    Attributes:
        cert_chain: this node's certificate (chain); used by its server and, for mutual
            TLS, presented by its client side.
        private_key: the key of ``cert_chain``.
        root_certificates: the CA(s) this node trusts for the other side's certificate.
        require_client_auth: mutual TLS: the server refuses clients without a certificate
            signed by ``root_certificates``. Default True.
        server_name_override: the name to check the server's certificate against when it
            differs from the dialled host (tests, IP addresses without a SAN). Default none.
        verify_peer_address: with mutual TLS (``require_client_auth``), a node accepts a
            link only if the node address its opener claims (``host:port``, its advertised
            address) has a host the opener's certificate names: an IP or DNS subject
            alternative name (``*.`` wildcards as in HTTPS), or the common name of a
            certificate without any. Others are refused with ``PERMISSION_DENIED`` and
            counted in ``rejected_links``. Default True; False lets any peer with a
            certificate of ``root_certificates`` claim any address.
    """

    cert_chain: Path
    private_key: Path
    root_certificates: Path
    require_client_auth: bool = True
    server_name_override: str | None = None
    verify_peer_address: bool = True

    def read(self) -> tuple[bytes, bytes, bytes]:
        """(certificate chain, private key, root certificates) as bytes.

        Raises:
            ValueError: a file is missing or unreadable, naming the setting and the path.
        """
        out = []
        for name in ("cert_chain", "private_key", "root_certificates"):
            path = Path(getattr(self, name))
            try:
                out.append(path.read_bytes())
            except OSError as error:
                msg = f"TlsSettings.{name}: cannot read {path}: {error.strerror}"
                raise ValueError(msg) from error
        return out[0], out[1], out[2]


@dataclass(frozen=True, slots=True)
class NodeSettings:
    """Settings of a transport `Node`.

    Attributes:
        host: the interface the node's gRPC server binds to. Default 127.0.0.1.
        port: its port; 0 (the default) picks a free one (see ``Node.address``).
        advertised_address: the ``host:port`` other nodes use to reach this one, when it
            differs from the bound one (behind a proxy, NAT or port mapping); it is what
            this node's refs and its ``Hello`` carry. Default: the bound address.
        tls: TLS (and mutual TLS) settings; None means plaintext, which is allowed only
            on a loopback host unless ``allow_insecure`` is set.
        allow_insecure: permit plaintext on a non-loopback host. Default False.
        token: a shared secret every link must present (gRPC metadata
            ``authorization: Bearer <token>``), compared in constant time. Default none.
        max_message_bytes: largest frame sent or accepted on a link. Default 4 MiB. A
            single message larger than this is refused with an error naming this setting
            (use ``chunk_large_messages`` for large payloads).
        max_batch: most messages put in one frame. Default 500.
        linger: how long the writer waits for more messages after the previous write
            completed before sending a frame that is not full, in seconds. Default 0:
            hand the open batch over as soon as the writer is free.
        yield_after: how long a message queued by an application thread that goes on
            running may wait for the node's thread, in seconds, before that application
            thread hands it the GIL (``time.sleep(0)``); without this, the node's thread
            can wait for Python's whole switch interval (5 ms). Flow-control messages
            (`Request`, `Resend`, `Ack`, `RegisterConsumer`) hand it over at once, since
            the other side waits for them; data messages are left to gather into a batch.
            The clock is looked at every 16th message queued, so the wait may run 16
            messages longer. Default 0.001 (shorter gathers smaller batches: more writes,
            more CPU).
        max_pending: most messages queued for a peer that is not connected; beyond it the
            oldest are dropped (and counted): the delivery protocol resends what matters.
            Default 100 000.
        keepalive_time: seconds between HTTP/2 keepalive pings on an idle link. Default 10.
        keepalive_timeout: seconds to wait for a ping's answer before the link is
            considered lost. Default 5.
        reconnect_backoff_min / reconnect_backoff_max: first and largest delay between
            attempts to re-open a link, doubling with ±20 % jitter. Defaults 0.1 s and 5 s.
        connect_timeout: how long one attempt to open a link may take. Default 5 s.
        shutdown_grace: seconds given to in-flight calls when the node stops (on the
            caller's loop, then again to the completions gRPC still owes that loop).
            Default 1.
        unknown_target_report_interval: a node that drops envelopes for a name nothing is
            exposed under tells the sending node so (which names it in its handles'
            timeouts), at most once per name and link in this many seconds. Default 1.
    """

    host: str = "127.0.0.1"
    port: int = 0
    advertised_address: str | None = None
    tls: TlsSettings | None = None
    allow_insecure: bool = False
    token: str | None = field(default=None, repr=False)
    max_message_bytes: int = 4 * 1024 * 1024
    max_batch: int = 500
    linger: float = 0.0
    yield_after: float = 0.001
    max_pending: int = 100_000
    keepalive_time: float = 10.0
    keepalive_timeout: float = 5.0
    reconnect_backoff_min: float = 0.1
    reconnect_backoff_max: float = 5.0
    connect_timeout: float = 5.0
    shutdown_grace: float = 1.0
    unknown_target_report_interval: float = 1.0

    def __post_init__(self) -> None:
        check_field_types(self)
        checks = [
            (0 <= self.port <= 65535, f"port must be 0..65535, got {self.port}"),
            (self.max_message_bytes >= 1024, "max_message_bytes must be at least 1024"),
            (self.max_batch >= 1, f"max_batch must be at least 1, got {self.max_batch}"),
            (self.linger >= 0, f"linger must be >= 0 seconds, got {self.linger}"),
            (self.yield_after >= 0, f"yield_after must be >= 0 seconds, got {self.yield_after}"),
            (self.max_pending >= 1, f"max_pending must be at least 1, got {self.max_pending}"),
            (self.keepalive_time > 0, "keepalive_time must be above 0 seconds"),
            (self.keepalive_timeout > 0, "keepalive_timeout must be above 0 seconds"),
            (
                0 < self.reconnect_backoff_min <= self.reconnect_backoff_max,
                "reconnect_backoff_min must be above 0 and at most reconnect_backoff_max",
            ),
            (self.connect_timeout > 0, "connect_timeout must be above 0 seconds"),
            (
                self.unknown_target_report_interval > 0,
                "unknown_target_report_interval must be above 0 seconds",
            ),
            (self.token is None or len(self.token) > 0, "token must not be empty"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(msg)
        if self.tls is None and not self.allow_insecure and not _is_loopback(self.host):
            msg = (
                f"NodeSettings: plaintext on {self.host!r} would expose the link to the "
                "network: set tls=TlsSettings(...), or allow_insecure=True if you mean it"
            )
            raise ValueError(msg)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
