"""The consumer controller's state machine, pure: messages in, effects out.

Theory of operation (a port of Pekko's ``ConsumerControllerImpl``; names kept):

* The consumer registers with `ConsumerStart`; until then `SequencedMessage`s are stashed
  (at most ``flow_control_window``; more are dropped, the producer side resends them).
* The first message of a session (``first``, or any message in only-flow-control mode)
  binds the core to its producer controller and is answered with
  ``Request(0, seq_nr + window - 1)``.
* Messages are handed to the consumer one at a time as `Delivery`; the next one only after
  `Confirmed`. Messages that arrive meanwhile are stashed.
* Confirming the first message sends ``Request(seq_nr, seq_nr + window - 1)`` at once (it
  stops the producer's first-message resends). After that a new `Request` goes out when
  half the window is left, moving it by half a window; a confirmed message that asked for
  it (``ack``) is answered with `Ack` in between.
* A gap sends ``Resend(expected)``, drops the stash and ignores everything until the
  expected seq_nr arrives (phase RESENDING). Duplicates are dropped; a duplicate first
  message means our `Request` was lost, so it is repeated.
* A retry timer (consumer_retry.py) repeats the last `Request` (``via_timeout``, making
  the producer resend all unconfirmed), the `Resend`, or the `RegisterConsumer` when
  nothing arrives.

Decision where we differ from the original (docs/decisions.md, P1): the half-window rule
fires when *at most* half the window is left and moves by ``max(1, window // 2)``, and the
first confirmation always opens at least one seq_nr, so windows of 1 and 2 flow instead of
stalling. For windows of 3 and more, and without gaps, the Requests are exactly Akka's. In
only-flow-control mode a gap can carry a confirmed seq_nr past the requested one; we then
ask for more at once (Akka waits for its retry timer).

P6, also ours: the retry timer ticks at a fixed rate, and Akka retries on every tick it
meets in the active phase, so while messages flow it still makes the producer resend its
whole window every ``resend_interval_min``. We retry only after a tick interval in which no
`SequencedMessage` arrived, so a retry comes one to two intervals after the flow stops.

P10: a fresh core that meets a session midway sends ``Resend(0)`` and, unlike Akka, takes
that producer controller at once, so its retry repeats ``Resend(0)`` to it.

Beyond Akka: deduplication across restarts (consumer_dedup.py: a message confirmed here
before a restart is confirmed again at once instead of being delivered), and rejections
(consumer_redelivery.py: delivered again after a backoff, then to the dead letters).

The steady state, where a message needs nothing but its delivery, is one predicate,
`next_delivery`: the consumer session tries it first for every message, and for the next
message of a `SequencedRun`, with no effect list built. `on_confirmed` has the matching
shortcut for the confirmation.

Only this module assigns the core's fields (see producer.py for why they are mutable); its
parts (retry timer, deduplication positions, redelivery, chunks) are assigned by theirs.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from pykka_delivery.delivery.core import consumer_trace as trace
from pykka_delivery.delivery.core.consumer_chunks import ChunkCollector
from pykka_delivery.delivery.core.consumer_control import ConsumerControl, check_epoch
from pykka_delivery.delivery.core.consumer_dedup import DedupPositions
from pykka_delivery.delivery.core.consumer_records import (
    ACTIVE,
    RESENDING,
    STOPPED,
    WAITING_FOR_CONFIRMATION,
    WAITING_FOR_START,
    ConsumerPhase,
    ConsumerSnapshot,
    ConsumerStats,
)
from pykka_delivery.delivery.core.consumer_redelivery import REDELIVER, Redelivery
from pykka_delivery.delivery.core.consumer_retry import RETRY, RetryTimer
from pykka_delivery.delivery.core.effects import CancelTimer, Effect, Send, StartTimer
from pykka_delivery.delivery.core.settings import (
    ACTOR_FLOW_CONTROL_WINDOW,
    ConsumerControllerSettings,
)
from pykka_delivery.delivery.messages import (
    Confirmed,
    ConsumerStart,
    DeliverThenStop,
    Delivery,
    RegisterToProducerController,
    Rejected,
    new_delivery,
)
from pykka_delivery.errors import LocalProtocolError
from pykka_delivery.protocol.messages import (
    Ack,
    ChunkedMessage,
    Fenced,
    PeerLinkChanged,
    Ref,
    Resend,
    SequencedMessage,
    SequencedRun,
)
from pykka_delivery.protocol.serialization import Serialization, default_serialization

__all__ = [
    "REDELIVER",
    "RETRY",
    "ConsumerCore",
    "ConsumerPhase",
    "ConsumerSnapshot",
    "ConsumerStats",
]

# The phases as module globals: the hot paths compare phases on every message, and a
# global is cheaper to look up than an enum member.
_WAITING_FOR_START = WAITING_FOR_START
_ACTIVE = ACTIVE
_RESENDING = RESENDING
_WAITING_FOR_CONFIRMATION = WAITING_FOR_CONFIRMATION
_STOPPED = STOPPED


class ConsumerCore(ConsumerControl):
    """State machine of one consumer controller.

    Args:
        self_ref: where the producer side reaches this controller; sent in
            `RegisterConsumer`.
        settings: see `ConsumerControllerSettings`.
        serialization: used to deserialize chunked messages.
        confirm_to: where the consumer sends `Confirmed` (``Delivery.confirm_to``); the
            consumer is local, so this is usually the controller's own local ref.
            Default: ``self_ref``.
        new_confirm_to: instead of ``confirm_to``, make a new one per delivery (the
            consumer handles tell a delivery's confirmation from another's this way).
        dedup_positions: turns deduplication on: the highest confirmed seq_nr per
            producer id, as loaded from a `DedupStore` (empty for a new store). None
            (the default): no deduplication across sessions, as in Akka.
        default_window: the window when ``settings.flow_control_window`` is None: the
            shell's default (`ACTOR_FLOW_CONTROL_WINDOW`, Akka's 50, unless a handle's
            session says `HANDLE_FLOW_CONTROL_WINDOW`).
        epoch: the fencing epoch of this activation (from a coordinator; 0: none), sent
            in every `RegisterConsumer`, `Request` and `Ack`. A `Fenced` of a higher
            epoch stops the core (`on_fenced`).

    Raises:
        TypeError, ValueError: ``epoch`` is not an int >= 0.

    Call `on_spawned` once before anything else: it starts the retry timer.
    """

    __slots__ = (
        "_chunks",
        "_confirmed_count",
        "_dead_lettered",
        "_dedup",
        "_dropped",
        "_duplicates",
        "_fast_floor",
        "_floor",
        "_gaps",
        "_handlers",
        "_rejected",
        "new_confirm_to",
        "settings",
        "window",
    )

    def __init__(
        self,
        self_ref: Ref,
        settings: ConsumerControllerSettings | None = None,
        serialization: Serialization | None = None,
        confirm_to: Ref | None = None,
        new_confirm_to: Callable[[], Ref] | None = None,
        *,
        dedup_positions: Mapping[str, int] | None = None,
        default_window: int = ACTOR_FLOW_CONTROL_WINDOW,
        epoch: int = 0,
    ) -> None:
        self.epoch = check_epoch(epoch, "ConsumerController")
        self.fenced_by = None
        self.self_ref = self_ref
        if new_confirm_to is None:
            target = self_ref if confirm_to is None else confirm_to

            def new_confirm_to() -> Ref:
                return target

        self.new_confirm_to = new_confirm_to
        self.settings = settings = settings or ConsumerControllerSettings()
        self.window = settings.window(default_window)
        self._half = max(1, self.window // 2)
        self.resend_lost = not settings.only_flow_control
        self.phase = _WAITING_FOR_START
        self.consumer: Ref | None = None
        self.producer_controller: Ref | None = None
        self.producer_id = "n/a"
        self.received_seq_nr = self.confirmed_seq_nr = self.requested_seq_nr = 0
        self.stash: deque[SequencedMessage] = deque()
        self.registering: Ref | None = None
        self.stopping = False
        # The delivery awaiting confirmation (a run stands for its message taken last).
        self.current: SequencedMessage | SequencedRun | None = None
        self._retry = RetryTimer(settings)
        self._heard = False  # a SequencedMessage arrived since the last retry tick (P6)
        self._chunks = ChunkCollector(serialization or default_serialization)
        self._redelivery: Redelivery | None = None  # the current delivery was rejected
        self._delivered = self._confirmed_count = self._duplicates = self._gaps = 0
        self._dropped = self._rejected = self._dead_lettered = 0
        # Deduplication (None: off), and the current session's floor: seq_nrs at or
        # below it were confirmed before the session began.
        self._dedup = (
            None
            if dedup_positions is None
            else DedupPositions(dedup_positions, settings.on_sequence_restart)
        )
        self._floor = 0
        # next_delivery's one check for both "a new session" (seq_nr 1) and "a duplicate".
        self._fast_floor = 1
        self._handlers: dict[type, Callable[[Any], list[Effect]]] = {
            SequencedMessage: self.on_sequenced,
            Confirmed: lambda _: self.on_confirmed(),
            Rejected: lambda m: self.on_rejected(m.reason),
            ConsumerStart: lambda m: self.on_start(m.deliver_to),
            RegisterToProducerController: lambda m: self.on_register_to(m.producer_controller),
            DeliverThenStop: lambda _: self.on_deliver_then_stop(),
            PeerLinkChanged: self.on_peer_link_changed,
            Fenced: self.on_fenced,
        }

    # --- queries ---------------------------------------------------------------------

    def snapshot(self) -> ConsumerSnapshot:
        return ConsumerSnapshot(
            phase=self.phase,
            producer_id=self.producer_id,
            received_seq_nr=self.received_seq_nr,
            confirmed_seq_nr=self.confirmed_seq_nr,
            requested_seq_nr=self.requested_seq_nr,
            stashed=tuple(m.seq_nr for m in self.stash),
            collected_chunks=tuple(m.seq_nr for m in self._chunks.pieces),
            registering=self.registering is not None,
            stopping=self.stopping,
            retry_interval=self._retry.interval,
        )

    def statistics(self) -> ConsumerStats:
        dedup = self._dedup
        return ConsumerStats(
            delivered=self._delivered,
            confirmed=self._confirmed_count,
            duplicates=self._duplicates,
            gaps=self._gaps,
            dropped=self._dropped + self._chunks.lost,
            retries=self._retry.retries,
            dedup_duplicates=0 if dedup is None else dedup.duplicates,
            dedup_gaps=0 if dedup is None else dedup.gaps,
            sequence_restarts=0 if dedup is None else dedup.sequence_restarts,
            rejected=self._rejected,
            dead_lettered=self._dead_lettered,
        )

    def dedup_positions(self) -> dict[str, int] | None:
        """A copy of the deduplication positions (producer id -> highest confirmed
        seq_nr), or None when deduplication is off."""
        return None if self._dedup is None else dict(self._dedup.positions)

    @property
    def is_stopped(self) -> bool:
        return self.phase is _STOPPED

    # --- inputs ----------------------------------------------------------------------

    def on_spawned(self) -> list[Effect]:
        """The controller exists: start the retry timer (it also repeats registration)."""
        return [self._retry.start()]

    def receive(self, message: object) -> list[Effect]:
        """Handle any message a consumer controller accepts.

        Raises:
            LocalProtocolError: not a message a consumer controller handles, or one that
                breaks the protocol in the current phase; the state did not change.
        """
        handler = self._handlers.get(type(message))
        if handler is None:
            msg = (
                f"ConsumerController cannot handle {type(message).__name__} "
                f"(in phase {self.phase.value})"
            )
            raise LocalProtocolError(msg)
        return handler(message)

    def on_start(self, deliver_to: Ref) -> list[Effect]:
        """The consumer registers (`ConsumerStart`), perhaps replacing an earlier one."""
        phase = self.phase
        if phase is _STOPPED:
            return []
        if phase is _WAITING_FOR_START:
            self.consumer = deliver_to
            self.phase = _ACTIVE
            trace.started(len(self.stash))
            effects: list[Effect] = []
            self._restart_retry(effects)
            self._unstash(effects)
            return effects
        if deliver_to == self.consumer:
            return []
        self.consumer = deliver_to
        if phase is _WAITING_FOR_CONFIRMATION:
            assert self.current is not None
            effects = [Send(deliver_to, self._delivery(self.current))]  # the new one gets it
            redelivery = self._redelivery
            if redelivery is not None and redelivery.waiting:  # now, not after the backoff
                redelivery.skip_backoff()
                effects.insert(0, CancelTimer(REDELIVER))
            return effects
        return []

    def on_sequenced(self, msg: SequencedMessage) -> list[Effect]:
        """A `SequencedMessage` arrived from a producer controller."""
        phase = self.phase
        effects: list[Effect] = []
        self._heard = True
        if phase is _ACTIVE:
            if self._retry.backing_off:
                self._restart_retry(effects)  # Akka's retryTimer.reset()
            self._active(msg, effects)
            if self.stash or self.stopping:
                self._unstash(effects)
        elif phase is _WAITING_FOR_CONFIRMATION:
            self._stash_while_waiting(msg)
        elif phase is _RESENDING:
            self._resending(msg, effects)
            self._unstash(effects)
        elif phase is _WAITING_FOR_START:
            if len(self.stash) >= self.window:
                self._dropped += 1
                trace.discarded(msg.seq_nr, "stash full before Start")
            else:
                self.stash.append(msg)
        return effects

    def next_delivery(
        self, head: SequencedMessage | SequencedRun, run: bool = False
    ) -> Delivery | None:
        """The steady state: `on_sequenced` without effects, for a `SequencedMessage`
        or, with ``run`` True, for the next message of the `SequencedRun` ``head`` (which
        must have one; it is taken from the run with no `SequencedMessage` of its own).
        Taken only if it is the next message in order from the current producer
        controller, with nothing stashed, registering, stopping or backing off, and not a
        chunk: exactly when `on_sequenced` would do nothing but deliver it. (The caller
        says which kind ``head`` is: it looked already, and a second look costs here.)

        Returns the `Delivery` for the caller to hand to the consumer itself, or None
        (nothing changed, nothing taken from a run): the message needs `on_sequenced`
        (for a run: its rest, `SequencedRun.expand`). A run stands for its delivered
        message until that one is confirmed: the caller takes no more from it until then.
        """
        seq_nr = head.seq_nr + 1 if run else head.seq_nr
        if (
            self.phase is not _ACTIVE
            or seq_nr != self.received_seq_nr + 1
            # seq_nr 1 (received_seq_nr 0: a new session, see _changed_producer) or, with
            # deduplication, at or below the session's floor (a duplicate, see _deliver).
            or seq_nr <= self._fast_floor
            or head.producer_controller is not self.producer_controller
            or self.registering is not None
            or self.stash
            or self.stopping
            or self._retry.backing_off
            or self.consumer is None
            or (not run and type(head.message) is ChunkedMessage)  # runs hold no chunks
        ):
            return None
        if run:  # run.take(), inlined: it runs once per message
            cursor: Any = head
            cursor.seq_nr = seq_nr
            cursor.message = cursor.messages[seq_nr - cursor.first_seq_nr]
        self._heard = True
        self.received_seq_nr = seq_nr
        self.current = head
        self.phase = _WAITING_FOR_CONFIRMATION
        self._delivered += 1
        return new_delivery(head.message, self.new_confirm_to(), head.producer_id, seq_nr, 1)

    def on_confirmed(self) -> list[Effect]:
        """The consumer confirmed the current `Delivery`.

        Raises:
            LocalProtocolError: no delivery is awaiting confirmation.
        """
        current = self.current
        if (
            current is not None
            and self.phase is _WAITING_FOR_CONFIRMATION
            and self.requested_seq_nr - current.seq_nr > self._half
            and self._redelivery is None
            and self._dedup is None
            and not self.stopping
            and not self.stash
            and not current.first
            and not current.ack
        ):
            # The steady state (what _complete does when there is nothing to tell, record
            # or unstash), once per message.
            self._confirmed_count += 1
            self.confirmed_seq_nr = current.seq_nr
            self.current = None
            self.phase = _ACTIVE
            return []
        current = self._awaited("Confirmed")
        effects: list[Effect] = []
        self._complete(current, effects)
        return effects

    def on_rejected(self, reason: str) -> list[Effect]:
        """The consumer could not process the current `Delivery`: deliver it again after
        the backoff, or, at ``max_attempts``, write it to the dead letters and move on.

        Raises:
            LocalProtocolError: no delivery is awaiting confirmation.
        """
        current = self._awaited("Rejected")
        self._rejected += 1
        redelivery = self._redelivery
        if redelivery is None:
            self._redelivery = redelivery = Redelivery()
        effect = redelivery.rejected(current, reason, self.settings)
        effects: list[Effect] = [effect]
        if type(effect) is StartTimer:
            return effects
        self._dead_lettered += 1
        self._complete(current, effects)
        return effects

    def _awaited(self, what: str) -> SequencedMessage | SequencedRun:
        """The message whose delivery awaits the consumer's answer ``what``.

        Raises:
            LocalProtocolError: none does (or a rejected one waits for its redelivery).
        """
        current = self.current
        redelivery = self._redelivery
        waiting = redelivery is not None and redelivery.waiting
        if self.phase is not _WAITING_FOR_CONFIRMATION or current is None or waiting:
            note = " (the rejected delivery comes again first)" if waiting else ""
            msg = (
                f"{what} received with no delivery awaiting confirmation{note} "
                f"(phase {self.phase.value}, last confirmed seq_nr {self.confirmed_seq_nr}): "
                "confirm or reject each Delivery once"
            )
            raise LocalProtocolError(msg)
        return current

    def _complete(self, current: SequencedMessage | SequencedRun, effects: list[Effect]) -> None:
        """The consumer is done with ``current`` (confirmed, or given up on): record it,
        tell the producer side as the window rule says, and take the next message."""
        self._confirmed_count += 1
        self._redelivery = None
        if self._dedup is not None:
            # Before the Request or Ack that tells the producer: the shell writes it first.
            effects.append(self._dedup.confirmed(current.producer_id, current.seq_nr))
        self._confirm(current, effects)
        if self.stopping and not self.stash:
            trace.stopped(current.seq_nr, buffered=True)
            self._stop(effects)
            return
        self.phase = _ACTIVE
        if self.stash:
            self._unstash(effects)

    def _confirm(self, current: SequencedMessage | SequencedRun, effects: list[Effect]) -> None:
        """``current`` is confirmed (by the consumer, or as a duplicate): tell the
        producer side when the window rule says so."""
        seq_nr = current.seq_nr
        pc = self.producer_controller
        assert pc is not None
        requested = self.requested_seq_nr
        if current.first:
            # Confirm the first message at once: it stops the producer's first-resends.
            requested = seq_nr - 1 + max(self.window, 2)  # window 1 still opens one more
            effects.append(Send(pc, self._request(seq_nr, requested)))
        elif requested - seq_nr <= self._half:
            # max(): in only-flow-control mode a gap may have carried seq_nr past requested.
            requested = max(requested, seq_nr) + self._half
            effects.append(Send(pc, self._request(seq_nr, requested)))
            self._restart_retry(effects)
        elif current.ack:
            effects.append(Send(pc, Ack(seq_nr, self.epoch)))
        self.confirmed_seq_nr = seq_nr
        self.requested_seq_nr = requested
        self.current = None

    # --- per-phase handling of a SequencedMessage ------------------------------------

    def _active(self, msg: SequencedMessage, effects: list[Effect]) -> None:
        seq_nr = msg.seq_nr
        expected = self.received_seq_nr + 1
        if msg.producer_controller != self.producer_controller or self.received_seq_nr == 0:
            self._changed_producer(msg, effects)
        elif self.registering is not None:
            self._dropped += 1
            trace.discarded(seq_nr, "registering to a new producer controller")
        elif seq_nr == expected:
            self.received_seq_nr = seq_nr
            self._deliver(msg, effects)
        elif seq_nr > expected:
            self._gaps += 1
            if self.resend_lost:
                trace.gap(seq_nr, expected, "requesting resend")
                effects.append(Send(msg.producer_controller, Resend(expected)))
                self._enter_resending(effects)
            else:
                trace.gap(seq_nr, expected, "delivering anyway")
                self.received_seq_nr = seq_nr
                self._deliver(msg, effects)
        else:
            self._duplicates += 1
            trace.duplicate(seq_nr, expected)
            if msg.first:
                self._retry_request(effects)  # the producer did not see our Request

    def _resending(self, msg: SequencedMessage, effects: list[Effect]) -> None:
        seq_nr = msg.seq_nr
        if (
            msg.producer_controller != self.producer_controller
            or self.received_seq_nr == 0
            # The producer marks first a head past the seq_nrs we asked for: another
            # consumer confirmed them (its late Ack after our registration), so they are
            # gone. Start the session again there, as with a new producer controller.
            or (msg.first and seq_nr > self.received_seq_nr + 1)
        ):
            self._changed_producer(msg, effects)
        elif self.registering is not None:
            self._dropped += 1
        elif seq_nr == self.received_seq_nr + 1:
            trace.missing_received(seq_nr)
            self.received_seq_nr = seq_nr
            self._deliver(msg, effects)
        else:
            self._dropped += 1
            if msg.first:
                self._retry_request(effects)

    def _changed_producer(self, msg: SequencedMessage, effects: list[Effect]) -> None:
        seq_nr = msg.seq_nr
        pc = msg.producer_controller
        if msg.first or not self.resend_lost:
            requested = seq_nr - 1 + self.window
            trace.associated(msg.producer_id, seq_nr, requested)
            effects.append(Send(pc, self._request(0, requested)))
            self.producer_controller = pc
            self.producer_id = msg.producer_id
            self.received_seq_nr = seq_nr
            self.confirmed_seq_nr = 0
            self.requested_seq_nr = requested
            if self.registering is not None and self.registering == pc:
                self.registering = None
            if self._dedup is not None:  # a session begins: its floor
                self._floor = floor = self._dedup.session_floor(msg.producer_id, seq_nr, effects)
                self._fast_floor = max(1, floor)
            self._deliver(msg, effects)
        elif self.received_seq_nr == 0:
            # A fresh controller met a session midway: ask for everything, head marked first.
            trace.met_midway(seq_nr)
            effects.append(Send(pc, Resend(0)))
            self.producer_controller = pc  # P10: so that the retry timer can repeat it
            self._enter_resending(effects)
        else:
            self._dropped += 1
            trace.unexpected_producer(seq_nr, msg.producer_id)

    def _stash_while_waiting(self, msg: SequencedMessage) -> None:
        current = self.current
        assert current is not None
        expected = current.seq_nr + len(self.stash) + 1
        if msg.seq_nr < expected and msg.producer_controller == current.producer_controller:
            self._duplicates += 1
        elif len(self.stash) >= self.window:
            self._dropped += 1  # the producer side will resend it
            trace.discarded(msg.seq_nr, "stash is full")
        else:
            self.stash.append(msg)

    # --- helpers ---------------------------------------------------------------------

    def _deliver(self, msg: SequencedMessage, effects: list[Effect]) -> None:
        """Hand a message to the consumer, or collect it if it is a chunk."""
        if msg.seq_nr <= self._floor:
            # Confirmed before this session began: confirmed at once instead of delivered.
            assert self._dedup is not None
            self._dedup.skipped(msg.producer_id, msg.seq_nr, self._floor)
            self._chunks.clear()
            self._confirm(msg, effects)
            self.phase = _ACTIVE  # the caller goes on unstashing
            return
        if type(msg.message) is ChunkedMessage:
            whole = self._chunks.add(msg)
            if whole is None:
                self._collecting(msg, effects)
                return
            msg = whole
        self.current = msg
        self.phase = _WAITING_FOR_CONFIRMATION
        self._delivered += 1
        assert self.consumer is not None
        effects.append(Send(self.consumer, self._delivery(msg)))

    def _collecting(self, msg: SequencedMessage, effects: list[Effect]) -> None:
        """A chunk was taken without a delivery: keep the window moving meanwhile."""
        self.phase = _ACTIVE  # also ends RESENDING: the gap is filled
        if self.requested_seq_nr - msg.seq_nr <= self._half:
            self.requested_seq_nr = max(self.requested_seq_nr, msg.seq_nr) + self._half
            assert self.producer_controller is not None
            request = self._request(self.confirmed_seq_nr, self.requested_seq_nr)
            effects.append(Send(self.producer_controller, request))
            self._restart_retry(effects)

    def _delivery(self, msg: SequencedMessage | SequencedRun) -> Delivery:
        attempt = 1 if self._redelivery is None else self._redelivery.attempt
        return new_delivery(
            msg.message, self.new_confirm_to(), msg.producer_id, msg.seq_nr, attempt
        )

    def _unstash(self, effects: list[Effect]) -> None:
        """Feed stashed messages back, one at a time, until one is delivered."""
        stash = self.stash
        while stash and self.phase is _ACTIVE:
            self._active(stash.popleft(), effects)
        if (
            self.stopping
            and self.phase is _ACTIVE
            and not stash
            and self.received_seq_nr == self.confirmed_seq_nr
        ):
            self._stop(effects)

    def _enter_resending(self, effects: list[Effect]) -> None:
        self._dropped += len(self.stash)
        self.stash.clear()
        self.phase = _RESENDING
        self._restart_retry(effects)
