"""`AsyncProducer` and `AsyncConsumer`: reliable delivery for asyncio code.

The same protocol, guarantees and errors as `Producer` and `Consumer` (handles/producer.py,
handles/consumer.py: the same sessions, delivery/session/), for code that runs in an event
loop. A handle is created inside a running loop and belongs to it: every step of its core
runs on the loop's thread, and its methods are called there. Two exceptions:
``delivery.confirm()`` may be called on any thread (it is handed to the loop), and so may
`AsyncProducer.register_consumer`.

What the other side sends arrives on any thread (a transport's, the timer thread, a
blocking handle's, a pykka actor's). It is appended to the handle's inbox, and the loop is
woken with ``call_soon_threadsafe`` only when something has to happen now:

* `AsyncConsumer`: only when a task is parked in `receive`, and once per parking however
  many messages arrive before the loop runs again. A consumer that is busy finds what
  arrived in its inbox on its next `receive`.
* `AsyncProducer`: when no producer call is running on the loop, processing is scheduled
  once (however many messages arrive before it runs), so an idle producer still answers
  `Request`, `Resend` and retries. A running call processes them itself before it returns,
  as the blocking handle's lock holder does.

Arrivals on the loop's own thread (the other handle in the same loop) are handled at
once, without scheduling anything. A batch therefore costs at most one wake-up of the
loop, never one per message. Both endpoints also take a transport's whole batch in one
call (``tell_many``, as the blocking handles' endpoints do).

Lost wake-ups are avoided as in the blocking handles: a task that parks first announces it
(``_waiter`` / ``_busy = False``), then looks at the inbox once more; a thread that
appends first, then looks at the announcement. One of the two sees the other.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from threading import get_ident
from typing import Any

from pykka_delivery import _observed
from pykka_delivery.delivery.core.effects import Effect
from pykka_delivery.delivery.core.producer import ProducerSnapshot, ProducerStats
from pykka_delivery.delivery.core.settings import ProducerControllerSettings
from pykka_delivery.delivery.handles._loop import call_in_loop, wake, wrong_thread
from pykka_delivery.delivery.session.producer import ProducerSession, ReplySlot
from pykka_delivery.delivery.stores.calls import wall_clock_millis
from pykka_delivery.delivery.stores.durable_queue import DurableProducerQueue
from pykka_delivery.delivery.timers import Timers, TimerService
from pykka_delivery.errors import DeliveryTimeout, WouldBlock
from pykka_delivery.protocol.messages import Ref, RegisterConsumer
from pykka_delivery.protocol.serialization import Serialization

__all__ = ["AsyncProducer"]


class _ProducerEndpoint:
    """The producer's address for the consumer side: queue, then process or schedule."""

    __slots__ = ("_producer",)

    def __init__(self, producer: AsyncProducer) -> None:
        self._producer = producer

    def __repr__(self) -> str:
        return f"AsyncProducer({self._producer.producer_id!r})"

    def tell(self, message: Any) -> None:
        producer = self._producer
        producer._inbox.append(message)
        self._arrived()

    def tell_many(self, messages: list[Any]) -> None:
        """A whole batch from a transport: queued at once, processed once."""
        self._producer._inbox.extend(messages)
        self._arrived()

    def _arrived(self) -> None:
        producer = self._producer
        if producer._busy:
            return  # a producer call runs on the loop: it processes this before returning
        if get_ident() == producer._loop_thread:
            producer._process()  # on the loop, idle: process now, as the blocking handle
        elif not producer._scheduled:
            producer._scheduled = True
            call_in_loop(producer._loop, producer._process_scheduled)


