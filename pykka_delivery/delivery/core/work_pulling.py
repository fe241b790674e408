"""The work-pulling producer controller's state machine, pure: messages in, effects out.

Theory of operation (a port of Pekko's ``WorkPullingProducerControllerImpl``; names kept):

* Workers are consumer controllers registered under a service key; the shell tells the
  core each listing (`CurrentWorkers`). For every worker the core runs one `ProducerCore`,
  unchanged, with producer id ``"<producer_id>-<worker_id>"``: each worker has its own
  session, its own seq_nrs from 1, its own flow-control window. That core's producer is
  this one: its `RequestNext` means "this worker has demand", its confirmation replies mean
  "this worker confirmed up to n". Its ``self_ref`` tags what the worker's consumer
  controller answers (`Request`, `Ack`, `Resend`) as a `WorkerMessage`, so the shell hands
  it back to this core, which routes it to that worker's `ProducerCore`.
* The producer gets a `RequestNext` when some worker has demand and no message waits. Each
  message goes to a worker with demand chosen at random (Akka's rule; the random source is
  injected), with confirmation (``ack``), so the worker acknowledges each one; or, with
  ``ack_each_message=False``, only a `MessageWithConfirmation` so, the others being
  confirmed by the worker's `Request`s.
* A message that finds no worker with demand waits in the buffer, first in first out, until
  one has. The producer may also send without a `RequestNext`; such messages wait too, and
  past ``buffer_size`` waiting messages they are refused (Akka refuses any unrequested
  message and crashes when its buffer overflows; see docs/durable.md, "Work pulling").
* When a worker leaves the listing, its unconfirmed messages go to the back of the buffer
  and on to the other workers, with new seq_nrs there. They may have been processed
  already: delivery is at least once. A `MessageWithConfirmation` keeps its reply target.
* Every accepted message is numbered (``current_seq_nr``) across all workers. The reply to
  a `MessageWithConfirmation` is that number, told when the worker confirms the message,
  or, with a durable queue, once it is stored.
* A payload is checked before it is numbered (core/payload_gate.py) for every worker
  registered and the durable queue, since a message may go to any worker and moves when
  its worker leaves. One accepted before a worker it cannot be encoded for registered is
  dropped when it would go out, logged as an error, and counted ``refused_payloads``.

With a durable queue (a loaded `DurableProducerState` given to the constructor) the core
emits, before each message is sent, `StoreMessageSent` with the worker's id as confirmation
qualifier (`NO_QUALIFIER` while it waits in the buffer), and `StoreMessageConfirmed` under
that qualifier as the worker confirms. A message that moves (from the buffer, from a worker
that left, or reloaded from the queue) is stored again under a new seq_nr and the new
worker's qualifier, then its old entry is confirmed: Akka's hand-over. The messages loaded
unconfirmed fill the buffer, so the producer gets no `RequestNext` before they are sent.

The core has one owner: only this module and ``work_pulling_workers.py`` (the workers'
listing and answers, which the core inherits: no call goes through an extra layer) assign
its fields (mutable, like `ProducerCore`'s; `snapshot()` gives the frozen view tests
assert on).
"""

from __future__ import annotations

import logging
import random
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from pykka_delivery.delivery.core.durable_state import (
    NO_QUALIFIER,
    DurableProducerState,
    MessageSent,
)
from pykka_delivery.delivery.core.effects import (
    Effect,
    Send,
    StoreMessageConfirmed,
    StoreMessageSent,
)
from pykka_delivery.delivery.core.payload_gate import PayloadGate
from pykka_delivery.delivery.core.settings import WorkPullingSettings
from pykka_delivery.delivery.core.work_pulling_records import (
    CurrentWorkers,
    GetWorkerStats,
    WorkerMessage,
    WorkerSnapshot,
    WorkerStats,
    WorkPullingSnapshot,
    WorkPullingStats,
)
from pykka_delivery.delivery.core.work_pulling_workers import WorkPullingWorkers
from pykka_delivery.delivery.core.workers import Pending, SentToWorker, Worker
from pykka_delivery.delivery.messages import (
    MessageWithConfirmation,
    ProducerStart,
    RequestNext,
    SendNext,
)
from pykka_delivery.errors import LocalProtocolError
from pykka_delivery.protocol.messages import (
    ChunkedMessage,
    PeerLinkChanged,
    Ref,
    SequencedMessage,
)
from pykka_delivery.protocol.payload_check import PayloadCheck
from pykka_delivery.protocol.serialization import SerializationError

