"""The wire form of the stream catalog's producers and watches (catalog_watch.py): the
requests (``RegisterProducer``, ``DeregisterProducer``, ``WatchStreams``,
``UnwatchStreams``), the pushed ``StreamCatalog`` and the producers of a ``StreamStatus``.

Shared by the service and the client, as wire.py, which routes these requests with the
service directory's.
"""

from __future__ import annotations

from collections.abc import Iterable

from pykka_delivery.coordinator.actor_messages import (
    DeregisterProducer,
    RegisterProducer,
    UnwatchStreams,
    WatchStreams,
)
from pykka_delivery.coordinator.catalog_watch import CatalogStream, StreamPattern, StreamProducer
from pykka_delivery.coordinator.state import StreamId
from pykka_delivery.protocol import coordinator_pb2 as pb

__all__ = [
    "CATALOG_REQUESTS",
    "CatalogRequest",
    "add_producers",
    "catalog_message",
    "catalog_of",
    "catalog_request_of",
    "deregister_producer_message",
    "producers_of",
    "register_producer_message",
    "unwatch_streams_message",
    "watch_streams_message",
]

CATALOG_REQUESTS = frozenset(
    {"register_producer", "deregister_producer", "watch_streams", "unwatch_streams"}
)
"""The ``ClientMessage`` bodies that are requests about the catalog's producers."""

CatalogRequest = RegisterProducer | DeregisterProducer | WatchStreams | UnwatchStreams


def _stream_id(namespace: str, stream: str) -> StreamId:
    if not stream:
        msg = "stream is empty: name the stream of the catalog"
        raise ValueError(msg)
    return StreamId(namespace, stream)


def catalog_request_of(message: pb.ClientMessage, connection: str, node: str) -> CatalogRequest:
    """The catalog request a client message asks for, on behalf of ``connection``.

    Raises:
        ValueError: a field is invalid (the message names it), or the message is not a
            catalog request.
    """
    kind = message.WhichOneof("body")
    if kind == "register_producer":
        r = message.register_producer
        producer = StreamProducer(
            r.name, r.address, r.partitions, connection, r.registration_id, node
        )
        return RegisterProducer(_stream_id(r.namespace, r.stream), producer)
    if kind == "deregister_producer":
        d = message.deregister_producer
        return DeregisterProducer(_stream_id(d.namespace, d.stream), connection, d.registration_id)
    if kind == "watch_streams":
        w = message.watch_streams
        return WatchStreams(StreamPattern(w.namespace, w.pattern), connection)
    if kind == "unwatch_streams":
        u = message.unwatch_streams
        return UnwatchStreams(StreamPattern(u.namespace, u.pattern), connection)
    msg = f"expected a stream catalog request, got {kind or 'an empty message'}"
    raise ValueError(msg)


def register_producer_message(
    request_id: int, stream: StreamId, producer: StreamProducer
) -> pb.ClientMessage:
    body = pb.RegisterProducer(
        namespace=stream.namespace,
        stream=stream.name,
        name=producer.name,
        address=producer.address,
        partitions=producer.partitions,
        registration_id=producer.registration_id,
    )
    return pb.ClientMessage(request_id=request_id, register_producer=body)


def deregister_producer_message(
    request_id: int, stream: StreamId, registration_id: int
) -> pb.ClientMessage:
    body = pb.DeregisterProducer(
        namespace=stream.namespace, stream=stream.name, registration_id=registration_id
    )
    return pb.ClientMessage(request_id=request_id, deregister_producer=body)


def watch_streams_message(request_id: int, pattern: StreamPattern) -> pb.ClientMessage:
    body = pb.WatchStreams(namespace=pattern.namespace, pattern=pattern.pattern)
    return pb.ClientMessage(request_id=request_id, watch_streams=body)


def unwatch_streams_message(request_id: int, pattern: StreamPattern) -> pb.ClientMessage:
    body = pb.UnwatchStreams(namespace=pattern.namespace, pattern=pattern.pattern)
    return pb.ClientMessage(request_id=request_id, unwatch_streams=body)


def add_producers(out: pb.StreamStatus, producers: Iterable[StreamProducer]) -> None:
    """Put ``producers`` into ``out``'s repeated field."""
    for p in producers:
        out.producers.add(
            name=p.name,
            address=p.address,
            partitions=p.partitions,
            connection=p.connection,
            registration_id=p.registration_id,
            node=p.node,
        )


def producers_of(status: pb.StreamStatus) -> tuple[StreamProducer, ...]:
    return tuple(
        StreamProducer(p.name, p.address, p.partitions, p.connection, p.registration_id, p.node)
        for p in status.producers
    )


def catalog_message(pattern: StreamPattern, streams: tuple[CatalogStream, ...]) -> pb.ServerMessage:
    catalog = pb.StreamCatalog(namespace=pattern.namespace, pattern=pattern.pattern)
    for s in streams:
        add_producers(
            catalog.streams.add(namespace=s.namespace, name=s.name, partitions=s.partitions),
            s.producers,
        )
    return pb.ServerMessage(catalog=catalog)


def catalog_of(catalog: pb.StreamCatalog) -> tuple[StreamPattern, tuple[CatalogStream, ...]]:
    streams = tuple(
        CatalogStream(s.namespace, s.name, s.partitions, producers_of(s)) for s in catalog.streams
    )
    return StreamPattern(catalog.namespace, catalog.pattern), streams