class AsyncProducer:
    """Sends messages reliably to one consumer, from asyncio code.

    Args:
        producer_id: identifies the stream.
        settings: see `ProducerControllerSettings`.
        serialization: for chunking; default `default_serialization`.
        timer_service: default: the process-wide one.
        self_ref_factory: builds the ref the other side uses to reach this handle from
            its local endpoint (a transport's remote address, or a fault injector in tests).
        durable_queue: as `Producer`'s: messages are stored before they are sent, the
            state is loaded here, `close` flushes the queue and its owner closes it. The
            queue is called synchronously on the loop's thread (the stores we ship are
            embedded): a store, and the waits between retries of a failing one, hold up
            the loop; `send_many` stores a whole window with one call.
        clock_millis: the clock of the stored timestamps; default: the wall clock.

    Create it inside a running event loop and use it from that loop. Connect it with
    `register_consumer` (or let a consumer register with
    ``consumer.register_to(producer.ref)``). Meant for one sending task; other tasks may
    wait in `wait_confirmed` meanwhile.

    A `send` that finds demand completes without suspending (like ``asyncio.Queue.put``
    with room): a task that sends in a tight loop to a fast consumer on another thread can
    keep the loop busy; ``await asyncio.sleep(0)`` now and then gives other tasks a turn.

    Raises:
        RuntimeError: created outside a running event loop.
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
        self._loop = asyncio.get_running_loop()
        self._loop_thread = get_ident()
        self.producer_id = producer_id
        self._waiters: list[asyncio.Future[None]] = []
        # True while a producer call runs on the loop (not while it is parked): arrivals
        # then leave their message to it.
        self._busy = False
        self._scheduled = False  # a _process_scheduled is on its way to the loop
        self._endpoint = _ProducerEndpoint(self)
        self._self_ref: Ref = (
            self_ref_factory(self._endpoint) if self_ref_factory is not None else self._endpoint
        )
        self._session = ProducerSession.for_handle(
            producer_id,
            self._self_ref,
            Timers(self._endpoint.tell, timer_service),
            settings=settings,
            serialization=serialization,
            durable_queue=durable_queue,
            clock_millis=clock_millis,
            on_failure=self._notify,
        )
        self._inbox = self._session.inbox
        _observed.observe(_observed.PRODUCER, self, self._loop)

    @property
    def ref(self) -> Ref:
        """Where the consumer side reaches this producer (its "producer controller")."""
        return self._self_ref

    def register_consumer(self, consumer_controller: Ref) -> None:
        """Deliver to ``consumer_controller`` (a consumer handle's ref, a consumer controller
        actor, or a remote reference). A later call moves the stream to another consumer,
        resending what is unconfirmed. May be called on any thread.

        Raises:
            ClosedError: the producer was closed.
        """
        self._session.check_open()
        self._endpoint.tell(RegisterConsumer(consumer_controller))

    async def send(self, message: Any, timeout: float | None = None) -> int:
        """Send ``message`` once the consumer has room for it; returns its seq_nr.

        Raises:
            DeliveryTimeout: no demand within ``timeout`` seconds (nothing was sent).
            ClosedError: the producer was closed.
            SerializationError: as `Producer.send`'s (nothing was sent).
            DurableQueueError: storing it failed every attempt (the producer is closed).
        """
        if get_ident() != self._loop_thread:
            wrong_thread("AsyncProducer")
        self._busy = True
        try:
            session = self._session
            seq_nr = None if self._inbox or session.closed else session.try_send(message)
            if seq_nr is None:
                await self._wait_for(self._has_demand, timeout, session.DEMAND_TO_SEND)
                seq_nr = session.send(message)
            return seq_nr
        finally:
            self._busy = False  # _leave, once there is something to take in
            if self._inbox:
                self._leave()

    async def send_many(self, messages: Iterable[Any], timeout: float | None = None) -> list[int]:
        """Send ``messages`` in order, each once the consumer has room for it; returns their
        seq_nrs. As `Producer.send_many`: a window at a time, one store per window (with
        up to ``durable_store_ahead`` more stored ahead, sent as demand comes).

        Raises:
            DeliveryTimeout: not all were sent within ``timeout`` seconds; the error says
                how many were (those are in the stream; the rest were not sent).
            SerializationError: as `Producer.send_many`'s (none was sent).
            ClosedError: the producer was closed.
            DurableQueueError: storing failed every attempt (the producer is closed).
        """
        if get_ident() != self._loop_thread:
            wrong_thread("AsyncProducer")
        pending = list(messages)
        seq_nrs: list[int] = []
        loop = self._loop
        deadline = None if timeout is None else loop.time() + timeout
        iterator = iter(pending)
        session = self._session
        checked = None
        self._busy = True
        try:
            session.check_open()
            while len(seq_nrs) < len(pending):
                remaining = None if deadline is None else deadline - loop.time()
                try:
                    await self._wait_for(self._has_demand, remaining, session.DEMAND_TO_SEND)
                except DeliveryTimeout:
                    msg = session.partly_sent_message(timeout, len(seq_nrs), len(pending))
                    raise DeliveryTimeout(msg) from None
                if not seq_nrs:  # the consumer side is known now: check them all
                    checked = session.check_payloads(pending)
                seq_nrs += session.send_batch(iterator, checked)
        finally:
            self._leave()
        return seq_nrs

    def send_nowait(self, message: Any) -> int:
        """Send ``message`` if the consumer has room for it now; returns its seq_nr.

        Raises:
            WouldBlock: no demand at the moment (nothing was sent).
            ClosedError: the producer was closed.
            SerializationError: as `Producer.send`'s (nothing was sent).
        """
        if get_ident() != self._loop_thread:
            wrong_thread("AsyncProducer")
        session = self._session
        self._busy = True
        try:
            session.check_open()
            self._drain()
            seq_nr = session.try_send(message)
            if seq_nr is None:
                raise WouldBlock(session.no_demand_message())
            return seq_nr
        finally:
            self._leave()

    async def send_and_confirm(self, message: Any, timeout: float | None = None) -> int:
        """Send ``message`` and wait until the consumer confirmed it; returns its seq_nr.
        With a durable queue, as in Akka, it returns once the message is stored instead.

        Raises:
            DeliveryTimeout: not sent, or not confirmed, within ``timeout`` seconds (if it
                was sent, it stays in the stream and will still be delivered).
            SerializationError: as `Producer.send`'s (nothing was sent).
            ClosedError: the producer was closed.
        """
        if get_ident() != self._loop_thread:
            wrong_thread("AsyncProducer")
        loop = self._loop
        deadline = None if timeout is None else loop.time() + timeout
        slot = ReplySlot()
        self._busy = True
        try:
            await self._wait_for(self._has_demand, timeout, self._session.DEMAND_TO_SEND)
            seq_nr = self._session.send(message, slot)
            await self._wait_for(
                lambda: slot.seq_nr is not None,
                None if deadline is None else deadline - loop.time(),
                f"confirmation of seq_nr {seq_nr}",
            )
        finally:
            self._leave()
        return seq_nr

    async def wait_confirmed(self, timeout: float | None = None) -> None:
        """Wait until every message sent so far is confirmed by the consumer.

        Raises:
            DeliveryTimeout: some are still unconfirmed after ``timeout`` seconds.
            ClosedError: the producer was closed.
        """
        if get_ident() != self._loop_thread:
            wrong_thread("AsyncProducer")
        self._busy = True
        try:
            await self._wait_for(self._all_confirmed, timeout, "confirmation of every message")
        finally:
            self._leave()

    def close(self) -> None:
        """Stop the timers, refuse further sends and ignore the consumer side from now on:
        unconfirmed messages are not resent any more (close after `wait_confirmed` to be
        sure nothing is lost, or use a durable queue). Tasks waiting in the producer get
        `ClosedError`. The durable queue, if any, is flushed, not closed: its owner closes
        it."""
        if get_ident() != self._loop_thread:
            wrong_thread("AsyncProducer")
        self._session.close()
        self._notify()
        self._session.release()

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()

    def snapshot(self) -> ProducerSnapshot:
        if get_ident() != self._loop_thread:
            wrong_thread("AsyncProducer")
        return self._session.snapshot()

    def statistics(self) -> ProducerStats:
        if get_ident() != self._loop_thread:
            wrong_thread("AsyncProducer")
        return self._session.statistics()

    # --- internals (on the loop's thread) ---------------------------------------------

    @property
    def _run(self) -> Callable[[list[Effect]], None]:
        """How the session carries out the effects of a send (a hook for tests)."""
        return self._session.runner

    @_run.setter
    def _run(self, runner: Callable[[list[Effect]], None]) -> None:
        self._session.runner = runner

    def _has_demand(self) -> bool:
        return self._session.has_demand

    def _all_confirmed(self) -> bool:
        return self._session.all_confirmed

    async def _wait_for(self, ready: Callable[[], bool], timeout: float | None, what: str) -> None:
        """Park until ``ready()``; called busy, returns (or raises) busy."""
        session = self._session
        session.check_open()
        self._drain()
        if ready():
            return
        loop = self._loop
        deadline = None if timeout is None else loop.time() + timeout
        while not ready():
            remaining = None
            if deadline is not None:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise DeliveryTimeout(session.timeout_message(what, timeout))
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.append(waiter)
            # Parked, we are not busy: from now on an arrival on another thread schedules
            # processing (which wakes us) instead of leaving its message to us. What
            # arrived before that is still ours: look at the inbox once more.
            self._busy = False
            try:
                if not self._inbox:
                    if remaining is None:
                        await waiter
                    else:
                        try:
                            async with asyncio.timeout(remaining):
                                await waiter
                        except TimeoutError:
                            msg = session.timeout_message(what, timeout)
                            raise DeliveryTimeout(msg) from None
            finally:
                self._busy = True
                if not waiter.done() or waiter.cancelled():
                    with contextlib.suppress(ValueError):
                        self._waiters.remove(waiter)
            session.check_open()
            self._drain()

    def _process(self) -> None:
        self._busy = True
        try:
            self._drain()
        finally:
            self._leave()

    def _process_scheduled(self) -> None:
        """Run on the loop for arrivals from other threads (one call per batch)."""
        # Cleared before draining: a message appended after this schedules anew.
        self._scheduled = False
        self._process()

    def _leave(self) -> None:
        """End a busy stretch: what arrived from another thread meanwhile is ours."""
        self._busy = False
        while self._inbox:
            self._busy = True
            try:
                self._drain()
            finally:
                self._busy = False

    def _notify(self) -> None:
        waiters = self._waiters
        if waiters:
            self._waiters = []
            for waiter in waiters:
                wake(waiter)

    def _drain(self) -> None:
        if self._session.process_inbox():
            self._notify()
