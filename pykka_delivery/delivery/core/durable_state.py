"""What a durable producer queue holds, as the producer core sees it: `MessageSent` (one
stored message or chunk) and `DurableProducerState` (what a queue loads). The queue's
interface and its contract are in ``pykka_delivery.delivery.stores.durable_queue``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pykka_delivery.protocol.messages import ChunkedMessage, Ref, SequencedMessage, fast_frozen_init

__all__ = ["NO_QUALIFIER", "DurableProducerState", "MessageSent"]

NO_QUALIFIER = ""
"""The confirmation qualifier of point-to-point delivery (Akka's ``NoQualifier``). Work
pulling uses one qualifier per worker."""


@fast_frozen_init  # one per message stored
@dataclass(frozen=True, slots=True)
class MessageSent:
    """One stored message (or chunk) awaiting confirmation.

    ``message`` is the payload, or a `ChunkedMessage` when chunking is on. ``ack`` is True
    for a `MessageWithConfirmation`. ``confirmation_qualifier`` says whose confirmation
    removes it (`NO_QUALIFIER` point to point, the worker's in work pulling).
    """

    seq_nr: int
    message: Any
    ack: bool
    confirmation_qualifier: str
    timestamp_millis: int

    @property
    def is_first_chunk(self) -> bool:
        """True for the first piece of a chunked message, and for a message not chunked."""
        message = self.message
        return not isinstance(message, ChunkedMessage) or message.first_chunk

    @property
    def is_last_chunk(self) -> bool:
        """True for the last piece of a chunked message, and for a message not chunked."""
        message = self.message
        return not isinstance(message, ChunkedMessage) or message.last_chunk


@dataclass(frozen=True, slots=True)
class DurableProducerState:
    """What a durable producer queue holds (Akka's ``DurableProducerQueue.State``).

    Attributes:
        current_seq_nr: the next seq_nr to store.
        highest_confirmed_seq_nr: the highest seq_nr confirmed under any qualifier.
        confirmed_seq_nr: per qualifier, the highest confirmed seq_nr and when it was
            confirmed (milliseconds since the epoch).
        unconfirmed: the stored messages not yet confirmed, in seq_nr order.
    """

    current_seq_nr: int = 1
    highest_confirmed_seq_nr: int = 0
    confirmed_seq_nr: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    unconfirmed: tuple[MessageSent, ...] = ()

    def add_message_sent(self, sent: MessageSent) -> DurableProducerState:
        """The state after storing ``sent``: it is unconfirmed and the next seq_nr follows it."""
        return replace(self, current_seq_nr=sent.seq_nr + 1, unconfirmed=(*self.unconfirmed, sent))

    def confirmed(self, seq_nr: int, qualifier: str, timestamp_millis: int) -> DurableProducerState:
        """The state after confirming up to ``seq_nr`` for ``qualifier`` (cumulative):
        that qualifier's unconfirmed messages up to ``seq_nr`` are removed, the others kept."""
        unconfirmed = tuple(
            m
            for m in self.unconfirmed
            if not (m.confirmation_qualifier == qualifier and m.seq_nr <= seq_nr)
        )
        return replace(
            self,
            highest_confirmed_seq_nr=max(self.highest_confirmed_seq_nr, seq_nr),
            confirmed_seq_nr={**self.confirmed_seq_nr, qualifier: (seq_nr, timestamp_millis)},
            unconfirmed=unconfirmed,
        )

    def cleanup(self, qualifiers: Sequence[str]) -> DurableProducerState:
        """The state without the confirmation records of ``qualifiers`` (workers gone)."""
        gone = set(qualifiers)
        return replace(
            self,
            confirmed_seq_nr={q: v for q, v in self.confirmed_seq_nr.items() if q not in gone},
        )

    def to_resend(self, producer_id: str, self_ref: Ref) -> list[SequencedMessage]:
        """What a point-to-point producer core resends after loading this state: the
        unconfirmed messages with their seq_nrs, the first one marked first."""
        return [
            SequencedMessage(producer_id, m.seq_nr, m.message, i == 0, m.ack, self_ref)
            for i, m in enumerate(self.unconfirmed)
        ]

    def cleanup_partial_chunked_messages(self) -> DurableProducerState:
        """The state without the pieces of chunked messages that were not stored whole.

        Pieces are stored one at a time; a crash between them leaves a message whose last
        piece is missing. Such pieces are dropped and their seq_nrs are used again by the
        next message (``current_seq_nr`` follows the last complete message).
        """
        if all(m.is_first_chunk and m.is_last_chunk for m in self.unconfirmed):
            return self
        kept: list[MessageSent] = []
        group: list[MessageSent] = []
        current = self.highest_confirmed_seq_nr + 1
        for m in self.unconfirmed:
            if m.is_first_chunk and m.is_last_chunk:
                kept.append(m)
                group = []
                current = m.seq_nr + 1
            elif m.is_first_chunk:
                group = [m]
            elif not m.is_last_chunk:
                group.append(m)
            else:
                # As Akka: a last piece closes the group, even one whose first piece is no
                # longer unconfirmed; what was stored whole is never dropped.
                kept.extend(group)
                kept.append(m)
                current = m.seq_nr + 1
                group = []
        return replace(self, current_seq_nr=current, unconfirmed=tuple(kept))
