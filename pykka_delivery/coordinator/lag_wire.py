"""The wire form of lag as data (protocol/coordinator.proto, "positions" and ``Lag``):
positions to and from ``Positions`` messages, lag rows to and from ``LagReply``.

Shared by the service and the client, so each mapping is written once (as `wire` does
for the rest of the coordinator's messages).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pykka_delivery.coordinator.lag import ConsumerPosition, LagInfo, Position, ProducerPosition
from pykka_delivery.protocol import coordinator_pb2 as pb

__all__ = [
    "POSITIONS_PER_MESSAGE",
    "lag_filters",
    "lag_reply",
    "lag_request",
    "lag_rows",
    "positions_messages",
    "positions_of",
]

POSITIONS_PER_MESSAGE = 1000
"""Positions per ``Positions`` message: about 100 bytes each, far below any sensible
``max_message_bytes``, however many producers a client reports for."""


def positions_messages(positions: Sequence[Position]) -> list[pb.ClientMessage]:
    """``positions`` as ``ClientMessage``s (no reply, so no request id), at most
    `POSITIONS_PER_MESSAGE` each."""
    messages = []
    for start in range(0, len(positions), POSITIONS_PER_MESSAGE):
        batch = pb.Positions()
        for position in positions[start : start + POSITIONS_PER_MESSAGE]:
            if isinstance(position, ProducerPosition):
                batch.producers.append(
                    pb.ProducerPosition(
                        namespace=position.namespace,
                        stream=position.stream,
                        partition_index=position.partition_index,
                        producer_id=position.producer_id,
                        sent=position.sent,
                        confirmed=position.confirmed,
                        oldest_unconfirmed_age=position.oldest_unconfirmed_age,
                        group=position.group,
                    )
                )
            else:
                batch.consumers.append(
                    pb.ConsumerPosition(
                        namespace=position.namespace,
                        stream=position.stream,
                        group=position.group,
                        partition_index=position.partition_index,
                        producer_id=position.producer_id,
                        received=position.received,
                        confirmed=position.confirmed,
                    )
                )
        messages.append(pb.ClientMessage(positions=batch))
    return messages


def positions_of(message: pb.Positions) -> tuple[list[Position], list[str]]:
    """The valid positions of a ``Positions`` message, and the problems of the others
    (each names the field; the service logs them and keeps the rest)."""
    positions: list[Position] = []
    problems: list[str] = []
    for p in message.producers:
        try:
            positions.append(
                ProducerPosition(
                    p.namespace,
                    p.stream,
                    p.partition_index,
                    p.producer_id,
                    p.sent,
                    p.confirmed,
                    p.oldest_unconfirmed_age,
                    p.group,
                )
            )
        except ValueError as error:
            problems.append(str(error))
    for c in message.consumers:
        try:
            positions.append(
                ConsumerPosition(
                    c.namespace,
                    c.stream,
                    c.group,
                    c.partition_index,
                    c.producer_id,
                    c.received,
                    c.confirmed,
                )
            )
        except ValueError as error:
            problems.append(str(error))
    return positions, problems


def lag_request(namespace: str | None, stream: str | None, group: str | None) -> pb.LagRequest:
    request = pb.LagRequest()
    if namespace is not None:
        request.namespace = namespace
    if stream is not None:
        request.stream = stream
    if group is not None:
        request.group = group
    return request


def lag_filters(request: pb.LagRequest) -> tuple[str | None, str | None, str | None]:
    """The (namespace, stream, group) filters of a request; None where absent."""
    return (
        request.namespace if request.HasField("namespace") else None,
        request.stream if request.HasField("stream") else None,
        request.group if request.HasField("group") else None,
    )


def lag_reply(rows: Iterable[LagInfo]) -> pb.LagReply:
    return pb.LagReply(
        rows=[
            pb.LagRow(
                namespace=r.namespace,
                stream=r.stream,
                group=r.group,
                partition_index=r.partition_index,
                producer_id=r.producer_id,
                sent=r.sent,
                confirmed=r.confirmed,
                in_flight=r.in_flight,
                oldest_unconfirmed_age=r.oldest_unconfirmed_age,
                reported_at=r.reported_at,
            )
            for r in rows
        ]
    )


def lag_rows(reply: pb.LagReply) -> tuple[LagInfo, ...]:
    return tuple(
        LagInfo(
            r.namespace,
            r.stream,
            r.group,
            r.partition_index,
            r.producer_id,
            r.sent,
            r.confirmed,
            r.in_flight,
            r.oldest_unconfirmed_age,
            r.reported_at,
        )
        for r in reply.rows
    )
