"""Cutting large payloads into chunks and joining them again.

When ``chunk_large_messages`` is on, every payload is serialized (even a small one, as in
Akka) and cut into pieces of at most that many bytes. Each piece travels as its own
`SequencedMessage` with its own seq_nr, so the seq_nr space counts pieces, not messages.
"""

from __future__ import annotations

from collections.abc import Sequence

from pykka_delivery.protocol.messages import ChunkedMessage, Ref, SequencedMessage
from pykka_delivery.protocol.serialization import Serialization

__all__ = ["assemble_chunks", "make_chunks", "sequenced_chunks"]


def make_chunks(
    message: object, chunk_size: int, serialization: Serialization
) -> list[ChunkedMessage]:
    """Serialize ``message`` and cut it into pieces of at most ``chunk_size`` bytes.

    An empty payload still makes one piece, marked both first and last.
    """
    serializer_id, manifest, data = serialization.serialize(message)
    if len(data) <= chunk_size:
        return [ChunkedMessage(data, True, True, serializer_id, manifest)]
    starts = range(0, len(data), chunk_size)
    last_start = starts[-1]
    return [
        ChunkedMessage(
            data[start : start + chunk_size],
            start == 0,
            start == last_start,
            serializer_id,
            manifest,
        )
        for start in starts
    ]


def sequenced_chunks(
    message: object,
    chunk_size: int,
    serialization: Serialization,
    *,
    producer_id: str,
    start: int,
    first_seq_nr: int,
    ack: bool,
    self_ref: Ref,
) -> list[SequencedMessage]:
    """``message`` cut into chunks (`make_chunks`), each numbered from ``start`` as a
    `SequencedMessage` of ``producer_id``: the one numbered ``first_seq_nr`` marked first,
    and ``ack`` (a confirmation is asked for) on the last chunk only."""
    pieces = make_chunks(message, chunk_size, serialization)
    return [
        SequencedMessage(
            producer_id,
            start + i,
            piece,
            start + i == first_seq_nr,
            ack and piece.last_chunk,
            self_ref,
        )
        for i, piece in enumerate(pieces)
    ]


def assemble_chunks(chunks: Sequence[ChunkedMessage], serialization: Serialization) -> object:
    """Join the pieces of one message, in order, and deserialize them.

    Raises:
        SerializationError: the joined bytes cannot be turned back into a message.
    """
    last = chunks[-1]
    data = b"".join(chunk.data for chunk in chunks)
    return serialization.deserialize(last.serializer_id, last.manifest, data)
