"""Settings of the coordinator's gRPC service and of its clients: every limit and timeout
named, with its default. Durations are seconds."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from pykka_delivery._fields import check_field_types
from pykka_delivery.transport.settings import TlsSettings, _is_loopback

__all__ = [
    "LEADER_METADATA_KEY",
    "CoordinatorClientSettings",
    "CoordinatorServerSettings",
    "coordinator_addresses",
]

_MAX_MESSAGE_BYTES = 2**31 - 1  # gRPC's options are 32-bit

LEADER_METADATA_KEY = "pykka-delivery-leader"
"""Trailing metadata of a follower's UNAVAILABLE: the leader's ``host:port``."""


def coordinator_addresses(address: str | Sequence[str]) -> tuple[str, ...]:
    """The coordinator addresses a client is given: one ``host:port``, several separated
    by commas (``"a:1,b:2,c:3"``), or a sequence of them.

    Raises:
        ValueError: none given, or an empty one (``"a:1,,b:2"``).
    """
    parts = address.split(",") if isinstance(address, str) else list(address)
    addresses = tuple(part.strip() for part in parts)
    if not addresses or not all(addresses):
        msg = (
            f"coordinator address {address!r}: give host:port, or several separated by "
            "commas (every coordinator replica's), none empty"
        )
        raise ValueError(msg)
    return addresses


def _check_durations(owner: object, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(owner, name)
        if not (isinstance(value, int | float) and math.isfinite(value)):
            msg = (
                f"{type(owner).__name__}: {name} must be a finite number of seconds, got {value!r}"
            )
            raise ValueError(msg)


@dataclass(frozen=True, slots=True)
class CoordinatorServerSettings:
    """Settings of a `CoordinatorServer`. Durations are seconds.

    Attributes:
        host: the interface to bind. Default 127.0.0.1.
        port: the port; 0 (the default) picks a free one (see `CoordinatorServer.address`).
        tls: TLS (and mutual TLS) settings, as for a transport node; None means plaintext,
            which is allowed only on a loopback host unless ``allow_insecure`` is set.
        allow_insecure: permit plaintext on a non-loopback host. Default False.
        token: a shared secret every client must present (metadata ``authorization:
            Bearer <token>``), compared in constant time. Default none.
        max_message_bytes: largest message accepted or sent. Default 4 MiB.
        keepalive_time: seconds between the server's HTTP/2 keepalive pings on an idle
            connection. Default 10.
        keepalive_timeout: seconds to wait for a ping's answer before the connection is
            lost (its streams end; their connections are *lost*). Default 5.
        min_ping_interval: the shortest interval between a client's pings the server
            accepts; a client pinging more often is disconnected (GOAWAY
            ``too_many_pings``), so keep clients' ``keepalive_time`` at or above it.
            Default 1.
        request_timeout: how long one request may wait for the coordinator actor's
            answer before the stream ends with UNAVAILABLE. Default 10.
        ask_threads: threads that wait for the actor's answers to attaches and queries
            (the loop never blocks on it; commands are answered by a callback). Default 4.
        hello_timeout: how long a new stream may take to send its hello before it is
            ended with DEADLINE_EXCEEDED. Default 10.
        shutdown_grace: seconds given to open streams when the server stops. Default 1.
        stream_pipeline: requests of one stream carried out at once: the server reads on
            while earlier ones wait for their group commit (replies still go out in request
            order), so that a client registering many subscriptions at once (a member of
            a partitioned group, a reconnect) joins one commit instead of one per request.
            Past it, the stream's next request is read once a reply is written. Default
            64; 1 to 10 000 (1: one request at a time).
        lag_expiry: seconds after which a position (lag as data: docs/coordinator.md,
            "Lag") not reported again is forgotten: a producer or consumer closed, or its
            connection lost. Keep it well above the clients' ``report_interval``.
            Default 30.
        probe_timeout: how long each step of the liveness probe of a lost connection's
            process (a TCP connect to its node, then the node's ``Probe`` rpc) may take
            before it counts as no answer, a possible partition (docs/coordinator.md,
            "Crash or partition"). A refused connect, or a node that does not know the
            connection, hands its consumers over at once. Long enough for a loaded host
            to accept a connection, short so that a crash is handed over quickly.
            Default 1.
        probe_token: the transport nodes' token (``NodeSettings.token``), presented to
            the nodes the probe asks. Default none.
        probe_tls: TLS settings to reach the nodes (their CA as ``root_certificates``;
            with ``require_client_auth`` on the nodes, a certificate they trust). None:
            plaintext; a node that needs TLS then gives no answer (the wait of a
            partition). Default none.
    """

    host: str = "127.0.0.1"
    port: int = 0
    tls: TlsSettings | None = None
    allow_insecure: bool = False
    token: str | None = field(default=None, repr=False)
    max_message_bytes: int = 4 * 1024 * 1024
    keepalive_time: float = 10.0
    keepalive_timeout: float = 5.0
    min_ping_interval: float = 1.0
    request_timeout: float = 10.0
    ask_threads: int = 4
    hello_timeout: float = 10.0
    shutdown_grace: float = 1.0
    stream_pipeline: int = 64
    lag_expiry: float = 30.0
    probe_timeout: float = 1.0
    probe_token: str | None = field(default=None, repr=False)
    probe_tls: TlsSettings | None = None

    def __post_init__(self) -> None:
        check_field_types(self)
        _check_durations(
            self,
            (
                "keepalive_time",
                "keepalive_timeout",
                "min_ping_interval",
                "request_timeout",
                "hello_timeout",
                "shutdown_grace",
                "lag_expiry",
                "probe_timeout",
            ),
        )
        checks = [
            (0 <= self.port <= 65535, f"port must be 0..65535, got {self.port}"),
            (
                1024 <= self.max_message_bytes <= _MAX_MESSAGE_BYTES,
                f"max_message_bytes must be 1024..{_MAX_MESSAGE_BYTES}",
            ),
            (self.keepalive_time > 0, "keepalive_time must be above 0 seconds"),
            (self.keepalive_timeout > 0, "keepalive_timeout must be above 0 seconds"),
            (self.min_ping_interval > 0, "min_ping_interval must be above 0 seconds"),
            (self.request_timeout > 0, "request_timeout must be above 0 seconds"),
            (self.ask_threads >= 1, f"ask_threads must be at least 1, got {self.ask_threads}"),
            (self.hello_timeout > 0, "hello_timeout must be above 0 seconds"),
            (self.shutdown_grace >= 0, "shutdown_grace must be 0 seconds or more"),
            (
                1 <= self.stream_pipeline <= 10_000,
                f"stream_pipeline must be 1..10000 requests, got {self.stream_pipeline}",
            ),
            (self.lag_expiry > 0, "lag_expiry must be above 0 seconds"),
            (self.token is None or len(self.token) > 0, "token must not be empty"),
            (self.probe_timeout > 0, "probe_timeout must be above 0 seconds"),
            (
                self.probe_token is None or len(self.probe_token) > 0,
                "probe_token must not be empty (None: the nodes have no token)",
            ),
        ]
        for ok, problem in checks:
            if not ok:
                msg = f"CoordinatorServerSettings: {problem}"
                raise ValueError(msg)
        if self.tls is None and not self.allow_insecure and not _is_loopback(self.host):
            msg = (
                f"CoordinatorServerSettings: plaintext on {self.host!r} would expose the "
                "coordinator to the network: set tls=TlsSettings(...), or "
                "allow_insecure=True if you mean it"
            )
            raise ValueError(msg)


@dataclass(frozen=True, slots=True)
class CoordinatorClientSettings:
    """Settings of a `CoordinatorClient`. Durations are seconds.

    Attributes:
        tls: TLS settings (as for a transport node); None: plaintext.
        token: the coordinator's shared secret (``CoordinatorServerSettings.token``).
        keepalive_time: seconds between HTTP/2 keepalive pings on an idle connection; at
            or above the server's ``min_ping_interval``. Default 10.
        keepalive_timeout: seconds to wait for a ping's answer before the connection is
            lost. Default 5.
        reconnect_backoff_min / reconnect_backoff_max: first and largest delay between
            attempts to re-open the stream, doubling with ±20 % jitter. Defaults 0.1 s
            and 5 s.
        connect_timeout: how long one attempt to reach the server may take. Default 5.
        request_timeout: default ``timeout`` of the blocking calls. Default 30.
        close_timeout: how long `close` waits for the client's `CoordinatedConsumer`s to
            stop (their deliveries in flight confirmed) before it says goodbye; if they
            have not by then, it closes without goodbye (logged at WARNING), and the
            coordinator hands their groups over after its ``disconnected_timeout``.
            Then, after a goodbye, how long it waits for the server to end the stream.
            Default 5.
        orphan_grace: how long an ``active`` update for a subscription this client has
            not registered waits for it to be registered (a process restarted with its
            old ``connection_id`` registering its consumers again: it keeps its place)
            before the client unregisters it, so that it does not block its group.
            Default 10.
        max_message_bytes: largest message sent or accepted. Default 4 MiB.
        report_interval: how often the positions of this client's producers and
            consumers go to the coordinator (lag as data: docs/coordinator.md, "Lag"),
            one batch per interval, and only while there is something to report.
            Default 1.
    """

    tls: TlsSettings | None = None
    token: str | None = field(default=None, repr=False)
    keepalive_time: float = 10.0
    keepalive_timeout: float = 5.0
    reconnect_backoff_min: float = 0.1
    reconnect_backoff_max: float = 5.0
    connect_timeout: float = 5.0
    request_timeout: float = 30.0
    close_timeout: float = 5.0
    orphan_grace: float = 10.0
    max_message_bytes: int = 4 * 1024 * 1024
    report_interval: float = 1.0

    def __post_init__(self) -> None:
        check_field_types(self)
        _check_durations(
            self,
            (
                "keepalive_time",
                "keepalive_timeout",
                "reconnect_backoff_min",
                "reconnect_backoff_max",
                "connect_timeout",
                "request_timeout",
                "close_timeout",
                "orphan_grace",
                "report_interval",
            ),
        )
        checks = [
            (self.keepalive_time > 0, "keepalive_time must be above 0 seconds"),
            (self.keepalive_timeout > 0, "keepalive_timeout must be above 0 seconds"),
            (
                0 < self.reconnect_backoff_min <= self.reconnect_backoff_max,
                "reconnect_backoff_min must be above 0 and at most reconnect_backoff_max",
            ),
            (self.connect_timeout > 0, "connect_timeout must be above 0 seconds"),
            (self.request_timeout > 0, "request_timeout must be above 0 seconds"),
            (self.close_timeout >= 0, "close_timeout must be 0 seconds or more"),
            (self.orphan_grace >= 0, "orphan_grace must be 0 seconds or more"),
            (self.report_interval > 0, "report_interval must be above 0 seconds"),
            (
                1024 <= self.max_message_bytes <= _MAX_MESSAGE_BYTES,
                f"max_message_bytes must be 1024..{_MAX_MESSAGE_BYTES}",
            ),
            (self.token is None or len(self.token) > 0, "token must not be empty"),
        ]
        for ok, problem in checks:
            if not ok:
                msg = f"CoordinatorClientSettings: {problem}"
                raise ValueError(msg)