__all__ = [
    "CurrentWorkers",
    "GetWorkerStats",
    "WorkPullingCore",
    "WorkPullingSnapshot",
    "WorkPullingStats",
    "WorkerMessage",
    "WorkerSnapshot",
    "WorkerStats",
]

logger = logging.getLogger("pykka_delivery.work_pulling")


class WorkPullingCore(WorkPullingWorkers):
    """State machine of one work-pulling producer controller.

    Args:
        producer_id: identifies the stream; each worker's session is
            ``"<producer_id>-<worker_id>"``.
        send_next_to: given to the producer as ``RequestNext.send_next_to``; it must turn a
            message into `SendNext` for this controller.
        ask_next_to: given to the producer as ``RequestNext.ask_next_to`` (where
            `MessageWithConfirmation` goes): this controller.
        worker_ref: builds, for a worker id, the ref that worker's consumer controller
            answers to; what it is told must reach this core as `WorkerMessage`.
        settings: see `WorkPullingSettings`.
        rng: picks among the workers with demand and makes worker ids; default a
            `random.Random` seeded by the OS. Tests pass a seeded one.
        durable_state: the state loaded from the durable queue; None without one.
        clock_millis: the wall clock in milliseconds, for the durable queue's timestamps
            (required with ``durable_state``).
        ack_each_message: True (the default, Akka's behaviour): every message goes to its
            worker with ``ack``, so the worker answers each with an `Ack` and the core
            learns at once that it is processed. False: only a `MessageWithConfirmation`
            is sent so; the others are confirmed by the worker's `Request`s, every half
            window, and when the producer stops, the last ones by the worker's retry (its
            ``resend_interval_min``). An `Ack` per message is a message on the wire per
            message, back to the producer: across processes it costs more than a cheap
            message's own trip (see bench/workpull.py).
        payload_encoders: what encodes every payload besides the workers' refs (the
            durable queue), for the payload gate (``gate``).

    Raises:
        ValueError: ``durable_state`` without ``clock_millis``, or a durable state holding
            chunked messages (the queue of a point-to-point producer controller).
    """

    def __init__(
        self,
        producer_id: str,
        send_next_to: Ref,
        ask_next_to: Ref,
        worker_ref: Callable[[str], Ref],
        settings: WorkPullingSettings | None = None,
        *,
        rng: random.Random | None = None,
        durable_state: DurableProducerState | None = None,
        clock_millis: Callable[[], int] | None = None,
        ack_each_message: bool = True,
        payload_encoders: Sequence[object] = (),
    ) -> None:
        self.producer_id = producer_id
        self.gate = PayloadGate(f"work-pulling producer {producer_id!r}", payload_encoders)
        self._check = self.gate.check  # read once per message: one attribute, not two
        self.send_next_to = send_next_to
        self._ack_each = ack_each_message
        self.ask_next_to = ask_next_to
        self.settings = settings or WorkPullingSettings()
        self._worker_ref = worker_ref
        self._rng = rng or random.Random()
        self.producer: Ref | None = None
        self.requested = False
        self.current_seq_nr = 1
        self.highest_confirmed_seq_nr = 0
        self.durable = durable_state is not None
        self._clock_millis = clock_millis
        self.buffer: deque[Pending] = deque()
        self.workers: dict[str, Worker] = {}
        self._accepted = self._sent = self._redelivered = self._confirmed = self._rejected = 0
        if durable_state is not None:
            self._load(durable_state)
        self._handlers: dict[type, Callable[[Any], list[Effect]]] = {
            SendNext: lambda m: self.on_msg(m.message, None, m.checked),
            MessageWithConfirmation: lambda m: self.on_msg(m.message, m.reply_to, m.checked),
            WorkerMessage: lambda m: self.on_worker_message(m.worker_id, m.message),
            CurrentWorkers: lambda m: self.on_current_workers(m.workers),
            ProducerStart: lambda m: self.on_start(m.producer),
            GetWorkerStats: lambda m: [Send(m.reply_to, self.worker_stats())],
            PeerLinkChanged: lambda _: [],  # the workers' consumer controllers drive recovery
        }

    def _load(self, state: DurableProducerState) -> None:
        if self._clock_millis is None:
            msg = "WorkPullingCore: a durable_state needs clock_millis for the queue's timestamps"
            raise ValueError(msg)
        if any(isinstance(m.message, ChunkedMessage) for m in state.unconfirmed):
            msg = (
                f"the durable queue of work-pulling producer {self.producer_id!r} holds "
                "chunked messages: it belongs to a point-to-point producer controller; "
                "give the work-pulling controller a queue (or producer id) of its own"
            )
            raise ValueError(msg)
        self.current_seq_nr = state.current_seq_nr
        self.highest_confirmed_seq_nr = state.highest_confirmed_seq_nr
        # Akka resends each to itself as ResendDurableMsg: in any order, each re-stored under
        # a new seq_nr and a worker's qualifier when a worker takes it.
        self.buffer.extend(
            Pending(m.seq_nr, m.message, None, m.confirmation_qualifier) for m in state.unconfirmed
        )
        self._redelivered += len(state.unconfirmed)
        if len(self.buffer) > self.settings.buffer_size:
            logger.warning(
                "Work-pulling producer %r loaded %d unconfirmed messages, more than "
                "buffer_size %d: all are kept, the producer waits until they are sent",
                self.producer_id,
                len(self.buffer),
                self.settings.buffer_size,
            )

    # --- queries ---------------------------------------------------------------------

    @property
    def has_demand(self) -> bool:
        """True when a message sent now goes to a worker at once: some worker has demand
        and none waits in the buffer (when a `RequestNext` would be due). For owners that
        read demand instead of being told it, such as the `WorkPullingProducer` handle."""
        return not self.buffer and any(w.core.has_demand for w in self.workers.values())

    @property
    def demand(self) -> int:
        """How many messages sent now, one after another, go to workers at once (0 when
        any waits in the buffer): what the workers with demand may take."""
        if self.buffer:
            return 0
        return sum(w.core.demand for w in self.workers.values())

    @property
    def all_confirmed(self) -> bool:
        """True when workers confirmed every accepted message: none waits in the buffer
        and none is unconfirmed at a worker."""
        return not self.buffer and not any(w.sent for w in self.workers.values())

    def worker_stats(self) -> WorkerStats:
        return WorkerStats(len(self.workers))

    def snapshot(self) -> WorkPullingSnapshot:
        return WorkPullingSnapshot.of(self)

    def statistics(self) -> WorkPullingStats:
        return WorkPullingStats(
            workers=len(self.workers),
            buffered=len(self.buffer),
            accepted=self._accepted,
            sent=self._sent,
            redelivered=self._redelivered,
            confirmed=self._confirmed,
            rejected=self._rejected,
            refused_payloads=self.gate.refused,
        )

    # --- inputs ----------------------------------------------------------------------

    def receive(self, message: object) -> list[Effect]:
        """Handle any message a work-pulling producer controller accepts.

        Raises:
            LocalProtocolError: the message is not one this controller handles, or the
                buffer is full; the state did not change.
            SerializationError: the producer's message cannot be encoded for a worker or
                the durable queue; the state did not change.
        """
        handler = self._handlers.get(type(message))
        if handler is None:
            self._rejected += 1
            msg = (
                f"WorkPullingProducerController {self.producer_id!r} cannot handle "
                f"{type(message).__name__}"
            )
            raise LocalProtocolError(msg)
        return handler(message)

    def on_start(self, producer: Ref) -> list[Effect]:
        """A producer registers (`ProducerStart`), perhaps replacing an earlier one, which
        loses its outstanding `RequestNext` to the new one."""
        logger.debug(
            "Register new producer for %r, current_seq_nr %d", self.producer_id, self.current_seq_nr
        )
        self.producer = producer
        effects: list[Effect] = []
        if self.requested:
            effects.append(Send(producer, self._request_next()))
        else:
            self._request_next_if_demand(effects)
        return effects

    def on_msg(
        self, message: object, reply_to: Ref | None = None, checked: PayloadCheck | None = None
    ) -> list[Effect]:
        """The producer sends one message (``reply_to`` given: `MessageWithConfirmation`);
        its payload is checked unless ``checked`` is the check in force.

        Raises:
            LocalProtocolError: the message was sent without a `RequestNext`, no worker has
                demand and ``buffer_size`` messages wait already.
            SerializationError: its payload cannot be encoded for a worker or the durable
                queue (``gate``); nothing changed.
        """
        check = self._check
        if check is not None and check is not checked and type(message) is not check.unchecked:
            self.gate.refuse_one(check, message)
        workers = self._workers_with_demand()
        if not self.requested and not workers and len(self.buffer) >= self.settings.buffer_size:
            self._rejected += 1
            msg = (
                f"WorkPullingProducerController {self.producer_id!r} refused a message sent "
                f"without RequestNext: {len(self.buffer)} messages wait for a worker with "
                f"demand, WorkPullingSettings.buffer_size is {self.settings.buffer_size}; "
                "send one message per RequestNext (or raise buffer_size)"
            )
            raise LocalProtocolError(msg)
        self.requested = False
        self._accepted += 1
        seq_nr = self.current_seq_nr
        self.current_seq_nr = seq_nr + 1
        effects: list[Effect] = []
        if workers:
            worker = self._rng.choice(workers)
            asked = reply_to is not None
            if self.durable:
                self._store(seq_nr, message, asked, worker.worker_id, effects)
                self._reply_stored(seq_nr, reply_to, effects)
                reply_to = None
            self._send_to(worker, seq_nr, message, reply_to, effects, ack=asked or self._ack_each)
        else:
            logger.debug(
                "No worker with demand for %r seq_nr %d, buffering", self.producer_id, seq_nr
            )
            if self.durable:
                self._store(seq_nr, message, reply_to is not None, NO_QUALIFIER, effects)
                self._reply_stored(seq_nr, reply_to, effects)
                self.buffer.append(Pending(seq_nr, message, None, NO_QUALIFIER))
            else:
                self.buffer.append(Pending(seq_nr, message, reply_to, None))
        self._request_next_if_demand(effects)
        return effects

    def on_refused(self) -> list[Effect]:
        """The producer's message was refused for its payload (`SerializationError` from
        `on_msg`: nothing changed): the producer, which used its `RequestNext` on it, is
        told it again."""
        if self.producer is None or not self.requested:
            return []
        return [Send(self.producer, self._request_next())]

    def next_message(
        self, message: object, checked: PayloadCheck | None = None
    ) -> tuple[Ref, SequencedMessage] | None:
        """`on_msg` for the steady state of an owner that reads demand instead of being
        told it (the `WorkPullingProducer` handle): pick a worker with demand, number
        ``message`` in its session and keep it as unconfirmed there, with no effects.
        Returns the worker's consumer controller and the `SequencedMessage` for the caller
        to tell, or None (nothing changed) when `on_msg` is needed: no worker has demand,
        messages wait in the buffer, a durable queue (the message must be stored first),
        ``ack_each_message``, a registered producer (it must be told `RequestNext`), or
        the first message of the worker's session (which starts its first-resend timer).
        Its payload is checked unless ``checked`` is the check in force.

        Raises:
            SerializationError: as `on_msg` (nothing changed).
        """
        if self.buffer or self.durable or self._ack_each or self.producer is not None:
            return None
        workers = self._workers_with_demand()
        if not workers:
            return None
        check = self._check
        if check is not None and check is not checked and type(message) is not check.unchecked:
            self.gate.refuse_one(check, message)
        worker = self._rng.choice(workers)
        core = worker.core
        out_seq_nr = core.current_seq_nr
        seq_msg = core.next_message(message)
        if seq_msg is None:
            return None
        seq_nr = self.current_seq_nr
        self.current_seq_nr = seq_nr + 1
        worker.sent.append(SentToWorker(seq_nr, out_seq_nr, message, None))
        self._accepted += 1
        self._sent += 1
        return worker.consumer_controller, seq_msg

    def _workers_with_demand(self) -> list[Worker]:
        return [w for w in self.workers.values() if w.core.has_demand]

    # --- sending ---------------------------------------------------------------------

    def _drain(self, effects: list[Effect]) -> None:
        """Send waiting messages, oldest first, while some worker has demand."""
        buffer = self.buffer
        while buffer:
            workers = self._workers_with_demand()
            if not workers:
                return
            pending = buffer.popleft()
            if self._check is not None and not self._encodable(pending, effects):
                continue
            worker = self._rng.choice(workers)
            seq_nr = pending.seq_nr
            if pending.stored_as is not None:
                # Hand-over: stored again under the worker's qualifier, then the old entry
                # confirmed, so that a crash between the two resends it rather than lose it.
                seq_nr = self.current_seq_nr
                self.current_seq_nr = seq_nr + 1
                self._store(seq_nr, pending.message, False, worker.worker_id, effects)
                effects.append(
                    StoreMessageConfirmed(pending.seq_nr, pending.stored_as, self._now())
                )
            ack = pending.reply_to is not None or self._ack_each
            self._send_to(worker, seq_nr, pending.message, pending.reply_to, effects, ack=ack)

    def _encodable(self, pending: Pending, effects: list[Effect]) -> bool:
        """Whether ``pending`` passes the gate now. One accepted before a worker it cannot
        be encoded for registered does not: it is dropped and logged (its stored entry
        confirmed), rather than hold that worker's stream back for ever."""
        try:
            self.gate.refuse((pending.message,))
        except SerializationError as error:
            logger.error(
                "Work-pulling producer %r drops seq_nr %d, accepted before a worker it "
                "cannot be encoded for registered: %s",
                self.producer_id,
                pending.seq_nr,
                error,
            )
            if pending.stored_as is not None:
                effects.append(
                    StoreMessageConfirmed(pending.seq_nr, pending.stored_as, self._now())
                )
            return False
        return True

    def _send_to(
        self,
        worker: Worker,
        seq_nr: int,
        message: Any,
        reply_to: Ref | None,
        effects: list[Effect],
        *,
        ack: bool,
    ) -> None:
        out_seq_nr = worker.core.current_seq_nr
        worker.sent.append(SentToWorker(seq_nr, out_seq_nr, message, reply_to))
        self._sent += 1
        # With ``ack`` the worker acknowledges it at once; without, its Requests confirm it
        # (see ack_each_message and _absorb).
        asked_to = worker.confirmed_to if ack else None
        self._absorb(worker, worker.core.on_msg(message, asked_to), effects)

    def _request_next_if_demand(self, effects: list[Effect]) -> None:
        if (
            self.producer is not None
            and not self.requested
            and not self.buffer
            and self._workers_with_demand()
        ):
            self.requested = True
            effects.append(Send(self.producer, self._request_next()))

    def _request_next(self) -> RequestNext:
        return RequestNext(
            self.producer_id,
            self.current_seq_nr,
            self.highest_confirmed_seq_nr,
            self.send_next_to,
            self.ask_next_to,
        )

    # --- durable queue ---------------------------------------------------------------

    def _store(
        self, seq_nr: int, message: Any, ack: bool, qualifier: str, effects: list[Effect]
    ) -> None:
        effects.append(StoreMessageSent(MessageSent(seq_nr, message, ack, qualifier, self._now())))

    @staticmethod
    def _reply_stored(seq_nr: int, reply_to: Ref | None, effects: list[Effect]) -> None:
        # With a durable queue the reply means "stored", as Akka's.
        if reply_to is not None:
            effects.append(Send(reply_to, seq_nr))

    def _now(self) -> int:
        assert self._clock_millis is not None
        return self._clock_millis()
