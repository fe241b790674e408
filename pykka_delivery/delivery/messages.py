"""The application-facing messages of reliable delivery: between a producer and its producer
controller, and between a consumer and its consumer controller (Akka's names kept).

`ProducerStart`, `RequestNext`, `MessageWithConfirmation` and `SendNext` on the producer
side; `ConsumerStart`, `Delivery`, `Confirmed`, `Rejected`, `DeliverThenStop` and
`RegisterToProducerController` on the consumer side. The controller classes expose them
under Akka's names (`ProducerController.Start`, `ConsumerController.Start`, ...).

They never cross a process boundary, as in Akka: each is marked `local_only`, and a
transport refuses to carry it. The wire vocabulary is in ``pykka_delivery.protocol``.

All are frozen, slotted dataclasses; don't subclass them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pykka_delivery.protocol.messages import Ref, fast_frozen_init, frozen_factory, local_only
from pykka_delivery.protocol.payload_check import PayloadCheck

__all__ = [
    "CONFIRMED",
    "Confirmed",
    "ConsumerStart",
    "DeliverThenStop",
    "Delivery",
    "MessageWithConfirmation",
    "ProducerStart",
    "RegisterToProducerController",
    "Rejected",
    "RequestNext",
    "SendNext",
    "new_delivery",
]


# --- producer-facing messages ----------------------------------------------------------


@local_only
@dataclass(frozen=True, slots=True)
class ProducerStart:
    """The producer registers with its producer controller (`ProducerController.Start`).

    Sending it again, for example from a restarted producer, switches to the new producer,
    which gets a fresh `RequestNext` if one was outstanding.
    """

    producer: Ref


@local_only
@dataclass(frozen=True, slots=True)
class RequestNext:
    """Permission to send exactly one message.

    Send it with ``send_next_to.tell(message)``, or with
    ``ask_next_to.tell(MessageWithConfirmation(message, reply_to))`` to be told its seq_nr
    once the consumer confirmed it. Wait for the next `RequestNext` before sending again.
    """

    producer_id: str
    current_seq_nr: int
    confirmed_seq_nr: int
    send_next_to: Ref = field(compare=False)
    ask_next_to: Ref = field(compare=False)


@local_only
@dataclass(frozen=True, slots=True)
class MessageWithConfirmation:
    """Send ``message`` and have its seq_nr told to ``reply_to`` once it is confirmed.

    ``checked`` is set by the controller's ``ask_next_to`` (the payload check it applied in
    the producer's thread, so the controller does not encode the payload again); leave it
    None.
    """

    message: Any
    reply_to: Ref
    checked: PayloadCheck | None = field(default=None, compare=False, repr=False, kw_only=True)


@local_only
@dataclass(frozen=True, slots=True)
class SendNext:
    """What ``RequestNext.send_next_to`` wraps a producer's message in (Akka's ``Msg``),
    with the payload check it applied in the producer's thread (``checked``: the controller
    does not encode the payload again while that check is in force)."""

    message: Any
    checked: PayloadCheck | None = field(default=None, compare=False, repr=False, kw_only=True)


# --- consumer-facing messages ----------------------------------------------------------


@local_only
@dataclass(frozen=True, slots=True)
class ConsumerStart:
    """The consumer registers with its consumer controller (`ConsumerController.Start`).

    A later `ConsumerStart` with another ref replaces the consumer; a delivery that awaits
    confirmation is delivered again to the new one.
    """

    deliver_to: Ref


@local_only
@dataclass(frozen=True, slots=True)
class Confirmed:
    """The consumer processed the current `Delivery` (use the `CONFIRMED` instance)."""


CONFIRMED = Confirmed()


@local_only
@dataclass(frozen=True, slots=True)
class Rejected:
    """The consumer could not process the current `Delivery`: it is delivered again after
    a backoff, or, after ``max_attempts`` deliveries, written to the dead-letter
    destination (``reason`` with it) and the stream moves on."""

    reason: str


@fast_frozen_init
@local_only
@dataclass(frozen=True, slots=True)
class Delivery:
    """One message handed to the consumer; the next comes only after it is confirmed (or
    rejected).

    For a chunked message ``seq_nr`` is the seq_nr of its last piece. ``attempt`` counts
    the deliveries of this message to this consumer controller: 1, then 2, 3, ... each
    time it is delivered again after `reject`.
    """

    message: Any
    confirm_to: Ref = field(compare=False, repr=False)
    producer_id: str
    seq_nr: int
    attempt: int

    def confirm(self) -> None:
        """Tell the consumer controller this delivery is processed (`Confirmed`)."""
        self.confirm_to.tell(CONFIRMED)

    def reject(self, reason: str | BaseException) -> None:
        """Tell the consumer controller this delivery could not be processed (`Rejected`):
        it comes again after a backoff, until ``max_attempts``, then goes to the
        dead-letter destination. An exception is recorded as ``"TypeName: message"``."""
        if isinstance(reason, BaseException):
            text = str(reason)
            reason = f"{type(reason).__name__}: {text}" if text else type(reason).__name__
        self.confirm_to.tell(Rejected(reason))


# Fast builders of the two classes built once per message (see frozen_factory).
new_delivery: Callable[[Any, Ref, str, int, int], Delivery] = frozen_factory(Delivery)


@local_only
@dataclass(frozen=True, slots=True)
class DeliverThenStop:
    """Stop the consumer controller once every received message is confirmed."""


@local_only
@dataclass(frozen=True, slots=True)
class RegisterToProducerController:
    """Connect from the consumer side: the consumer controller sends `RegisterConsumer`
    to ``producer_controller``, and repeats it until that producer controller's first
    message arrives."""

    producer_controller: Ref
