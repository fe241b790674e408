"""The producer core's control inputs: who is connected, recovery, timers and closing.

Part of `ProducerCore` (core/producer.py), which inherits it: the inputs that are not the
flow of the producer's messages and the consumer side's confirmations. `on_start` (a
producer registers), `on_register_consumer` (a consumer controller connects: the payload
gate is aimed at it, and what it may not have seen is resent), `on_resend` (a gap),
`on_timer` (the first message's resend, the stuck check), `on_closed`; fencing (the
highest epoch registered is served, a lower one is refused and told `Fenced`); becoming active,
and starting from what a durable queue loaded (Akka's ``createState``); the resends they
share with the flow (`_resend`, `_push_backlog`, `_resend_first`) and the `RequestNext`
the core tells its producer. They read and assign the same state as the rest of the core;
nothing outside the two modules assigns it.
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from collections.abc import Callable
from typing import Any, Final

from pykka_delivery.delivery.core.durable_state import DurableProducerState
from pykka_delivery.delivery.core.effects import CancelTimer, Effect, Send, StartTimer
from pykka_delivery.delivery.core.payload_gate import PayloadGate
from pykka_delivery.delivery.core.producer_records import (
    ACTIVE as _ACTIVE,
)
from pykka_delivery.delivery.core.producer_records import (
    WAITING_FOR_INITIALIZATION as _WAITING_FOR_INITIALIZATION,
)
from pykka_delivery.delivery.core.producer_records import (
    ProducerCounters,
    ProducerPhase,
)
from pykka_delivery.delivery.core.settings import ProducerControllerSettings
from pykka_delivery.delivery.core.stuck import StuckCheck
from pykka_delivery.delivery.messages import RequestNext
from pykka_delivery.protocol.messages import Fenced, Ref, SequencedMessage
from pykka_delivery.protocol.payload_check import PayloadCheck

__all__ = ["RESEND_FIRST", "STUCK_CHECK", "ProducerControl", "no_clock"]

logger = logging.getLogger("pykka_delivery.producer")

STUCK_CHECK = "stuck_check"
"""Key of the timer that looks for messages unconfirmed longer than ``stuck_after``."""

RESEND_FIRST = "resend_first"
"""Key of the timer that resends the first message of a session until it is confirmed."""


# Consumer controllers shut out by a newer epoch that the core remembers, to answer their
# retries with Fenced; an older one is forgotten (it was told once already).
_SUPERSEDED_LIMIT: Final = 64


def no_clock() -> int:
    """The clock of a core without a durable queue: it reads none."""
    msg = "ProducerCore without a durable_state reads no clock"
    raise AssertionError(msg)


class ProducerControl:
    """The control inputs of `ProducerCore` (see the module docstring)."""

    # The core's state these inputs read and assign too (set in ProducerCore.__init__).
    __slots__ = (
        "_backlog_end",
        "_check",
        "_clock",
        "_closed",
        "_counts",
        "_durable",
        "_fast_up_to",
        "_plain",
        "_stuck",
        "_superseded",
        "ask_next_to",
        "confirmed_seq_nr",
        "consumer",
        "current_seq_nr",
        "epoch",
        "first_seq_nr",
        "gate",
        "phase",
        "producer",
        "producer_id",
        "remaining_chunks",
        "requested",
        "requested_seq_nr",
        "self_ref",
        "send_next_to",
        "settings",
        "unconfirmed",
    )

    producer_id: str
    self_ref: Ref
    send_next_to: Ref
    ask_next_to: Ref
    settings: ProducerControllerSettings
    phase: ProducerPhase
    producer: Ref | None
    consumer: Ref | None
    current_seq_nr: int
    confirmed_seq_nr: int
    requested_seq_nr: int
    first_seq_nr: int
    requested: bool
    unconfirmed: deque[SequencedMessage]
    remaining_chunks: deque[SequencedMessage]
    gate: PayloadGate
    _check: PayloadCheck | None
    _backlog_end: int
    _counts: ProducerCounters
    _stuck: StuckCheck
    _durable: bool
    _closed: bool
    _clock: Callable[[], int]
    _plain: bool
    _fast_up_to: int
    epoch: int
    _superseded: dict[int, Ref]

    # --- inputs ----------------------------------------------------------------------

    def on_start(self, producer: Ref) -> list[Effect]:
        """A producer registers (`ProducerStart`), perhaps replacing an earlier one."""
        self.producer = producer
        if self.phase is _WAITING_FOR_INITIALIZATION:
            return self._become_active_if_ready()
        logger.debug(
            "Register new producer for %r, current_seq_nr %d", self.producer_id, self.current_seq_nr
        )
        if self.requested and not self.remaining_chunks:
            return [Send(producer, self._request_next(self.current_seq_nr, self.confirmed_seq_nr))]
        return []

    def on_register_consumer(self, consumer_controller: Ref, epoch: int = 0) -> list[Effect]:
        """Connect to a (new) consumer controller; the next message starts its session.

        Fencing: one of an ``epoch`` lower than the highest registered is refused (the
        current one keeps the stream) and told `Fenced`; a higher one takes over, and the
        consumer controller it replaces is told `Fenced` at once."""
        current = self.epoch
        if epoch < current:
            return self._refuse_fenced(epoch, consumer_controller)
        if epoch == current:
            return self._connect(consumer_controller)
        self.epoch = epoch
        old = self.consumer
        if old is None or old == consumer_controller:
            return self._connect(consumer_controller)
        return self._supersede(old, current) + self._connect(consumer_controller)

    def _connect(self, consumer_controller: Ref) -> list[Effect]:
        self.consumer = consumer_controller
        self._check = self.gate.aim((consumer_controller,))
        if self.phase is _WAITING_FOR_INITIALIZATION:
            return self._become_active_if_ready()
        self.first_seq_nr = self.unconfirmed[0].seq_nr if self.unconfirmed else self.current_seq_nr
        self._backlog_end = self.current_seq_nr - 1
        logger.debug(
            "Register new consumer controller for %r, starting with seq_nr %d",
            self.producer_id,
            self.first_seq_nr,
        )
        if not self.unconfirmed:
            return []
        # Only the first unconfirmed goes now; the rest follow its confirmation (on_request).
        effects: list[Effect] = [StartTimer(RESEND_FIRST, self.settings.resend_first_interval)]
        self._resend_first(effects)
        return effects

    def on_resend(self, from_seq_nr: int) -> list[Effect]:
        """The consumer side saw a gap: resend everything unconfirmed from ``from_seq_nr``."""
        self._counts.resend_requests += 1
        unconfirmed = self.unconfirmed
        if unconfirmed and from_seq_nr < unconfirmed[0].seq_nr:
            # P2: mark the head first *before* resending, so a fresh consumer accepts it now.
            # Also when the consumer asks for seq_nrs confirmed already: confirmed by the
            # consumer before it, whose last Ack arrived after this one registered (a
            # hand-over). They cannot be resent; the consumer restarts its session at the
            # head, which it accepts as first (consumer_core, `_resending`).
            unconfirmed[0] = unconfirmed[0].as_first()
        effects: list[Effect] = []
        self._resend([m for m in unconfirmed if m.seq_nr >= from_seq_nr], effects)
        return effects

    def on_timer(self, key: str) -> list[Effect]:
        """A timer started by this core fired."""
        if key == STUCK_CHECK:
            self._stuck.check(self._clock() / 1000, self.current_seq_nr - 1, self.confirmed_seq_nr)
            return []
        if key != RESEND_FIRST:
            return []
        effects: list[Effect] = []
        if self.unconfirmed and self.unconfirmed[0].seq_nr == self.first_seq_nr:
            self._resend_first(effects)
        elif self.current_seq_nr > self.first_seq_nr:
            effects.append(CancelTimer(RESEND_FIRST))
        return effects

    def on_closed(self) -> tuple[int, int] | None:
        """The producer is closed for good. Without a durable queue what is still
        unconfirmed is never resent: counted once (``lost_on_close``), and its first and
        last seq_nr returned; None when nothing is lost (all confirmed, durable, or counted
        by an earlier call)."""
        if self._durable or self._closed:
            return None
        self._closed = True
        pending = [*self.unconfirmed, *self.remaining_chunks]
        first = pending[0].seq_nr if pending else self.confirmed_seq_nr + 1
        last = max(self.current_seq_nr - 1, pending[-1].seq_nr if pending else 0)
        if last < first:
            return None
        self._counts.lost_on_close += last - first + 1
        return first, last

    # --- internals -------------------------------------------------------------------

    def _supersede(self, old: Ref, old_epoch: int) -> list[Effect]:
        """``old``, of ``old_epoch``, was shut out by the new highest epoch: told so now,
        and remembered to be told again when it retries (`_refuse_fenced`)."""
        logger.info(
            "ProducerController %r: a consumer controller of epoch %d takes over, the one of "
            "epoch %d is fenced",
            self.producer_id,
            self.epoch,
            old_epoch,
        )
        superseded = self._superseded
        if len(superseded) >= _SUPERSEDED_LIMIT:
            del superseded[min(superseded)]
        superseded[old_epoch] = old
        return [Send(old, Fenced(self.epoch, self.producer_id))]

    def _refuse_fenced(self, epoch: int, retrying: Ref | None) -> list[Effect]:
        """A `RegisterConsumer`, `Request` or `Ack` of an ``epoch`` lower than the highest
        registered: ignored, and answered with `Fenced` when it is a retry (``retrying``:
        its sender, or the one of that epoch remembered by `_supersede`; None: its
        sender was told at once when it was shut out)."""
        self._counts.fenced += 1
        if retrying is None:
            return []
        logger.debug(
            "ProducerController %r: fenced a consumer controller of epoch %d (serving %d)",
            self.producer_id,
            epoch,
            self.epoch,
        )
        return [Send(retrying, Fenced(self.epoch, self.producer_id))]

    def _become_active_if_ready(self) -> list[Effect]:
        if self.producer is None or self.consumer is None:
            return []
        self.phase = _ACTIVE
        stuck_after = self.settings.stuck_after
        if stuck_after and self._clock is not no_clock:
            check: list[Effect] = [StartTimer(STUCK_CHECK, stuck_after / 4)]
            return check + self._activate(self.producer)
        return self._activate(self.producer)

    def _activate(self, producer: Ref) -> list[Effect]:
        logger.debug("ProducerController %r active", self.producer_id)
        if self.unconfirmed:
            # Reloaded from a durable queue: the first unconfirmed goes now, marked first,
            # the rest once the consumer side confirms it (on_request); the producer waits
            # for the consumer's Request. P3: the timer resends it if it is lost.
            logger.debug(
                "ProducerController %r starting with %d unconfirmed",
                self.producer_id,
                len(self.unconfirmed),
            )
            effects: list[Effect] = [StartTimer(RESEND_FIRST, self.settings.resend_first_interval)]
            self._resend_first(effects)
            return effects
        self.requested = True
        self._open_fast_path()
        return [Send(producer, self._request_next(self.current_seq_nr, self.confirmed_seq_nr))]

    def _open_fast_path(self) -> None:
        if self.requested and self._plain and self.phase is _ACTIVE:
            self._fast_up_to = self.requested_seq_nr

    def _load(self, state: DurableProducerState) -> None:
        """Akka's ``createState``: continue from what the durable queue holds."""
        # The queue drops partly stored chunked messages on load already; one that forgot
        # must not make us resend half a message.
        state = state.cleanup_partial_chunked_messages()
        self.unconfirmed = deque(state.to_resend(self.producer_id, self.self_ref))
        self.current_seq_nr = state.current_seq_nr
        self.confirmed_seq_nr = state.highest_confirmed_seq_nr
        # The Pekko fix (#2760): up to current_seq_nr, not 1, or the first send after a
        # reload with nothing unconfirmed would be refused for lack of demand.
        self.requested_seq_nr = state.current_seq_nr
        # Akka: highest confirmed + 1, which is the same seq_nr for a point-to-point queue;
        # taken from what is actually there, the first message sent is always marked first.
        self.first_seq_nr = self.unconfirmed[0].seq_nr if self.unconfirmed else state.current_seq_nr
        self._backlog_end = state.current_seq_nr - 1

    def _request_next(self, current_seq_nr: int, confirmed_seq_nr: int) -> RequestNext:
        return RequestNext(
            self.producer_id, current_seq_nr, confirmed_seq_nr, self.send_next_to, self.ask_next_to
        )

    def _resend(self, messages: Any, effects: list[Effect]) -> None:
        if not messages:
            return
        consumer = self.consumer
        assert consumer is not None
        logger.debug(
            "Resending %r seq_nr %d-%d", self.producer_id, messages[0].seq_nr, messages[-1].seq_nr
        )
        for seq_msg in messages:
            effects.append(Send(consumer, seq_msg))
        self._counts.resent += len(messages)

    def _push_backlog(self, effects: list[Effect]) -> None:
        """The consumer controller confirmed its first message: send it what was sent
        before it registered and is still unconfirmed (P16). What went out after it
        registered reached it behind its first message, on the same ordered link; a loss
        there shows as a gap or ends in its retry (``via_timeout``), which resends all."""
        end = self._backlog_end
        backlog = list(itertools.takewhile(lambda m: m.seq_nr <= end, self.unconfirmed))
        self._resend(backlog, effects)

    def _resend_first(self, effects: list[Effect]) -> None:
        assert self.consumer is not None
        logger.debug("Resending first %r seq_nr %d", self.producer_id, self.first_seq_nr)
        effects.append(Send(self.consumer, self.unconfirmed[0].as_first()))
        self._counts.resent += 1
