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
* A retry timer repeats the last `Request` (``via_timeout``, making the producer resend all
  unconfirmed), the `Resend`, or the `RegisterConsumer` when nothing arrives: first after
  ``resend_interval_min``, then ×1.5 per silent retry up to ``resend_interval_max``.

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

Beyond Akka, deduplication across restarts (optional: ``dedup_positions``, loaded by the
shell from a `DedupStore`). Akka redelivers after a crash whatever the producer side had
not seen confirmed, with its original seq_nrs, from a new producer controller; some of it
the consumer may have processed already. With positions (producer id -> highest seq_nr
confirmed here), each session starts with a *floor*, that producer id's position when the
session began; a message at or below it is a duplicate: it is not delivered, but confirmed
at once as if it had been (the window and the producer's confirmations move on). Every
confirmation moves the position and emits `RecordConfirmed`, which the shell writes to the
store and flushes before the next `Request` or `Ack` leaves, so the producer side never
drops a message this consumer could forget. As in the broker of seed 002: the next seq_nr
is delivered, a seq_nr confirmed before is a duplicate, a session starting above position
+ 1 is a gap (reported with a warning, counted, and delivered). A session starting at
seq_nr 1 below a known position is a *sequence restart* (a producer without a durable
queue restarted, or a durable one resends what it had not seen confirmed): warned about,
and handled as ``settings.on_sequence_restart`` says.

Only this module assigns the core's fields (see producer_core.py for why they are mutable).
"""

from __future__ import annotations

import enum
import logging
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pykka_delivery.delivery.core.chunking import assemble_chunks
from pykka_delivery.delivery.core.effects import (
    CancelTimer,
    Effect,
    RecordConfirmed,
    Send,
    StartTimer,
    Stop,
    WriteDeadLetter,
)
from pykka_delivery.delivery.core.settings import ConsumerControllerSettings
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
    PeerLinkChanged,
    Ref,
    RegisterConsumer,
    Request,
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

logger = logging.getLogger("pykka_delivery.consumer")

RETRY = "retry"
"""Key of the timer that repeats Request / Resend / RegisterConsumer on silence."""

REDELIVER = "redeliver"
"""Key of the timer that delivers a rejected message again after its backoff."""


class ConsumerPhase(enum.Enum):
    WAITING_FOR_START = "waiting_for_start"  # no consumer yet: stash
    ACTIVE = "active"  # waiting for the next SequencedMessage
    RESENDING = "resending"  # gap seen: ignore all but the expected seq_nr
    WAITING_FOR_CONFIRMATION = "waiting_for_confirmation"  # a Delivery is out: stash
    STOPPED = "stopped"


# The phases as module globals: an enum member lookup costs ~65 ns in Python 3.11,
# a global ~8 ns, and the hot paths compare phases on every message.
_WAITING_FOR_START = ConsumerPhase.WAITING_FOR_START
_ACTIVE = ConsumerPhase.ACTIVE
_RESENDING = ConsumerPhase.RESENDING
_WAITING_FOR_CONFIRMATION = ConsumerPhase.WAITING_FOR_CONFIRMATION
_STOPPED = ConsumerPhase.STOPPED


@dataclass(frozen=True, slots=True)
class ConsumerSnapshot:
    """A frozen view of a consumer core's state (seq_nrs only, no payloads)."""

    phase: ConsumerPhase
    producer_id: str
    received_seq_nr: int
    confirmed_seq_nr: int
    requested_seq_nr: int
    stashed: tuple[int, ...]
    collected_chunks: tuple[int, ...]
    registering: bool
    stopping: bool
    retry_interval: float


@dataclass(frozen=True, slots=True)
class ConsumerStats:
    """Counters of a consumer controller, as a frozen snapshot.

    Attributes:
        delivered: deliveries handed to the consumer.
        confirmed: deliveries the consumer confirmed.
        duplicates: messages dropped as already received.
        gaps: gaps detected (a `Resend` sent).
        dropped: messages dropped for other reasons (stash full, wrong producer,
            registering elsewhere, waiting for a resend).
        retries: retry-timer firings that re-sent a Request, Resend or RegisterConsumer.
        dedup_duplicates: messages not delivered because the deduplication position
            shows them confirmed before (redelivered after a restart); each was
            confirmed to the producer side at once. Not included in ``duplicates``.
        dedup_gaps: sessions that started more than one seq_nr above the producer id's
            deduplication position: messages this consumer never confirmed are missing
            (each is logged as a warning naming them).
        sequence_restarts: sessions of a known producer id that started at seq_nr 1
            below its deduplication position (see ``on_sequence_restart``).
        rejected: deliveries the consumer rejected (each redelivered or dead-lettered).
        dead_lettered: messages written to the dead-letter destination after
            ``max_attempts`` rejected deliveries (counted in ``confirmed`` too: the
            stream moved on past them).
    """

    delivered: int
    confirmed: int
    duplicates: int
    gaps: int
    dropped: int
    retries: int
    dedup_duplicates: int
    dedup_gaps: int
    sequence_restarts: int
    rejected: int
    dead_lettered: int


class ConsumerCore:
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
            `Consumer` handle tells a delivery's confirmation from another's this way).
        dedup_positions: turns deduplication on: the highest confirmed seq_nr per
            producer id, as loaded from a `DedupStore` (empty for a new store). None
            (the default): no deduplication across sessions, as in Akka.

    Call `on_spawned` once before anything else: it starts the retry timer.
    """

    __slots__ = (
        "_attempt",
        "_confirmed_count",
        "_dead_lettered",
        "_dedup_duplicates",
        "_dedup_gaps",
        "_delivered",
        "_dropped",
        "_duplicates",
        "_fast_floor",
        "_floor",
        "_gaps",
        "_half",
        "_handlers",
        "_heard",
        "_links_down",
        "_min_interval",
        "_redelivering",
        "_rejected",
        "_retries",
        "_retry_interval",
        "_sequence_restarts",
        "collected_chunks",
        "confirmed_seq_nr",
        "consumer",
        "current",
        "dedup",
        "new_confirm_to",
        "phase",
        "producer_controller",
        "producer_id",
        "received_seq_nr",
        "registering",
        "requested_seq_nr",
        "resend_lost",
        "self_ref",
        "serialization",
        "settings",
        "stash",
        "stopping",
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
    ) -> None:
        self.self_ref = self_ref
        if new_confirm_to is None:
            target = self_ref if confirm_to is None else confirm_to

            def new_confirm_to() -> Ref:
                return target

        self.new_confirm_to = new_confirm_to
        self.settings = settings = settings or ConsumerControllerSettings()
        self.serialization = serialization or default_serialization
        self.window = settings.flow_control_window
        self._half = max(1, self.window // 2)
        self._min_interval = settings.resend_interval_min
        self.resend_lost = not settings.only_flow_control
        self.phase = _WAITING_FOR_START
        self.consumer: Ref | None = None
        self.producer_controller: Ref | None = None
        self.producer_id = "n/a"
        self.received_seq_nr = 0
        self.confirmed_seq_nr = 0
        self.requested_seq_nr = 0
        self.stash: deque[SequencedMessage] = deque()
        self.collected_chunks: list[SequencedMessage] = []
        self.registering: Ref | None = None
        self.stopping = False
        # The delivery awaiting confirmation (a run stands for its message taken last).
        self.current: SequencedMessage | SequencedRun | None = None
        self._retry_interval = settings.resend_interval_min
        self._heard = False  # a SequencedMessage arrived since the last retry tick
        self._links_down: set[str] = set()  # nodes whose link went down and is not back
        self._delivered = self._confirmed_count = self._duplicates = self._gaps = 0
        self._dropped = self._retries = 0
        # Deduplication: positions per producer id (None: off), and the current session's
        # floor (seq_nrs at or below it were confirmed before the session began).
        self.dedup: dict[str, int] | None = (
            None if dedup_positions is None else dict(dedup_positions)
        )
        self._floor = 0
        # next_delivery's one check for both "a new session" (seq_nr 1) and "a duplicate".
        self._fast_floor = 1
        self._dedup_duplicates = self._dedup_gaps = self._sequence_restarts = 0
        # Rejections: the current delivery's attempt (1 = first delivery), and whether a
        # redelivery of it waits for the REDELIVER timer.
        self._attempt = 1
        self._redelivering = False
        self._rejected = self._dead_lettered = 0
        self._handlers: dict[type, Callable[[Any], list[Effect]]] = {
            SequencedMessage: self.on_sequenced,
            Confirmed: lambda _: self.on_confirmed(),
            Rejected: lambda m: self.on_rejected(m.reason),
            ConsumerStart: lambda m: self.on_start(m.deliver_to),
            RegisterToProducerController: lambda m: self.on_register_to(m.producer_controller),
            DeliverThenStop: lambda _: self.on_deliver_then_stop(),
            PeerLinkChanged: self.on_peer_link_changed,
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
            collected_chunks=tuple(m.seq_nr for m in self.collected_chunks),
            registering=self.registering is not None,
            stopping=self.stopping,
            retry_interval=self._retry_interval,
        )

    def statistics(self) -> ConsumerStats:
        return ConsumerStats(
            delivered=self._delivered,
            confirmed=self._confirmed_count,
            duplicates=self._duplicates,
            gaps=self._gaps,
            dropped=self._dropped,
            retries=self._retries,
            dedup_duplicates=self._dedup_duplicates,
            dedup_gaps=self._dedup_gaps,
            sequence_restarts=self._sequence_restarts,
            rejected=self._rejected,
            dead_lettered=self._dead_lettered,
        )

    def dedup_positions(self) -> dict[str, int] | None:
        """A copy of the deduplication positions (producer id -> highest confirmed
        seq_nr), or None when deduplication is off."""
        return None if self.dedup is None else dict(self.dedup)

    @property
    def is_stopped(self) -> bool:
        return self.phase is _STOPPED

    # --- inputs ----------------------------------------------------------------------

    def on_spawned(self) -> list[Effect]:
        """The controller exists: start the retry timer (it also repeats registration)."""
        return [StartTimer(RETRY, self._retry_interval)]

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
            logger.debug("Received Start, unstashing %d messages", len(self.stash))
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
            if self._redelivering:  # now, not after the backoff
                self._redelivering = False
                effects.insert(0, CancelTimer(REDELIVER))
            return effects
        return []

    def on_sequenced(self, msg: SequencedMessage) -> list[Effect]:
        """A `SequencedMessage` arrived from a producer controller."""
        phase = self.phase
        effects: list[Effect] = []
        self._heard = True
        if phase is _ACTIVE:
            if self._retry_interval != self.settings.resend_interval_min:
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
                logger.debug(
                    "Received SequencedMessage seq_nr %d before Start, discarding it: stash full",
                    msg.seq_nr,
                )
            else:
                self.stash.append(msg)
        return effects

    def next_delivery(self, msg: SequencedMessage) -> Delivery | None:
        """`on_sequenced` for the steady state, without effects: the next message in order
        from the current producer controller, nothing stashed, registering, stopping or
        backing off, and not a chunk. Returns the `Delivery` for the caller to hand to the
        consumer itself, or None (nothing changed) when the message needs `on_sequenced`.

        The consumer handles call it for every message; its conditions are exactly those
        under which `on_sequenced` would do nothing but deliver.
        """
        seq_nr = msg.seq_nr
        if (
            self.phase is not _ACTIVE
            or seq_nr != self.received_seq_nr + 1
            # seq_nr 1 (received_seq_nr 0: a new session, see _changed_producer) or, with
            # deduplication, at or below the session's floor (a duplicate, see _deliver).
            or seq_nr <= self._fast_floor
            or msg.producer_controller is not self.producer_controller
            or self.registering is not None
            or self.stash
            or self.stopping
            or self._retry_interval != self._min_interval
            or type(msg.message) is ChunkedMessage
            or self.consumer is None
        ):
            return None
        self._heard = True
        self.received_seq_nr = seq_nr
        self.current = msg
        self.phase = _WAITING_FOR_CONFIRMATION
        self._delivered += 1
        return new_delivery(msg.message, self.new_confirm_to(), msg.producer_id, seq_nr, 1)

    def next_run_delivery(self, run: SequencedRun) -> Delivery | None:
        """`next_delivery` for the next message of ``run`` (which must have one), taken
        from the run without a `SequencedMessage` of its own. Returns None (nothing
        changed, nothing taken) when that message needs `on_sequenced`: the caller then
        feeds the rest of the run as `SequencedMessage` objects (`SequencedRun.expand`).

        The run stands for the delivered message until it is confirmed (it is kept as the
        delivery awaiting confirmation): the caller takes no more from it until then.
        """
        seq_nr = run.seq_nr + 1
        if (
            self.phase is not _ACTIVE
            or seq_nr != self.received_seq_nr + 1
            or seq_nr <= self._fast_floor
            or run.producer_controller is not self.producer_controller
            or self.registering is not None
            or self.stash
            or self.stopping
            or self._retry_interval != self._min_interval
            or self.consumer is None
        ):
            return None
        # run.take(), inlined: never a chunk, runs hold plain messages only.
        run.seq_nr = seq_nr
        run.message = message = run.messages[seq_nr - run.first_seq_nr]
        self._heard = True
        self.received_seq_nr = seq_nr
        self.current = run
        self.phase = _WAITING_FOR_CONFIRMATION
        self._delivered += 1
        return new_delivery(message, self.new_confirm_to(), run.producer_id, seq_nr, 1)

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
            and not self._redelivering
            and self.dedup is None
            and not self.stopping
            and not self.stash
            and not current.first
            and not current.ack
        ):
            # The steady state (what _complete does when there is nothing to tell, record
            # or unstash), once per message.
            self._confirmed_count += 1
            self._attempt = 1
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
        attempt = self._attempt
        settings = self.settings
        if attempt < settings.max_attempts:
            backoff = min(
                settings.redelivery_backoff * 2 ** (attempt - 1), settings.redelivery_backoff_max
            )
            logger.debug(
                "Delivery %r seq_nr %d rejected (attempt %d of %d), again in %s s: %s",
                current.producer_id,
                current.seq_nr,
                attempt,
                settings.max_attempts,
                backoff,
                reason,
            )
            self._redelivering = True
            return [StartTimer(REDELIVER, backoff)]
        logger.warning(
            "Delivery %r seq_nr %d rejected %d times, to the dead letters: %s",
            current.producer_id,
            current.seq_nr,
            attempt,
            reason,
        )
        self._dead_lettered += 1
        effects: list[Effect] = [
            WriteDeadLetter(current.producer_id, current.seq_nr, current.message, reason, attempt)
        ]
        self._complete(current, effects)
        return effects

    def _awaited(self, what: str) -> SequencedMessage | SequencedRun:
        """The message whose delivery awaits the consumer's answer ``what``.

        Raises:
            LocalProtocolError: none does (or a rejected one waits for its redelivery).
        """
        current = self.current
        if self.phase is not _WAITING_FOR_CONFIRMATION or current is None or self._redelivering:
            waiting = " (the rejected delivery comes again first)" if self._redelivering else ""
            msg = (
                f"{what} received with no delivery awaiting confirmation{waiting} "
                f"(phase {self.phase.value}, last confirmed seq_nr {self.confirmed_seq_nr}): "
                "confirm or reject each Delivery once"
            )
            raise LocalProtocolError(msg)
        return current

    def _complete(self, current: SequencedMessage | SequencedRun, effects: list[Effect]) -> None:
        """The consumer is done with ``current`` (confirmed, or given up on): record it,
        tell the producer side as the window rule says, and take the next message."""
        self._confirmed_count += 1
        self._attempt = 1
        seq_nr = current.seq_nr
        dedup = self.dedup
        if dedup is not None:
            # Before the Request or Ack that tells the producer: the shell writes it first.
            dedup[current.producer_id] = seq_nr
            effects.append(RecordConfirmed(current.producer_id, seq_nr))
        self._confirm(current, effects)
        if self.stopping and not self.stash:
            logger.debug("Stopped at seq_nr %d after delivering buffered messages", seq_nr)
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
            effects.append(Send(pc, Request(seq_nr, requested, self.resend_lost, False)))
        elif requested - seq_nr <= self._half:
            # max(): in only-flow-control mode a gap may have carried seq_nr past requested.
            requested = max(requested, seq_nr) + self._half
            effects.append(Send(pc, Request(seq_nr, requested, self.resend_lost, False)))
            self._restart_retry(effects)
        elif current.ack:
            effects.append(Send(pc, Ack(seq_nr)))
        self.confirmed_seq_nr = seq_nr
        self.requested_seq_nr = requested
        self.current = None

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
        logger.debug("Register to new producer controller, previous was %r", self.producer_id)
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
            logger.debug("Stopped at seq_nr %d, no buffered messages", self.confirmed_seq_nr)
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
        """The link to a node came back: if our producer controller (or the one we are
        registering to) lives there, retry now rather than at the next timer tick, since
        whatever was in flight when the link broke is lost.

        Only a link that went down comes *back*: the first opening of a link (the one our
        `RegisterConsumer` opened, say) lost nothing, and retrying then would register
        twice and have the producer resend its whole window.
        """
        if not event.up:
            self._links_down.add(event.peer)
            return []
        if event.peer not in self._links_down:
            return []
        self._links_down.discard(event.peer)
        phase = self.phase
        if phase not in (_ACTIVE, _RESENDING):
            return []
        peer_ref = self.registering if self.registering is not None else self.producer_controller
        if getattr(peer_ref, "node_address", None) != event.peer:
            return []
        logger.debug("Link to %s restored: retrying now", event.peer)
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
        self._retries += 1
        # Back off: ×1.5 up to the maximum; restart the timer only if the interval changed.
        interval = min(self.settings.resend_interval_max, self._retry_interval * 1.5)
        if interval != self._retry_interval:
            self._retry_interval = interval
            effects.append(StartTimer(RETRY, interval))
        self._retry_now(effects)
        return effects

    def _redeliver(self) -> list[Effect]:
        effects: list[Effect] = [CancelTimer(REDELIVER)]
        current = self.current
        if not self._redelivering or current is None or self.phase is not _WAITING_FOR_CONFIRMATION:
            return effects  # stopped meanwhile
        self._redelivering = False
        self._attempt += 1
        self._delivered += 1
        assert self.consumer is not None
        effects.append(Send(self.consumer, self._delivery(current)))
        return effects

    def _retry_now(self, effects: list[Effect]) -> None:
        """Repeat what the peer may have missed: registration, Request, or Resend."""
        phase = self.phase
        if self.registering is not None:
            effects.append(Send(self.registering, RegisterConsumer(self.self_ref)))
        elif phase is _ACTIVE:
            self._retry_request(effects)
        else:
            assert self.producer_controller is not None
            # Nothing received yet (a fresh controller met a session midway): Resend(0),
            # which marks the head first so that it is accepted.
            from_seq_nr = self.received_seq_nr + 1 if self.received_seq_nr else 0
            logger.debug("Retry sending Resend from seq_nr %d", from_seq_nr)
            effects.append(Send(self.producer_controller, Resend(from_seq_nr)))

    # --- per-phase handling of a SequencedMessage ------------------------------------

    def _active(self, msg: SequencedMessage, effects: list[Effect]) -> None:
        seq_nr = msg.seq_nr
        expected = self.received_seq_nr + 1
        if msg.producer_controller != self.producer_controller or self.received_seq_nr == 0:
            self._changed_producer(msg, effects)
        elif self.registering is not None:
            self._dropped += 1
            logger.debug(
                "Received SequencedMessage seq_nr %d, discarding it: registering to a new "
                "producer controller",
                seq_nr,
            )
        elif seq_nr == expected:
            self.received_seq_nr = seq_nr
            self._deliver(msg, effects)
        elif seq_nr > expected:
            self._gaps += 1
            if self.resend_lost:
                logger.debug(
                    "Received SequencedMessage seq_nr %d, expected %d, requesting resend",
                    seq_nr,
                    expected,
                )
                effects.append(Send(msg.producer_controller, Resend(expected)))
                self._enter_resending(effects)
            else:
                logger.debug(
                    "Received SequencedMessage seq_nr %d, expected %d, delivering anyway",
                    seq_nr,
                    expected,
                )
                self.received_seq_nr = seq_nr
                self._deliver(msg, effects)
        else:
            self._duplicates += 1
            logger.debug(
                "Received duplicate SequencedMessage seq_nr %d, expected %d", seq_nr, expected
            )
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
            logger.debug("Received missing SequencedMessage seq_nr %d", seq_nr)
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
            logger.debug(
                "Associated with producer controller of %r at seq_nr %d, requesting up to %d",
                msg.producer_id,
                seq_nr,
                requested,
            )
            effects.append(Send(pc, Request(0, requested, self.resend_lost, False)))
            self.producer_controller = pc
            self.producer_id = msg.producer_id
            self.received_seq_nr = seq_nr
            self.confirmed_seq_nr = 0
            self.requested_seq_nr = requested
            if self.registering is not None and self.registering == pc:
                self.registering = None
            if self.dedup is not None:
                self._start_dedup_session(msg, effects)
            self._deliver(msg, effects)
        elif self.received_seq_nr == 0:
            # A fresh controller met a session midway: ask for everything, head marked first.
            logger.debug(
                "Received SequencedMessage seq_nr %d from a new producer controller, not first: "
                "requesting Resend(0)",
                seq_nr,
            )
            effects.append(Send(pc, Resend(0)))
            self.producer_controller = pc  # P10: so that the retry timer can repeat it
            self._enter_resending(effects)
        else:
            self._dropped += 1
            logger.warning(
                "Received SequencedMessage seq_nr %d of %r, discarding it: from an unexpected "
                "producer controller",
                seq_nr,
                msg.producer_id,
            )

    def _start_dedup_session(self, msg: SequencedMessage, effects: list[Effect]) -> None:
        """A session begins with ``msg``: set its floor from the producer id's position,
        and report a gap or a sequence restart."""
        assert self.dedup is not None
        producer_id = msg.producer_id
        seq_nr = msg.seq_nr
        position = self.dedup.get(producer_id, 0)
        if position and seq_nr == 1:
            self._sequence_restarts += 1
            if self.settings.on_sequence_restart == "reset":
                logger.warning(
                    "Producer %r started a new session at seq_nr 1, but seq_nrs up to %d were "
                    "confirmed here before: forgetting that position and delivering from 1 "
                    '(on_sequence_restart="reset"). If its producer controller has a durable '
                    "queue, messages it resends are delivered twice; restart a producer "
                    "without one under a new producer id instead",
                    producer_id,
                    position,
                )
                self.dedup[producer_id] = position = 0
                effects.append(RecordConfirmed(producer_id, 0))
            else:
                logger.warning(
                    "Producer %r started a new session at seq_nr 1, but seq_nrs up to %d were "
                    "confirmed here before: dropping seq_nrs 1..%d as duplicates "
                    '(on_sequence_restart="drop"). Right if it resends them (a durable '
                    "producer queue, a retried task); if it restarted its numbering with new "
                    "messages they are lost here: give that producer a durable queue or a new "
                    'producer id per incarnation, or set on_sequence_restart="reset"',
                    producer_id,
                    position,
                    position,
                )
        elif position and seq_nr > position + 1:
            self._dedup_gaps += 1
            logger.warning(
                "Producer %r started a session at seq_nr %d, but only seq_nrs up to %d were "
                "confirmed here: seq_nrs %d..%d never reached this consumer (lost, or "
                "confirmed by another consumer of this producer id); delivering from %d",
                producer_id,
                seq_nr,
                position,
                position + 1,
                seq_nr - 1,
                seq_nr,
            )
        self._floor = position
        self._fast_floor = max(1, position)

    def _skip_duplicate(self, msg: SequencedMessage, effects: list[Effect]) -> None:
        """``msg`` was confirmed before this session began: confirm it at once instead of
        delivering it. The phase is ACTIVE afterwards; the caller goes on unstashing."""
        self._dedup_duplicates += 1
        logger.debug(
            "Received SequencedMessage seq_nr %d of %r, not delivering it: confirmed before "
            "(deduplication position %d)",
            msg.seq_nr,
            msg.producer_id,
            self._floor,
        )
        self.collected_chunks.clear()
        self._confirm(msg, effects)
        self.phase = _ACTIVE

    def _stash_while_waiting(self, msg: SequencedMessage) -> None:
        current = self.current
        assert current is not None
        expected = current.seq_nr + len(self.stash) + 1
        if msg.seq_nr < expected and msg.producer_controller == current.producer_controller:
            self._duplicates += 1
        elif len(self.stash) >= self.window:
            self._dropped += 1  # the producer side will resend it
            logger.debug(
                "Received SequencedMessage seq_nr %d, discarding it: stash is full", msg.seq_nr
            )
        else:
            self.stash.append(msg)

    # --- helpers ---------------------------------------------------------------------

    def _deliver(self, msg: SequencedMessage, effects: list[Effect]) -> None:
        """Hand a message to the consumer, or collect it if it is a chunk."""
        if msg.seq_nr <= self._floor:
            self._skip_duplicate(msg, effects)
            return
        message = msg.message
        if type(message) is ChunkedMessage:
            collected = self.collected_chunks
            if message.first_chunk:
                collected.clear()
            elif not collected or collected[-1].seq_nr != msg.seq_nr - 1:
                # Only-flow-control mode accepted a gap inside a chunked message: it cannot be
                # assembled, so it is lost (Akka would splice the pieces around the gap).
                self._dropped += 1 + len(collected)
                logger.debug(
                    "Received chunk seq_nr %d after a lost chunk, discarding the message",
                    msg.seq_nr,
                )
                collected.clear()
                self._collecting(msg, effects)
                return
            if not message.last_chunk:
                collected.append(msg)
                self._collecting(msg, effects)
                return
            chunks = [*self.collected_chunks, msg]
            self.collected_chunks = []
            payload = assemble_chunks([c.message for c in chunks], self.serialization)
            msg = SequencedMessage(
                msg.producer_id,
                msg.seq_nr,
                payload,
                chunks[0].first,
                msg.ack,
                msg.producer_controller,
            )
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
            effects.append(
                Send(
                    self.producer_controller,
                    Request(self.confirmed_seq_nr, self.requested_seq_nr, self.resend_lost, False),
                )
            )
            self._restart_retry(effects)

    def _delivery(self, msg: SequencedMessage | SequencedRun) -> Delivery:
        return new_delivery(
            msg.message, self.new_confirm_to(), msg.producer_id, msg.seq_nr, self._attempt
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

    def _retry_request(self, effects: list[Effect]) -> None:
        pc = self.producer_controller
        if pc is None:
            return
        if self.resend_lost:
            requested = self.requested_seq_nr
        else:
            requested = self.received_seq_nr + self._half
        logger.debug(
            "Retry sending Request, confirmed %d, up to %d", self.confirmed_seq_nr, requested
        )
        effects.append(Send(pc, Request(self.confirmed_seq_nr, requested, self.resend_lost, True)))
        self.requested_seq_nr = requested

    def _restart_retry(self, effects: list[Effect]) -> None:
        self._retry_interval = self.settings.resend_interval_min
        self._heard = False  # the new interval starts now
        effects.append(StartTimer(RETRY, self._retry_interval))

    def _stop(self, effects: list[Effect]) -> None:
        if self.producer_controller is not None:
            effects.append(Send(self.producer_controller, Ack(self.confirmed_seq_nr)))
        self.phase = _STOPPED
        effects.append(Stop())
