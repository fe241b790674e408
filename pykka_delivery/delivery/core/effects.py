"""Effects: the orders a pure core hands to its shell.

A core never sends, sleeps or reads a clock. It returns a list of these, and the shell (a
pykka actor, a handle, or a test harness with a fake clock) carries them out in order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pykka_delivery.delivery.core.durable_state import NO_QUALIFIER, MessageSent
from pykka_delivery.protocol.messages import Ref, SequencedMessage, fast_frozen_init

__all__ = [
    "CancelTimer",
    "Effect",
    "RecordConfirmed",
    "Send",
    "StartTimer",
    "Stop",
    "StoreMessageConfirmed",
    "StoreMessageSent",
    "StoreMessagesSent",
    "WriteDeadLetter",
    "store_all_sent",
    "store_sent",
]


@fast_frozen_init
@dataclass(frozen=True, slots=True)
class Send:
    """Tell ``message`` to ``to``."""

    to: Ref
    message: Any


@dataclass(frozen=True, slots=True)
class StartTimer:
    """(Re)start the timer ``key``: fire ``on_timer(key)`` every ``interval`` seconds
    (fixed delay) until cancelled. Starting a running timer replaces it."""

    key: str
    interval: float


@dataclass(frozen=True, slots=True)
class CancelTimer:
    """Cancel the timer ``key``; a firing already on its way is ignored."""

    key: str


@dataclass(frozen=True, slots=True)
class StoreMessageSent:
    """Store ``sent`` in the durable producer queue; the effects after this one (the send
    of that message among them) run only once it is stored. If storing fails after the
    configured retries, the shell stops the controller instead of going on."""

    sent: MessageSent


@dataclass(frozen=True, slots=True)
class StoreMessagesSent:
    """Store ``sents`` (consecutive seq_nrs) in the durable producer queue in one write,
    all or none; as for `StoreMessageSent`, the effects after this one run only once they
    are stored. A batch costs one durable write (one commit) instead of one per message."""

    sents: tuple[MessageSent, ...]


def store_sent(seq_msg: SequencedMessage, timestamp_millis: int) -> StoreMessageSent:
    """Store ``seq_msg``, sent point to point (`NO_QUALIFIER`)."""
    return StoreMessageSent(
        MessageSent(seq_msg.seq_nr, seq_msg.message, seq_msg.ack, NO_QUALIFIER, timestamp_millis)
    )


def store_all_sent(
    seq_msgs: Sequence[SequencedMessage], timestamp_millis: int
) -> StoreMessagesSent:
    """Store ``seq_msgs`` (consecutive seq_nrs), sent point to point, in one write."""
    return StoreMessagesSent(
        tuple(
            MessageSent(m.seq_nr, m.message, m.ack, NO_QUALIFIER, timestamp_millis)
            for m in seq_msgs
        )
    )


@dataclass(frozen=True, slots=True)
class StoreMessageConfirmed:
    """Store in the durable producer queue that ``qualifier``'s messages up to ``seq_nr``
    are confirmed (the queue may write it behind)."""

    seq_nr: int
    qualifier: str
    timestamp_millis: int


@fast_frozen_init  # one per confirmation when a deduplication store is used
@dataclass(frozen=True, slots=True)
class RecordConfirmed:
    """Write to the consumer's deduplication store that ``producer_id``'s messages up to
    ``seq_nr`` are confirmed (the store may buffer it). The shell flushes the store before
    any later `Request` or `Ack` leaves: a producer must never drop a message the consumer
    could forget it confirmed. ``seq_nr`` 0 forgets the producer id's position (a sequence
    restart under ``on_sequence_restart="reset"``)."""

    producer_id: str
    seq_nr: int


@dataclass(frozen=True, slots=True)
class WriteDeadLetter:
    """Write a message the consumer rejected ``attempts`` times to the dead-letter
    destination; the effects after this one (the confirmation that moves the stream on)
    run only once it is written. If it cannot be written, the shell stops the controller
    instead of going on (the message stays unconfirmed at the producer)."""

    producer_id: str
    seq_nr: int
    message: Any
    reason: str
    attempts: int


@dataclass(frozen=True, slots=True)
class Stop:
    """The controller has finished: stop it (after carrying out the effects before it)."""


Effect = (
    Send
    | StartTimer
    | CancelTimer
    | Stop
    | StoreMessageSent
    | StoreMessagesSent
    | StoreMessageConfirmed
    | RecordConfirmed
    | WriteDeadLetter
)
