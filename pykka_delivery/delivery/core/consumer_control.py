"""The consumer core's control inputs: registration, stopping, link events and timers.

Part of `ConsumerCore` (core/consumer.py), which inherits it: the inputs that are not the
flow of `SequencedMessage`s and confirmations. `on_register_to` (connect from the consumer
side), `on_deliver_then_stop`, `on_consumer_terminated` and `on_stopped` (the three ways
to stop), `on_peer_link_changed` (retry at once when a link comes back), `on_timer` (the
retry timer and the redelivery of a rejected message), and the retry rules they share.
They read and assign the same state as the rest of the core; nothing outside the two
modules assigns it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from pykka_delivery.delivery.core import consumer_trace as trace
from pykka_delivery.delivery.core.consumer_records import (
    ACTIVE as _ACTIVE,
)
from pykka_delivery.delivery.core.consumer_records import (
    RESENDING as _RESENDING,
)
from pykka_delivery.delivery.core.consumer_records import (
    STOPPED as _STOPPED,
)
from pykka_delivery.delivery.core.consumer_records import (
    WAITING_FOR_CONFIRMATION as _WAITING_FOR_CONFIRMATION,
)
from pykka_delivery.delivery.core.consumer_records import (
    WAITING_FOR_START as _WAITING_FOR_START,
)
from pykka_delivery.delivery.core.consumer_records import ConsumerPhase
from pykka_delivery.delivery.core.consumer_redelivery import REDELIVER, Redelivery
from pykka_delivery.delivery.core.consumer_retry import RETRY, RetryTimer
from pykka_delivery.delivery.core.effects import CancelTimer, Effect, Send, Stop
from pykka_delivery.delivery.messages import Delivery
from pykka_delivery.protocol.messages import (
    Ack,
    PeerLinkChanged,
    Ref,
    RegisterConsumer,
    Request,
    Resend,
    SequencedMessage,
    SequencedRun,
)

__all__ = ["ConsumerControl"]


class ConsumerControl:
    """The control inputs of `ConsumerCore` (see the module docstring)."""

    # The core's state these inputs read and assign too (set in ConsumerCore.__init__).
    __slots__ = (
        "_delivered",
        "_half",
        "_heard",
        "_redelivery",
        "_retry",
        "confirmed_seq_nr",
        "consumer",
        "current",
        "phase",
        "producer_controller",
        "producer_id",
        "received_seq_nr",
        "registering",
        "requested_seq_nr",
        "resend_lost",
        "self_ref",
        "stash",
        "stopping",
    )

    self_ref: Ref
    phase: ConsumerPhase
    consumer: Ref | None
    producer_controller: Ref | None
    producer_id: str
    received_seq_nr: int
    confirmed_seq_nr: int
    requested_seq_nr: int
    stash: deque[SequencedMessage]
    registering: Ref | None
    stopping: bool
    current: SequencedMessage | SequencedRun | None
    resend_lost: bool
    _half: int
    _heard: bool
    _retry: RetryTimer
    _redelivery: Redelivery | None
    _delivered: int
    _delivery: Callable[[SequencedMessage | SequencedRun], Delivery]

    def on_register_to(self, producer_controller: Ref) -> list[Effect]:
        """Connect to (another) producer controller from the consumer side."""
        phase = self.phase
        if phase is _STOPPED:
            return []
        if phase is _WAITING_FOR_START:
            self.registering = producer_controller
            return [Send(producer_controller, RegisterConsumer(self.self_ref))]
        if producer_controller == self.producer_controller:
            return []
        trace.registering(self.producer_id)
        effects: list[Effect] = []
        self._restart_retry(effects)
        effects.append(Send(producer_controller, RegisterConsumer(self.self_ref)))
        self.registering = producer_controller
        if phase is _RESENDING:
            self.phase = _ACTIVE  # as in the original
        return effects

    def on_deliver_then_stop(self) -> list[Effect]:
        """Stop once every received and stashed message is delivered and confirmed."""
        phase = self.phase
        if phase is _STOPPED:
            return []
        if phase is _WAITING_FOR_START:
            if not self.stash:
                self.phase = _STOPPED
                return [Stop()]
            self.stopping = True
            return []
        if not self.stash and self.received_seq_nr == self.confirmed_seq_nr:
            trace.stopped(self.confirmed_seq_nr, buffered=False)
            effects: list[Effect] = []
            self._stop(effects)
            return effects
        self.stopping = True
        return []

    def on_consumer_terminated(self) -> list[Effect]:
        """The consumer is gone: the controller stops too."""
        if self.phase is _STOPPED:
            return []
        effects: list[Effect] = []
        self._stop(effects)
        return effects

    def on_stopped(self) -> list[Effect]:
        """The controller is being stopped from outside: best-effort `Ack` of what is
        confirmed, so the producer side can drop it."""
        if self.phase is _STOPPED:
            return []
        self.phase = _STOPPED
        if self.producer_controller is None:
            return []
        return [Send(self.producer_controller, Ack(self.confirmed_seq_nr))]

    def on_peer_link_changed(self, event: PeerLinkChanged) -> list[Effect]:
        """The link to a node came back (after going down): if our producer controller
        (or the one we are registering to) lives there, retry now rather than at the next
        timer tick, since whatever was in flight when the link broke is lost."""
        if not self._retry.link_came_back(event) or self.phase not in (_ACTIVE, _RESENDING):
            return []
        peer_ref = self.registering if self.registering is not None else self.producer_controller
        if getattr(peer_ref, "node_address", None) != event.peer:
            return []
        trace.link_restored(event.peer)
        effects: list[Effect] = []
        self._retry_now(effects)
        return effects

    def on_timer(self, key: str) -> list[Effect]:
        """A timer started by this core fired."""
        if key == REDELIVER:
            return self._redeliver()
        if key != RETRY:
            return []
        phase = self.phase
        effects: list[Effect] = []
        if phase is _WAITING_FOR_START:
            if self.registering is not None:
                effects.append(Send(self.registering, RegisterConsumer(self.self_ref)))
            return effects
        if phase not in (_ACTIVE, _RESENDING):
            return effects  # no retries while a delivery awaits confirmation
        if phase is _ACTIVE and self._heard and self.registering is None:
            # P6: messages are flowing, nothing to retry (Akka retries on every tick).
            self._heard = False
            return effects
        backoff = self._retry.back_off()
        if backoff is not None:
            effects.append(backoff)
        self._retry_now(effects)
        return effects

    def _redeliver(self) -> list[Effect]:
        effects: list[Effect] = [CancelTimer(REDELIVER)]
        current = self.current
        redelivery = self._redelivery
        if (
            redelivery is None
            or not redelivery.waiting
            or current is None
            or self.phase is not _WAITING_FOR_CONFIRMATION
        ):
            return effects  # stopped meanwhile
        redelivery.redeliver()
        self._delivered += 1
        assert self.consumer is not None
        effects.append(Send(self.consumer, self._delivery(current)))
        return effects

    def _retry_now(self, effects: list[Effect]) -> None:
        """Repeat what the peer may have missed: registration, Request, or Resend."""
        if self.registering is not None:
            effects.append(Send(self.registering, RegisterConsumer(self.self_ref)))
        elif self.phase is _ACTIVE:
            self._retry_request(effects)
        else:
            assert self.producer_controller is not None
            # Nothing received yet (a fresh controller met a session midway): Resend(0),
            # which marks the head first so that it is accepted.
            from_seq_nr = self.received_seq_nr + 1 if self.received_seq_nr else 0
            trace.retrying_resend(from_seq_nr)
            effects.append(Send(self.producer_controller, Resend(from_seq_nr)))

    def _retry_request(self, effects: list[Effect]) -> None:
        pc = self.producer_controller
        if pc is None:
            return
        if self.resend_lost:
            requested = self.requested_seq_nr
        else:
            requested = self.received_seq_nr + self._half
        trace.retrying_request(self.confirmed_seq_nr, requested)
        effects.append(Send(pc, Request(self.confirmed_seq_nr, requested, self.resend_lost, True)))
        self.requested_seq_nr = requested

    def _restart_retry(self, effects: list[Effect]) -> None:
        self._heard = False  # the new interval starts now
        effects.append(self._retry.restart())

    def _stop(self, effects: list[Effect]) -> None:
        if self.producer_controller is not None:
            effects.append(Send(self.producer_controller, Ack(self.confirmed_seq_nr)))
        self.phase = _STOPPED
        effects.append(Stop())
