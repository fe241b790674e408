"""What every gRPC endpoint of the project sets up the same way: keepalive and size
options, channels with or without TLS, a server bound with TLS and the health service,
and the bearer-token check. Used by the transport's `Node` and by the coordinator's
service and client, so that they agree on liveness and security.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from pykka_delivery.transport.settings import TlsSettings

__all__ = [
    "bearer_token_ok",
    "keepalive_options",
    "open_channel",
    "read_or_refuse",
    "reconnect_options",
    "start_server",
]

logger = logging.getLogger("pykka_delivery.transport")

_M = TypeVar("_M")

Options = list[tuple[str, Any]]


def keepalive_options(
    *,
    max_message_bytes: int,
    keepalive_time: float,
    keepalive_timeout: float,
    min_ping_interval: float | None = None,
) -> Options:
    """Size limits and keepalive pings, for a server or a channel.

    ``min_ping_interval`` (servers): the shortest interval between a peer's pings that
    is tolerated; None leaves gRPC's default.
    """
    options: Options = [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", int(keepalive_time * 1000)),
        ("grpc.keepalive_timeout_ms", int(keepalive_timeout * 1000)),
        # What really ends a connection whose pings go unanswered (a stalled peer):
        # keepalive_timeout_ms alone does not (measured, grpcio 1.85).
        ("grpc.http2.ping_timeout_ms", int(keepalive_timeout * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]
    if min_ping_interval is not None:
        options.append(
            ("grpc.http2.min_ping_interval_without_data_ms", int(min_ping_interval * 1000))
        )
    return options


def reconnect_options(backoff_min: float, backoff_max: float) -> Options:
    """gRPC's own reconnect backoff of a channel, in seconds."""
    return [
        ("grpc.initial_reconnect_backoff_ms", int(backoff_min * 1000)),
        ("grpc.min_reconnect_backoff_ms", int(backoff_min * 1000)),
        ("grpc.max_reconnect_backoff_ms", int(backoff_max * 1000)),
    ]


def open_channel(
    address: str,
    tls: TlsSettings | None,
    options: Options,
    tls_files: tuple[bytes, bytes, bytes] | None = None,
) -> grpc.aio.Channel:
    """A channel to ``address`` (on the running loop): plaintext without ``tls``, else
    TLS with our certificate (mutual TLS) and ``tls.root_certificates`` as trust.
    ``tls_files`` are ``tls.read()``'s bytes if the caller already read them."""
    if tls is None:
        return grpc.aio.insecure_channel(address, options=options)
    chain, key, roots = tls_files if tls_files is not None else tls.read()
    credentials = grpc.ssl_channel_credentials(
        root_certificates=roots, private_key=key, certificate_chain=chain
    )
    if tls.server_name_override:
        options = [*options, ("grpc.ssl_target_name_override", tls.server_name_override)]
    return grpc.aio.secure_channel(address, credentials, options=options)


async def start_server(
    server: grpc.aio.Server, bind: str, tls: TlsSettings | None, services: Iterable[str]
) -> tuple[int, health_aio.HealthServicer]:
    """Bind ``server`` to ``bind`` (``host:port``, port 0 for any), with TLS if given,
    add the standard health service reporting ``""`` and ``services`` as SERVING, and
    start it. Returns the bound port and the health servicer (for a graceful stop)."""
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    if tls is None:
        port = server.add_insecure_port(bind)
    else:
        chain, key, roots = tls.read()
        credentials = grpc.ssl_server_credentials(
            [(key, chain)], root_certificates=roots, require_client_auth=tls.require_client_auth
        )
        port = server.add_secure_port(bind, credentials)
    await server.start()
    for service in ("", *services):
        await health.set(service, health_pb2.HealthCheckResponse.SERVING)
    return int(port), health


def bearer_token_ok(metadata: Iterable[tuple[str, Any]] | None, token: str | None) -> bool:
    """True if ``token`` is None, or ``metadata`` has ``authorization: Bearer <token>``
    (compared in constant time)."""
    if token is None:
        return True
    expected = f"Bearer {token}".encode()
    for key, value in metadata or ():
        if key == "authorization":
            got = value.encode() if isinstance(value, str) else value
            return hmac.compare_digest(got, expected)
    return False


async def read_or_refuse(
    context: grpc.aio.ServicerContext[Any, Any],
    parse: Callable[[bytes], _M],
    on_malformed: Callable[[], None],
    what: str,
) -> _M | None:
    """The next message of a stream whose handler takes bytes (``request_deserializer=
    bytes``), parsed with ``parse``; None at the stream's end.

    The handler parses instead of gRPC so that a message that does not parse is refused
    in our words: counted (``on_malformed``), logged, and the call ended with
    ``INVALID_ARGUMENT``, where gRPC's own deserializer answers ``UNKNOWN`` naming a
    Python exception and the server never hears of it.
    """
    data = await context.read()
    if data is grpc.aio.EOF:
        return None
    try:
        return parse(data)
    except DecodeError:
        on_malformed()
        logger.warning("A message of %d bytes does not parse as %s: stream ended", len(data), what)
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"a message of the stream does not parse as {what} (another protocol, or a "
            "corrupted stream)",
        )
        raise  # context.abort raised already
