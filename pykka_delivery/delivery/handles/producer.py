"""`Producer`: reliable sending for code that is not an actor.

The handle runs a `ProducerCore` inline in the caller's thread: `send` numbers the message
and tells it straight to the consumer side, with no thread hop. What the consumer side
sends back (`Request`, `Resend`, `Ack`, `RegisterConsumer`) and timer firings arrive on
other threads; they are queued and processed by whichever thread next holds the handle's
lock — the arriving thread itself when the application is not inside a call (so an idle
producer still answers resends), otherwise the application's thread before it returns.
Nobody ever blocks waiting for that lock except the application's own calls.

With a durable queue, the queue is called by whichever thread holds the lock (never two at
once): stores of messages mostly from the application's thread, stores of confirmations
mostly from the threads that bring them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from pykka_delivery.delivery.core.effects import Effect
from pykka_delivery.delivery.core.producer import ProducerCore, ProducerSnapshot, ProducerStats
from pykka_delivery.delivery.core.settings import ProducerControllerSettings
from pykka_delivery.delivery.handles._parts import (
    Ignore,
    InboxLock,
    ProducerEffects,
    ReplySlot,
    failed_error,
    open_durable,
    send_batch_through,
    send_through,
)
from pykka_delivery.delivery.messages import RequestNext
from pykka_delivery.delivery.stores.calls import wall_clock_millis
from pykka_delivery.delivery.stores.durable_queue import DurableProducerQueue, DurableQueueError
from pykka_delivery.delivery.timers import TimerFired, Timers, TimerService
from pykka_delivery.errors import ClosedError, DeliveryTimeout, LocalProtocolError, WouldBlock
from pykka_delivery.protocol.messages import Ref, RegisterConsumer
from pykka_delivery.protocol.serialization import Serialization

__all__ = ["Producer"]

logger = logging.getLogger("pykka_delivery.producer")


class _Endpoint:
    """The producer's address for the consumer side: queue, then process if free."""

    __slots__ = ("_producer",)

    def __init__(self, producer: Producer) -> None:
        self._producer = producer

    def __repr__(self) -> str:
        return f"Producer({self._producer.producer_id!r})"

    def tell(self, message: Any) -> None:
        self._producer._inbound(message)

    def tell_many(self, messages: list[Any]) -> None:
        """A whole batch from a transport: queued at once, processed once."""
        self._producer._inbound_many(messages)


