"""The consumer core's control inputs: registration, stopping, link events and timers.

Part of `ConsumerCore` (core/consumer.py), which inherits it: the inputs that are not the
flow of `SequencedMessage`s and confirmations. `on_register_to` (connect from the consumer
side), `on_deliver_then_stop`, `on_consumer_terminated` and `on_stopped` (the three ways
to stop), `on_fenced` (a newer fencing epoch shut this one out), `on_peer_link_changed`
(retry at once when a link comes back), `on_timer` (the retry timer and the redelivery of
a rejected message), and the retry rules they share.
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
from pykka_delivery.errors import ConsumerFenced
from pykka_delivery.protocol.messages import (
    Ack,
    Fenced,
    PeerLinkChanged,
    Ref,
    RegisterConsumer,
    Request,
    Resend,
    SequencedMessage,
    SequencedRun,
)

__all__ = ["ConsumerControl", "check_epoch"]


def check_epoch(epoch: object, owner: str) -> int:
    """``epoch`` if it is a fencing epoch (an int >= 0).

    Raises:
        TypeError, ValueError: it is not; the message names ``owner``'s argument.
    """
    if type(epoch) is not int:  # bool is not an epoch
        msg = (
            f"{owner}: epoch must be an int >= 0 (the fencing epoch of this activation, "
            f"from the coordinator; 0: none), got {type(epoch).__name__} {epoch!r}"
        )
        raise TypeError(msg)
    if epoch < 0:
        msg = (
            f"{owner}: epoch must be >= 0 (the fencing epoch of this activation, from the "
            f"coordinator; 0: none), got {epoch}"
        )
        raise ValueError(msg)
    return epoch


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
        "epoch",
        "fenced_by",
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
    epoch: int
    fenced_by: Fenced | None
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
            return [Send(producer_controller, RegisterConsumer(self.self_ref, self.epoch))]
        if producer_controller == self.producer_controller:
            return []
        trace.registering(self.producer_id)
        effects: list[Effect] = []
        self._restart_retry(effects)
        effects.append(Send(producer_controller, RegisterConsumer(self.self_ref, self.epoch)))
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
        return [Send(self.producer_controller, Ack(self.confirmed_seq_nr, self.epoch))]

    def on_fenced(self, fenced: Fenced) -> list[Effect]:
        """A producer controller serves a newer fencing epoch than ours: stop at once,
        delivering and confirming nothing more (not even the last `Ack`: it would not
        count). A `Fenced` of an epoch not above ours is a late one from before we
        registered: ignored."""
        if fenced.epoch <= self.epoch or self.fenced_by is not None:
            return []
        trace.fenced(self.epoch, fenced.epoch, fenced.producer_id)
        self.fenced_by = fenced
        self.phase = _STOPPED
        self.current = None
        self.stash.clear()
        return [Stop()]

    def fenced_error(self) -> ConsumerFenced | None:
        """The error of a controller shut out by a newer epoch (`on_fenced`), or None."""
        fenced = self.fenced_by
        if fenced is None:
            return None
        msg = (
            f"Consumer of fencing epoch {self.epoch} was shut out: producer "
            f"{fenced.producer_id!r} serves epoch {fenced.epoch}, a newer activation of this "
            "consumer's group. Nothing it delivers or confirms counts any more (its "
            "unconfirmed messages go to the newer consumer): close it, and start a new one "
            "only with a new activation's epoch"
        )
        return ConsumerFenced(msg, self.epoch, fenced.epoch)

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
                effects.append(Send(self.registering, RegisterConsumer(self.self_ref, self.epoch)))
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
            effects.append(Send(self.registering, RegisterConsumer(self.self_ref, self.epoch)))
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
        effects.append(Send(pc, self._request(self.confirmed_seq_nr, requested, True)))
        self.requested_seq_nr = requested

    def _request(self, confirmed_seq_nr: int, up_to: int, via_timeout: bool = False) -> Request:
        """A `Request` of this controller (its mode and fencing epoch)."""
        return Request(confirmed_seq_nr, up_to, self.resend_lost, via_timeout, self.epoch)

    def _restart_retry(self, effects: list[Effect]) -> None:
        self._heard = False  # the new interval starts now
        effects.append(self._retry.restart())

    def _stop(self, effects: list[Effect]) -> None:
        if self.producer_controller is not None:
            effects.append(Send(self.producer_controller, Ack(self.confirmed_seq_nr, self.epoch)))
        self.phase = _STOPPED
        effects.append(Stop())
