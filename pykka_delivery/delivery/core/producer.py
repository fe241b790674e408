"""The producer controller's state machine, pure: messages in, effects out.

Theory of operation (a port of Pekko's ``ProducerControllerImpl``; names kept):

* The producer may send exactly one message per `RequestNext`. The core numbers it
  (``current_seq_nr``), keeps it in ``unconfirmed`` until the consumer side confirms it, and
  sends it as a `SequencedMessage` to the consumer controller.
* The first message of a session (seq_nr == ``first_seq_nr``) goes out without a `Request`,
  marked ``first``, and is resent every ``resend_first_interval`` until confirmed: it may
  create the consumer side, or be lost.
* After that the consumer side drives: ``Request(confirmed, up_to)`` confirms and opens the
  window up to ``up_to`` inclusive; ``Ack(confirmed)`` only confirms; ``Resend(from)`` asks
  for everything unconfirmed from ``from``. A ``Request`` with ``via_timeout`` (a retry on
  silence) makes the core resend everything still unconfirmed, since a lost last message
  would otherwise never show as a gap; the first confirmation of a session pushes the
  backlog the new consumer controller has not seen (P16).
* Only-flow-control mode (the consumer sends ``support_resend=False``): nothing is kept for
  resending, and when the consumer's window does not reach past what was already sent
  (messages were lost), the window is widened from ``current_seq_nr``.
* Large messages are cut into chunks, one seq_nr each; the producer gets no `RequestNext`
  until the last chunk is sent.
* A payload that cannot be encoded for where it goes is refused before it is numbered
  (core/payload_gate.py). With chunking on, cutting it serializes it, which refuses it
  the same way, so the gate is off.
* Fencing (issue 21): a `RegisterConsumer` carries the consumer's epoch. The core serves
  the highest one registered: a lower registration is refused and told `Fenced`, the
  current consumer keeping the stream; a higher one takes over as any new registration
  does, and the consumer controller it replaces is told `Fenced` at once. `Request` and
  `Ack` of a lower epoch change nothing (one comparison on their path); a retry among them
  (``via_timeout``) is answered with `Fenced` again, in case the first was lost.
* Durable mode (a `DurableProducerState` loaded from a durable producer queue is given):
  every message, or every chunk, is stored before it is sent (`StoreMessageSent` comes
  before its `Send`), a `MessageWithConfirmation` is answered as soon as it is stored, and
  each rise of the confirmed seq_nr is stored behind (`StoreMessageConfirmed`). The core
  starts from the loaded state (Akka's ``createState``): numbering continues at its
  ``current_seq_nr`` and its unconfirmed messages are resent, with their original seq_nrs,
  the first one marked first; the producer gets demand only once the consumer side asks.

Decisions where we differ from the original, each explained in docs/decisions.md and
marked where it applies: P1 (a window reaching exactly ``current_seq_nr`` grants demand),
P2 (``Resend`` marks the head first before resending it), P3 (a durable reload starts the
resend-first timer) and P16 (a session's first confirmation pushes only the backlog).

The core has one owner: only this module and ``producer_control.py`` assign its fields.
This module has the flow (the producer's messages, the consumer side's `Request` and
`Ack`, the sends and confirmations they make); ``producer_control.py``, which the core
inherits (no call goes through an extra layer), the control inputs (registrations,
`Resend`, timers, closing), the durable reload and the resends. The fields are kept in a
mutable slotted object, not a frozen record replaced per event: ``dataclasses.replace``
costs more than the handles' whole per-message budget (bench/RESULTS.md, "Hot paths").
`snapshot()` gives the frozen view the tests assert on.
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from pykka_delivery.delivery.core.chunking import sequenced_chunks
from pykka_delivery.delivery.core.durable_state import NO_QUALIFIER, DurableProducerState
from pykka_delivery.delivery.core.effects import (
    CancelTimer,
    Effect,
    Send,
    StartTimer,
    StoreMessageConfirmed,
    store_all_sent,
    store_sent,
)
from pykka_delivery.delivery.core.payload_gate import PayloadGate
from pykka_delivery.delivery.core.producer_control import (
    RESEND_FIRST,
    STUCK_CHECK,
    ProducerControl,
    no_clock,
)
from pykka_delivery.delivery.core.producer_records import (
    ACTIVE as _ACTIVE,
)
from pykka_delivery.delivery.core.producer_records import (
    WAITING_FOR_INITIALIZATION as _WAITING_FOR_INITIALIZATION,
)
from pykka_delivery.delivery.core.producer_records import (
    ProducerCounters,
    ProducerPhase,
    ProducerSnapshot,
    ProducerStats,
    cannot_handle_message,
    no_demand_message,
)
from pykka_delivery.delivery.core.settings import ProducerControllerSettings
from pykka_delivery.delivery.core.stuck import StuckCheck
from pykka_delivery.delivery.messages import (
    MessageWithConfirmation,
    ProducerStart,
    SendNext,
)
from pykka_delivery.errors import LocalProtocolError
from pykka_delivery.protocol.messages import (
    Ack,
    PeerLinkChanged,
    Ref,
    RegisterConsumer,
    Request,
    Resend,
    SequencedMessage,
    new_sequenced_message,
)
from pykka_delivery.protocol.payload_check import PayloadCheck
from pykka_delivery.protocol.serialization import Serialization, default_serialization

__all__ = [
    "RESEND_FIRST",
    "STUCK_CHECK",
    "ProducerCore",
    "ProducerPhase",
    "ProducerSnapshot",
    "ProducerStats",
]

logger = logging.getLogger("pykka_delivery.producer")

_NOTHING = object()  # an exhausted iterator's marker in on_msg_batch


class ProducerCore(ProducerControl):
    """State machine of one producer controller.

    Args:
        producer_id: identifies the stream; stamped on every message.
        self_ref: where the consumer side reaches this controller; stamped on every
            `SequencedMessage` and given to the producer as ``RequestNext.ask_next_to``.
        send_next_to: given to the producer as ``RequestNext.send_next_to``; it must turn a
            message into `SendNext` for this controller.
        settings: see `ProducerControllerSettings`.
        serialization: used to serialize payloads when chunking is on.
        announce_demand: send `RequestNext` to the producer (True, the actor protocol).
            An owner that polls `has_demand` instead (the `Producer` handle) passes False
            and saves building a `RequestNext` per message.
        durable_state: what the durable producer queue loaded: given, the core is durable
            (see the module docstring) and starts from it. None: no durable queue.
        clock_millis: the wall clock in milliseconds since the epoch, for the timestamps
            of what is stored; required with ``durable_state`` (the core reads no clock).
        payload_encoders: what encodes every payload besides the consumer side's ref (the
            durable queue), for the payload gate (``gate``).
        check_payloads: False: the gate is off, the owner checks (a work-pulling core).
        ask_next_to: given to the producer as ``RequestNext.ask_next_to``; default
            ``self_ref``.

    Raises:
        ValueError: ``durable_state`` without ``clock_millis``.
    """

    # The rest of its state is in ProducerControl's slots.
    __slots__ = (
        "_announce",
        "_chunk_size",
        "_handlers",
        "_start_seq_nr",
        "_store_ahead",
        "replies",
        "serialization",
        "support_resend",
    )

    def __init__(
        self,
        producer_id: str,
        self_ref: Ref,
        send_next_to: Ref,
        settings: ProducerControllerSettings | None = None,
        serialization: Serialization | None = None,
        *,
        announce_demand: bool = True,
        durable_state: DurableProducerState | None = None,
        clock_millis: Callable[[], int] | None = None,
        payload_encoders: Sequence[object] = (),
        check_payloads: bool = True,
        ask_next_to: Ref | None = None,
    ) -> None:
        self.producer_id = producer_id
        self._announce = announce_demand
        self.self_ref = self_ref
        self.ask_next_to = self_ref if ask_next_to is None else ask_next_to
        self.send_next_to = send_next_to
        self.settings = settings or ProducerControllerSettings()
        self.serialization = serialization or default_serialization
        self._chunk_size = self.settings.chunk_large_messages
        # Only a handle's batches store ahead (an announcing owner sends one at a time).
        self._store_ahead = (
            0 if announce_demand or self._chunk_size else self.settings.durable_store_ahead
        )
        # Chunks are serialized bytes already: what carries or stores them never encodes.
        self.gate = PayloadGate(
            f"producer {producer_id!r}",
            payload_encoders,
            enabled=check_payloads and not self._chunk_size,
        )
        self._check = self.gate.check  # read once per message: one attribute, not two
        self.phase = _WAITING_FOR_INITIALIZATION
        self.producer: Ref | None = None
        self.consumer: Ref | None = None
        # The state of Akka's empty durable queue: next seq_nr 1, nothing confirmed.
        self.current_seq_nr = 1
        self.confirmed_seq_nr = 0
        self.requested_seq_nr = 1
        self.first_seq_nr = 1
        # The last seq_nr sent before the current consumer controller registered: what it
        # may never have seen, pushed once it confirms its first message (P16).
        self._backlog_end = 0
        self.requested = False
        self.support_resend = True
        self.unconfirmed: deque[SequencedMessage] = deque()
        self.remaining_chunks: deque[SequencedMessage] = deque()
        self.replies: dict[int, Ref] = {}
        self._counts = ProducerCounters()
        # Fencing: the highest epoch registered, and the consumer controllers it shut out.
        self.epoch = 0
        self._superseded: dict[int, Ref] = {}
        self._stuck = StuckCheck(producer_id, self.settings.stuck_after)
        self._durable = durable_state is not None
        self._closed = False  # on_closed counted what it lost
        self._clock: Callable[[], int] = clock_millis or no_clock
        if durable_state is not None:
            if clock_millis is None:
                msg = (
                    f"ProducerCore {producer_id!r}: a durable_state needs clock_millis, the "
                    "clock that timestamps what is stored (e.g. lambda: time.time_ns() // "
                    "1_000_000)"
                )
                raise ValueError(msg)
            self._load(durable_state)
        # Every seq_nr is sent once for the first time, as it is numbered: what was sent
        # counts from here.
        self._start_seq_nr = self.current_seq_nr
        # The steady-state path of `next_message` applies: no RequestNext to build, no
        # chunks to cut, nothing to store first.
        self._plain = not announce_demand and not self._chunk_size and not self._durable
        # The last seq_nr `next_message` may number: requested_seq_nr while requested in the
        # active phase of a plain core, else 0. Left behind when the window fills (the
        # numbering passes it), so that the fast path checks two numbers, not five flags.
        self._fast_up_to = 0
        self._handlers: dict[type, Callable[[Any], list[Effect]]] = {
            SendNext: lambda m: self.on_msg(m.message, None, m.checked),
            MessageWithConfirmation: lambda m: self.on_msg(m.message, m.reply_to, m.checked),
            Request: self.on_request,
            Ack: lambda m: self.on_ack(m.confirmed_seq_nr, m.epoch),
            Resend: lambda m: self.on_resend(m.from_seq_nr),
            ProducerStart: lambda m: self.on_start(m.producer),
            RegisterConsumer: lambda m: self.on_register_consumer(m.consumer_controller, m.epoch),
            # The consumer side drives recovery (it retries when its link comes back).
            PeerLinkChanged: lambda _: [],
        }

    # --- queries ---------------------------------------------------------------------

    @property
    def has_demand(self) -> bool:
        """True when the producer may send one message now."""
        return (
            self.requested
            and self.current_seq_nr <= self.requested_seq_nr
            and not self.remaining_chunks
            and self.phase is _ACTIVE
        )

    @property
    def demand(self) -> int:
        """How many messages the producer may send now, one after another (0: none; 1 at
        most when chunking: the chunks of one take the window)."""
        if not self.has_demand:
            return 0
        return 1 if self._chunk_size else self.requested_seq_nr - self.current_seq_nr + 1

    @property
    def last_seq_nr(self) -> int:
        """The seq_nr of the message sent last: that of its last chunk, sent or not."""
        remaining = self.remaining_chunks
        return remaining[-1].seq_nr if remaining else self.current_seq_nr - 1

    @property
    def all_confirmed(self) -> bool:
        """True when the consumer side confirmed every message sent so far, and none is
        waiting to be sent (chunks, messages stored ahead)."""
        return self.confirmed_seq_nr >= self.last_seq_nr

    def snapshot(self) -> ProducerSnapshot:
        return ProducerSnapshot.of(self)

    def statistics(self) -> ProducerStats:
        return self._counts.statistics(
            self.current_seq_nr - self._start_seq_nr, self._stuck, self.gate.refused
        )

    # --- inputs ----------------------------------------------------------------------

    def receive(self, message: object) -> list[Effect]:
        """Handle any message a producer controller accepts.

        Raises:
            LocalProtocolError: the message is not one a producer controller handles, or
                breaks the protocol in the current state; the state did not change.
            SerializationError: the producer's message cannot be encoded for where it goes
                (see `on_msg`); the state did not change.
        """
        handler = self._handlers.get(type(message))
        if handler is None:
            self._counts.rejected += 1
            raise LocalProtocolError(cannot_handle_message(self, message))
        return handler(message)

    def on_msg(
        self, message: object, reply_to: Ref | None = None, checked: PayloadCheck | None = None
    ) -> list[Effect]:
        """The producer sends one message (``reply_to`` given: `MessageWithConfirmation`);
        its payload is checked unless ``checked`` is the check in force (the actors'
        ``send_next_to`` applied it in the producer's thread).

        Raises:
            LocalProtocolError: there is no demand (no `RequestNext` outstanding).
            SerializationError: its payload cannot be encoded for the consumer side or
                the durable queue (``gate``); nothing was numbered.
        """
        if not self.has_demand:
            self._counts.rejected += 1
            raise LocalProtocolError(no_demand_message(self, active=self.phase is _ACTIVE))
        check = self._check
        if check is not None and check is not checked and type(message) is not check.unchecked:
            self.gate.refuse_one(check, message)
        current = self.current_seq_nr
        ack = reply_to is not None
        effects: list[Effect] = []
        if self._chunk_size:
            chunks = sequenced_chunks(
                message,
                self._chunk_size,
                self.serialization,
                producer_id=self.producer_id,
                start=current,
                first_seq_nr=self.first_seq_nr,
                ack=ack,
                self_ref=self.self_ref,
            )
            if reply_to is not None:
                self.replies[chunks[-1].seq_nr] = reply_to
            self.remaining_chunks.extend(chunks)
            self._send_chunks(effects)
            return effects
        seq_msg = SequencedMessage(
            self.producer_id, current, message, current == self.first_seq_nr, ack, self.self_ref
        )
        if self._durable:
            self._store(seq_msg, effects)
            if reply_to is not None:  # with a durable queue the reply means "stored"
                effects.append(Send(reply_to, current))
        elif reply_to is not None:
            self.replies[current] = reply_to
        self._send_new(seq_msg, effects, True)
        return effects

    def on_msg_batch(
        self, messages: Iterator[Any], checked: PayloadCheck | None = None
    ) -> list[Effect]:
        """`on_msg` for several messages at once: takes from ``messages`` as many as the
        window allows now (one when chunking is on: its chunks must go first). In durable
        mode one `StoreMessagesSent` stores them all before their sends, with up to
        ``durable_store_ahead`` more, which wait in ``remaining_chunks`` and go out as
        demand comes (no demand for new messages until they are all sent). For an owner
        that does not announce demand (a handle); the number taken (sent or stored ahead)
        shows in `last_seq_nr`.
        Their payloads are checked unless ``checked`` is the check in force (the caller
        applied it to them: ``gate.refuse``).

        Raises:
            LocalProtocolError: there is no demand.
            SerializationError: a payload cannot be encoded: none of those taken is sent.
        """
        if not self.has_demand:
            self._counts.rejected += 1
            raise LocalProtocolError(no_demand_message(self, active=self.phase is _ACTIVE))
        if self._chunk_size:
            first = next(messages, _NOTHING)
            return [] if first is _NOTHING else self.on_msg(first)
        demand = self.demand
        durable = self._durable
        ahead = self._store_ahead if durable else 0
        batch = list(itertools.islice(messages, demand + ahead))
        effects: list[Effect] = []
        if not batch:
            return effects
        if self._check is not None:
            self.gate.refuse(batch, checked)
        producer_id, self_ref = self.producer_id, self.self_ref
        start = self.current_seq_nr
        seq_msgs = [
            SequencedMessage(
                producer_id, start + i, m, start + i == self.first_seq_nr, False, self_ref
            )
            for i, m in enumerate(batch)
        ]
        if durable:
            effects.append(store_all_sent(seq_msgs, self._clock()))
            self._counts.stored += len(seq_msgs)
            if len(seq_msgs) > demand:  # stored ahead: sent as demand comes (_send_chunks)
                self.remaining_chunks.extend(seq_msgs[demand:])
                del seq_msgs[demand:]
        last = seq_msgs[-1]
        for seq_msg in seq_msgs:
            self._send_new(seq_msg, effects, seq_msg is last)
        return effects

    def on_refused(self) -> list[Effect]:
        """The producer's message was refused for its payload (`SerializationError` from
        `on_msg`: nothing changed): the producer, which used its `RequestNext` on it, is
        told it again."""
        if not self._announce or self.producer is None or not self.has_demand:
            return []
        return [Send(self.producer, self._request_next(self.current_seq_nr, self.confirmed_seq_nr))]

    def next_message(self, message: object) -> SequencedMessage | None:
        """`on_msg` for the steady state of a core that does not announce demand: number
        ``message`` and keep it for resending, with no effects. The caller tells the
        returned `SequencedMessage` to ``consumer`` itself. Returns None (nothing changed)
        when `on_msg` is needed: no demand, chunking on, durable mode (the message must be
        stored first), or the first message of a session (which starts the first-resend
        timer).

        Raises:
            SerializationError: as `on_msg` (nothing changed).
        """
        current = self.current_seq_nr
        if not self.first_seq_nr < current <= self._fast_up_to:
            return None
        check = self._check
        if check is not None and type(message) is not check.unchecked:
            self.gate.refuse_one(check, message)
        seq_msg = new_sequenced_message(
            self.producer_id, current, message, False, False, self.self_ref
        )
        if self.support_resend:
            self.unconfirmed.append(seq_msg)
        if current == self.requested_seq_nr:
            self.requested = False
        self.current_seq_nr = current + 1
        return seq_msg

    def on_request(self, request: Request) -> list[Effect]:
        """The consumer side confirms ``confirmed_seq_nr`` and opens the window (unless
        it is of a fencing epoch lower than the highest registered: ignored)."""
        if request.epoch < self.epoch:
            epoch = request.epoch
            return self._refuse_fenced(
                epoch, self._superseded.get(epoch) if request.via_timeout else None
            )
        self._counts.requests += 1
        confirmed = request.confirmed_seq_nr
        support_resend = request.support_resend
        effects: list[Effect] = []
        self._confirm(confirmed, effects)
        if not support_resend:
            self.unconfirmed.clear()
        elif request.via_timeout:
            # The last message may have been lost (no later message shows the gap).
            self._resend(self.unconfirmed, effects)
        elif confirmed == self.first_seq_nr:
            self._push_backlog(effects)
        up_to = request.request_up_to_seq_nr
        if not support_resend and up_to <= self.current_seq_nr:
            # Messages were lost and will never be confirmed: widen from what was sent.
            widened = self.current_seq_nr + (up_to - confirmed)
            logger.debug(
                "Expanded requested_seq_nr of %r from %d to %d, current %d: all were probably lost",
                self.producer_id,
                up_to,
                widened,
                self.current_seq_nr,
            )
            up_to = widened
        self.support_resend = support_resend
        if up_to > self.requested_seq_nr:
            self.requested_seq_nr = up_to
            if self.remaining_chunks:
                self._send_chunks(effects)
            elif not self.requested and up_to >= self.current_seq_nr:  # P1: >=, not >
                assert self.producer is not None
                effects.append(
                    Send(self.producer, self._request_next(self.current_seq_nr, confirmed))
                )
                self.requested = True
            self._open_fast_path()
        return effects

    def on_ack(self, confirmed_seq_nr: int, epoch: int = 0) -> list[Effect]:
        """The consumer side confirms up to ``confirmed_seq_nr`` without more demand
        (unless ``epoch`` is lower than the highest registered: ignored)."""
        if epoch < self.epoch:
            return self._refuse_fenced(epoch, None)
        self._counts.acks += 1
        effects: list[Effect] = []
        self._confirm(confirmed_seq_nr, effects)
        if confirmed_seq_nr == self.first_seq_nr:
            self._push_backlog(effects)
        return effects

    # --- internals -------------------------------------------------------------------

    def _send_new(self, seq_msg: SequencedMessage, effects: list[Effect], last: bool) -> None:
        """Akka's ``onMsg``: send one message (or chunk; ``last``: its last) in the window."""
        current = self.current_seq_nr
        if self.support_resend:
            self.unconfirmed.append(seq_msg)
        if current == self.first_seq_nr:
            effects.append(StartTimer(RESEND_FIRST, self.settings.resend_first_interval))
        assert self.consumer is not None
        effects.append(Send(self.consumer, seq_msg))
        if current == self.requested_seq_nr:
            self.requested = bool(self.remaining_chunks)  # busy until the last chunk is out
        elif last:
            if self._announce:
                assert self.producer is not None
                effects.append(
                    Send(self.producer, self._request_next(current + 1, self.confirmed_seq_nr))
                )
            self.requested = True
        self.current_seq_nr = current + 1

    def _send_chunks(self, effects: list[Effect]) -> None:
        """Send what is numbered but not sent yet as far as the window allows: the chunks
        of a large message (each stored right before it is sent, when durable), or
        messages `on_msg_batch` stored ahead (chunking off)."""
        remaining = self.remaining_chunks
        durable = self._durable
        chunked = bool(self._chunk_size)
        while remaining and remaining[0].seq_nr <= self.requested_seq_nr:
            chunk = remaining.popleft()
            if not chunked:  # stored ahead: complete messages, stored already
                self._send_new(chunk, effects, not remaining)
                continue
            if durable:
                self._store(chunk, effects)
                reply_to = self.replies.pop(chunk.seq_nr, None)  # keyed by the last chunk
                if reply_to is not None:
                    effects.append(Send(reply_to, chunk.seq_nr))
            self._send_new(chunk, effects, chunk.message.last_chunk)

    def _store(self, seq_msg: SequencedMessage, effects: list[Effect]) -> None:
        effects.append(store_sent(seq_msg, self._clock()))
        self._counts.stored += 1

    def _confirm(self, confirmed_seq_nr: int, effects: list[Effect]) -> None:
        """Akka's ``onAck``: reply to confirmed asks, drop confirmed messages."""
        replies = self.replies
        if replies:
            for seq_nr in sorted(s for s in replies if s <= confirmed_seq_nr):
                effects.append(Send(replies.pop(seq_nr), seq_nr))
        unconfirmed = self.unconfirmed
        while unconfirmed and unconfirmed[0].seq_nr <= confirmed_seq_nr:
            unconfirmed.popleft()
        if confirmed_seq_nr == self.first_seq_nr:
            effects.append(CancelTimer(RESEND_FIRST))
        if confirmed_seq_nr > self.confirmed_seq_nr:
            self.confirmed_seq_nr = confirmed_seq_nr
            if self._durable:  # written behind: a lost one means a duplicate, not a loss
                effects.append(StoreMessageConfirmed(confirmed_seq_nr, NO_QUALIFIER, self._clock()))
