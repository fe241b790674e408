"""A consumer core's collection of the pieces of a chunked message (chunking.py cuts them).

Pieces arrive as consecutive `SequencedMessage`\\ s; the last one completes the message,
which the core then delivers as one, under the last piece's seq_nr. Only this module
assigns a `ChunkCollector`'s fields.
"""

from __future__ import annotations

import logging

from pykka_delivery.delivery.core.chunking import assemble_chunks
from pykka_delivery.protocol.messages import ChunkedMessage, SequencedMessage
from pykka_delivery.protocol.serialization import Serialization

__all__ = ["ChunkCollector"]

logger = logging.getLogger("pykka_delivery.consumer")


class ChunkCollector:
    """The pieces collected so far (``pieces``), and how many were lost (``lost``)."""

    __slots__ = ("_serialization", "lost", "pieces")

    def __init__(self, serialization: Serialization) -> None:
        self._serialization = serialization
        self.pieces: list[SequencedMessage] = []
        self.lost = 0

    def add(self, msg: SequencedMessage) -> SequencedMessage | None:
        """Take the piece ``msg`` (its message is a `ChunkedMessage`): the whole message
        once this is its last piece, else None."""
        piece: ChunkedMessage = msg.message
        pieces = self.pieces
        if piece.first_chunk:
            pieces.clear()
        elif not pieces or pieces[-1].seq_nr != msg.seq_nr - 1:
            # Only-flow-control mode accepted a gap inside a chunked message: it cannot be
            # assembled, so it is lost (Akka would splice the pieces around the gap).
            self.lost += 1 + len(pieces)
            logger.debug(
                "Received chunk seq_nr %d after a lost chunk, discarding the message", msg.seq_nr
            )
            pieces.clear()
            return None
        if not piece.last_chunk:
            pieces.append(msg)
            return None
        first = pieces[0].first if pieces else msg.first
        payload = assemble_chunks([*(p.message for p in pieces), piece], self._serialization)
        pieces.clear()
        return SequencedMessage(
            msg.producer_id, msg.seq_nr, payload, first, msg.ack, msg.producer_controller
        )

    def clear(self) -> None:
        """Forget the pieces collected (their message was confirmed before)."""
        self.pieces.clear()