class Producer(InboxLock, ProducerEffects):
    """Sends messages reliably to one consumer, one `send` at a time.

    Args:
        producer_id: identifies the stream.
        settings: see `ProducerControllerSettings`.
        serialization: for chunking; default `default_serialization`.
        timer_service: default: the process-wide one.
        self_ref_factory: builds the ref the other side uses to reach this handle from
            its local endpoint (a transport's remote address, or a fault injector in tests).
        durable_queue: where messages are stored before they are sent; None (the default):
            none. Its state is loaded here: what it holds unconfirmed is resent once a
            consumer registers, and numbering continues after it. The caller owns the
            queue: one producer at a time uses it, `close` flushes it, the caller closes
            it. If a store fails ``durable_queue_retry_attempts`` times the producer
            closes itself and the call raises `DurableQueueError`, as does every later
            call; create a new producer on the same queue to carry on.
        clock_millis: the clock of the stored timestamps; default: the wall clock.

    Connect it with `register_consumer` (or let a consumer register with
    ``consumer.register_to(producer.ref)``). Thread-safe, but meant for one sending thread.

    Raises:
        DurableQueueError: loading the durable queue's state failed every attempt.
    """

    def __init__(
        self,
        producer_id: str,
        settings: ProducerControllerSettings | None = None,
        *,
        serialization: Serialization | None = None,
        timer_service: TimerService | None = None,
        self_ref_factory: Callable[[Ref], Ref] | None = None,
        durable_queue: DurableProducerQueue | None = None,
        clock_millis: Callable[[], int] = wall_clock_millis,
    ) -> None:
        self._durable, state = open_durable(durable_queue, settings, f"Producer {producer_id!r}")
        self._failure: DurableQueueError | None = None
        self.producer_id = producer_id
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._inbox: deque[Any] = deque()
        self._endpoint = _Endpoint(self)
        self._self_ref: Ref = (
            self_ref_factory(self._endpoint) if self_ref_factory is not None else self._endpoint
        )
        self._ignore = Ignore()
        self._closed = False
        self._sleeping = False  # the lock holder is about to wait for a change
        self._caller = 0  # the thread telling others under the lock (see InboxLock)
        self._timers = Timers(self._endpoint.tell, timer_service)
        self._core = ProducerCore(
            producer_id,
            self._self_ref,
            self._ignore,
            settings,
            serialization,
            announce_demand=False,  # demand is read from the core (has_demand)
            durable_state=state,
            clock_millis=clock_millis,
        )
        with self._lock:
            self._run(self._core.on_start(self._ignore))

    @property
    def ref(self) -> Ref:
        """Where the consumer side reaches this producer (its "producer controller")."""
        return self._self_ref

    def register_consumer(self, consumer_controller: Ref) -> None:
        """Deliver to ``consumer_controller`` (a `Consumer`'s ref, a consumer controller
        actor, or a remote reference). A later call moves the stream to another consumer,
        resending what is unconfirmed."""
        with self._lock:
            self._check_open()
        self._inbound(RegisterConsumer(consumer_controller))

    def send(self, message: Any, timeout: float | None = None) -> int:
        """Send ``message`` once the consumer has room for it; returns its seq_nr.

        Raises:
            DeliveryTimeout: no demand within ``timeout`` seconds (nothing was sent).
            ClosedError: the producer was closed.
            DurableQueueError: storing it failed every attempt (the producer is closed).
        """
        lock = self._lock
        lock.acquire()  # not `with`: this runs for every message, and `with` costs more
        try:
            core = self._core
            # The steady state first (send_through's first step, inlined).
            seq_msg = None if self._inbox or self._closed else core.next_message(message)
            if seq_msg is not None:
                core.consumer.tell(seq_msg)  # type: ignore[union-attr] # set while active
                seq_nr = seq_msg.seq_nr
            else:
                if self._inbox or self._closed or not core.has_demand:
                    self._wait_for(self._has_demand, timeout, "demand to send")
                seq_nr = send_through(core, message, self._run)
        finally:
            lock.release()
        if self._inbox:
            self._after_release()
        return seq_nr

    def send_many(self, messages: Iterable[Any], timeout: float | None = None) -> list[int]:
        """Send ``messages`` in order, each once the consumer has room for it; returns their
        seq_nrs. It takes as many at a time as the consumer's window allows: with a durable
        queue, each such batch is stored with one write (one commit), which is what makes
        durable sending fast; without one, it still saves a call per message.

        Raises:
            DeliveryTimeout: not all were sent within ``timeout`` seconds; the error says
                how many were (those are in the stream; the rest were not sent).
            ClosedError: the producer was closed.
            DurableQueueError: storing failed every attempt (the producer is closed).
        """
        pending = list(messages)
        seq_nrs: list[int] = []
        deadline = None if timeout is None else time.monotonic() + timeout
        iterator = iter(pending)
        with self._lock:
            self._check_open()
            while len(seq_nrs) < len(pending):
                remaining = None if deadline is None else deadline - time.monotonic()
                try:
                    self._wait_for(self._has_demand, remaining, "demand to send")
                except DeliveryTimeout:
                    msg = (
                        f"Producer {self.producer_id!r}: no demand within {timeout} s: the "
                        f"first {len(seq_nrs)} of {len(pending)} messages were sent"
                    )
                    raise DeliveryTimeout(msg) from None
                seq_nrs += send_batch_through(self._core, iterator, self._run)
        self._after_release()
        return seq_nrs

    def send_nowait(self, message: Any) -> int:
        """Send ``message`` if the consumer has room for it now; returns its seq_nr.

        Raises:
            WouldBlock: no demand at the moment (nothing was sent).
        """
        with self._lock:
            self._check_open()
            self._drain()
            if not self._core.has_demand:
                msg = f"Producer {self.producer_id!r} has no demand: the consumer's window is full"
                raise WouldBlock(msg)
            seq_nr = send_through(self._core, message, self._run)
        self._after_release()
        return seq_nr

    def wait_for_demand(self, timeout: float | None = None) -> None:
        """Block until the consumer has room for one more message, sending nothing. Until
        this producer sends, the demand stays: a `send_nowait` from the only sending
        thread then succeeds (what lets a sender check several producers before it sends
        to any).

        Raises:
            DeliveryTimeout: no demand within ``timeout`` seconds.
            ClosedError: the producer was closed.
        """
        with self._lock:
            self._wait_for(self._has_demand, timeout, "demand to send")
        self._after_release()

    def send_and_confirm(self, message: Any, timeout: float | None = None) -> int:
        """Send ``message`` and wait until the consumer confirmed it; returns its seq_nr.
        With a durable queue, as in Akka, it returns once the message is stored instead.

        Raises:
            DeliveryTimeout: not sent, or not confirmed, within ``timeout`` seconds (if it
                was sent, it stays in the stream and will still be delivered).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        slot = ReplySlot()
        with self._lock:
            self._wait_for(self._has_demand, timeout, "demand to send")
            self._run(self._core.on_msg(message, slot))
            self._wait_for(
                lambda: slot.seq_nr is not None,
                None if deadline is None else deadline - time.monotonic(),
                f"confirmation of seq_nr {self._core.last_seq_nr}",
            )
        self._after_release()
        assert slot.seq_nr is not None
        return slot.seq_nr

    def wait_confirmed(self, timeout: float | None = None) -> None:
        """Block until every message sent so far is confirmed by the consumer.

        Raises:
            DeliveryTimeout: some are still unconfirmed after ``timeout`` seconds.
        """
        with self._lock:
            self._wait_for(
                lambda: self._core.all_confirmed, timeout, "confirmation of every message"
            )
        self._after_release()

    def close(self) -> None:
        """Stop the timers, refuse further sends and ignore the consumer side from now on:
        unconfirmed messages are not resent any more (close after `wait_confirmed` to be
        sure nothing is lost, or use a durable queue). The durable queue, if any, is
        flushed, not closed: its owner closes it."""
        with self._lock:
            self._closed = True
            self._timers.cancel_all()
            self._changed.notify_all()
            flush = self._durable is not None and self._failure is None
        if flush:
            assert self._durable is not None
            self._durable.flush_on_stop()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def snapshot(self) -> ProducerSnapshot:
        with self._lock:
            return self._core.snapshot()

    def statistics(self) -> ProducerStats:
        with self._lock:
            return self._core.statistics()

    # --- internals (call with the lock held unless said otherwise) --------------------

    def _has_demand(self) -> bool:
        return self._core.has_demand

    def _check_open(self) -> None:
        if self._closed:
            if self._failure is not None:
                raise failed_error(self.producer_id) from self._failure
            msg = f"Producer {self.producer_id!r} is closed"
            raise ClosedError(msg)

    def _timeout_message(self, what: str, timeout: float | None) -> str:
        return f"Producer {self.producer_id!r}: no {what} within {timeout} s"

    def _effects_of(self, message: Any) -> list[Effect] | None:
        if type(message) is TimerFired:
            if self._closed or not self._timers.accept(message):
                return None
            return self._core.on_timer(message.key)
        try:
            return self._core.receive(message)
        except LocalProtocolError as error:
            logger.error("%s", error)
            return None

    def _run(self, effects: list[Effect]) -> None:
        self._caller = threading.get_ident()
        try:
            self._carry_out(effects)
        finally:
            self._caller = 0

    def _tell(self, to: Ref, message: Any) -> None:
        if type(message) is not RequestNext:  # demand is read from the core
            to.tell(message)

    def _wake_waiters(self) -> None:
        self._changed.notify_all()
