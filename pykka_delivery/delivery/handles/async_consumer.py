"""`AsyncConsumer`: reliable receiving for asyncio code.

The same protocol, guarantees and errors as `Consumer` (consumer.py), over the same
`ConsumerSession` (session/consumer.py), for code that runs in an event loop: this module
only waits. A handle is created inside a running loop and belongs to it: every step of its
session runs on the loop's thread, and its methods are called there, except
``delivery.confirm()`` and ``delivery.reject()``, which may be called on any thread (the
answer is handed to the loop).

What the producer side sends arrives on any thread (a transport's, the timer thread, a
blocking handle's, a pykka actor's). It is appended to the session's inbox, and the loop
is woken with ``call_soon_threadsafe`` only when a task is parked in `receive`, and once
per parking however many messages arrive before the loop runs again (a transport's whole
batch comes in one ``tell_many``). A consumer that is busy finds what arrived in its inbox
on its next `receive`. Arrivals on the loop's own thread (a producer handle in the same
loop) wake the parked task at once, without scheduling anything.

Lost wake-ups are avoided as in the blocking handle: a task that parks first announces it
(``_waiter``), then looks at the inbox once more; a thread that appends first, then looks
at the announcement. One of the two sees the other.
"""

from __future__ import annotations

import asyncio
import os
from collections import deque
from collections.abc import Callable
from threading import get_ident
from typing import Any

from pykka_delivery import _observed
from pykka_delivery.delivery.core.consumer import ConsumerSnapshot, ConsumerStats
from pykka_delivery.delivery.core.settings import ConsumerControllerSettings
from pykka_delivery.delivery.handles._loop import call_in_loop, wake, wrong_thread
from pykka_delivery.delivery.messages import CONFIRMED, Delivery, Rejected
from pykka_delivery.delivery.session.consumer import (
    ConsumerSession,
    Sends,
    nothing_ready,
)
from pykka_delivery.delivery.stores.dead_letters import DeadLetterDestination
from pykka_delivery.delivery.stores.dedup import DedupStore
from pykka_delivery.delivery.timers import Timers, TimerService
from pykka_delivery.errors import ClosedError, LocalProtocolError
from pykka_delivery.protocol.messages import Ref
from pykka_delivery.protocol.serialization import Serialization

__all__ = ["AsyncConsumer"]


class _Waiter:
    """A `receive` parked on the loop; ``woken`` once a wake-up is on its way."""

    __slots__ = ("future", "woken")

    def __init__(self, future: asyncio.Future[None]) -> None:
        self.future = future
        self.woken = False


class _ConsumerEndpoint:
    """The consumer's address for the producer side: append, wake the reader if parked."""

    __slots__ = ("_consumer", "_inbox")

    def __init__(self, consumer: AsyncConsumer, inbox: deque[Any]) -> None:
        self._consumer = consumer
        self._inbox = inbox

    def __repr__(self) -> str:
        return "AsyncConsumer()"

    def tell(self, message: Any) -> None:
        self._inbox.append(message)
        if self._consumer._waiter is not None:
            self._consumer._arrived()

    def tell_many(self, messages: list[Any]) -> None:
        """A whole batch from a transport: one append, at most one wake-up."""
        self._inbox.extend(messages)
        if self._consumer._waiter is not None:
            self._consumer._arrived()

    tell_runs = tell_many  # runs stay whole: the session delivers from them (TakesRuns)


class _ConfirmTo:
    """``Delivery.confirm_to`` of one delivery: on the loop, answering is a direct call
    into the session; a second answer of the same delivery is told apart from the next
    one's.

    Each `AsyncConsumer` makes its own subclass naming it (`_confirm_to_class`), so that
    one is made per delivery without an ``__init__`` call. ``used`` is set (in the
    instance's ``__dict__``) by an answer given on another thread, which reaches the loop
    later: a second one meanwhile is refused.
    """

    _consumer: AsyncConsumer
    used = False

    def tell(self, message: Any) -> None:
        consumer = self._consumer
        on_loop = get_ident() == consumer._loop_thread and not self.used
        if message is CONFIRMED or type(message) is not Rejected:
            if on_loop:  # the steady state: it runs once per message
                sends = consumer._session.confirm(self)
                if sends:
                    consumer._tell(sends)
            else:
                consumer._answer_elsewhere(self, None)
        elif on_loop:
            consumer._tell(consumer._session.reject(self, message.reason))
        else:
            consumer._answer_elsewhere(self, message.reason)


def _confirm_to_class(consumer: AsyncConsumer) -> type[_ConfirmTo]:
    return type("_ConfirmTo", (_ConfirmTo,), {"_consumer": consumer})


class AsyncConsumer:
    """Receives one producer's messages reliably, in order, one at a time, in asyncio code.

    Iterate it, confirming each delivery when it is processed::

        async for delivery in consumer:
            await handle(delivery.message)
            delivery.confirm()

    Args:
        settings: see `ConsumerControllerSettings`.
        serialization: for chunked messages; default `default_serialization`.
        timer_service: default: the process-wide one.
        self_ref_factory: builds the ref the other side uses to reach this handle from
            its local endpoint (a transport's remote address, or a fault injector in tests).

    Create it inside a running event loop and use it from that loop, receiving from one
    task. ``delivery.confirm()`` may also be called on another thread (a worker that
    processed it): the confirmation is then handed to the loop, and reaches the consumer
    before anything the worker hands to the loop afterwards (such as the completion of
    ``asyncio.to_thread``). Connect it with `register_to` (or let a producer call
    ``register_consumer(consumer.ref)``). Retries on silence are sent while a task waits
    in `receive`.

    With a ``dedup_store`` (deduplication across restarts, dedup.py), positions are loaded
    here, each confirmation records one, and the store is flushed before every
    Request/Ack and on `close`, on the loop's thread (a commit; retries of a failing store
    wait ``dedup_store_backoff`` there too). The caller owns the store. If it keeps
    failing, the call that met the failure raises `DedupStoreError` (for a confirmation
    made on another thread: the next `receive`) and the handle closes itself.

    ``delivery.reject(reason)`` needs ``dead_letters``, as for `Consumer`: the message is
    delivered again after the backoff and, after ``max_attempts``, written there (on the
    loop's thread) before the stream moves on.

    ``epoch`` is the fencing epoch of this activation, as for `Consumer`: once a producer
    serves a newer one, every call (``receive``, ``confirm``, iteration) raises
    `ConsumerFenced`.

    Raises:
        RuntimeError: created outside a running event loop.
        DedupStoreError: the deduplication store could not be loaded.
        ConsumerFenced: the deduplication store holds a newer epoch already.
        TypeError, ValueError: ``epoch`` is not an int >= 0.
    """

    def __init__(
        self,
        settings: ConsumerControllerSettings | None = None,
        *,
        serialization: Serialization | None = None,
        timer_service: TimerService | None = None,
        self_ref_factory: Callable[[Ref], Ref] | None = None,
        dedup_store: DedupStore | None = None,
        dead_letters: DeadLetterDestination | str | os.PathLike[str] | None = None,
        epoch: int = 0,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = get_ident()
        self._waiter: _Waiter | None = None
        self._told = False  # something was told since receive() last let the loop run
        inbox: deque[Any] = deque()
        endpoint = _ConsumerEndpoint(self, inbox)
        self._self_ref: Ref = (
            self_ref_factory(endpoint) if self_ref_factory is not None else endpoint
        )
        # Each delivery gets its own confirm_to, so a second confirm() of an old delivery
        # cannot confirm the current one.
        self._session = ConsumerSession(
            self._self_ref,
            settings,
            name="AsyncConsumer",
            timers=Timers(endpoint.tell, timer_service),
            inbox=inbox,
            serialization=serialization,
            new_confirm_to=_confirm_to_class(self),
            dedup_store=dedup_store,
            dead_letters=dead_letters,
            on_end=self._wake_reader,
            epoch=epoch,
        )
        self._next_ready = self._session.poll  # bound once: it runs once per message
        self._session.start()
        _observed.observe(_observed.CONSUMER, self, self._loop)

    @property
    def ref(self) -> Ref:
        """Where the producer side sends to (this consumer's "consumer controller")."""
        return self._self_ref

    def register_to(self, producer_controller: Ref) -> None:
        """Connect to ``producer_controller`` (a producer handle's ref, a producer controller
        actor, or a remote reference); repeated until its first message arrives.

        Raises:
            ClosedError: the consumer was closed.
        """
        if get_ident() != self._loop_thread:
            wrong_thread("AsyncConsumer")
        self._session.register_to(producer_controller)
        self._flush()

    async def receive(self, timeout: float | None = None) -> Delivery:
        """The next delivery, waiting for it if needed. Confirm it before the next call.

        Raises:
            DeliveryTimeout: nothing arrived within ``timeout`` seconds.
            ClosedError: the consumer was closed, or stopped after `deliver_then_stop`.
            LocalProtocolError: the previous delivery is not confirmed yet, or another task
                is waiting in `receive`.
        """
        if get_ident() != self._loop_thread:
            wrong_thread("AsyncConsumer")
        if self._told:
            # A Request or Ack went out since the last turn: let the loop's other tasks
            # run once, so that a transport on this loop (``async with Node()``) writes it
            # now rather than after every delivery ready here is processed.
            self._told = False
            await asyncio.sleep(0)
        session = self._session
        deadline = None
        while True:
            self._check_one_reader()
            delivery = self._next_ready()
            if session.outbox:
                self._flush()  # a producer on this thread may answer at once: look again
                if delivery is None:
                    continue
            if delivery is not None:
                return delivery
            session.check_not_stopped()
            if deadline is None and timeout is not None:
                deadline = self._loop.time() + timeout
            await self._wait(deadline, timeout)

    def receive_nowait(self) -> Delivery:
        """The next delivery if one is here already.

        Raises:
            WouldBlock: none is ready.
            ClosedError: the consumer was closed.
            LocalProtocolError: the previous delivery is not confirmed yet.
        """
        if get_ident() != self._loop_thread:
            wrong_thread("AsyncConsumer")
        self._check_one_reader()
        delivery = self._next_ready()
        self._flush()
        if delivery is None:
            raise nothing_ready()
        return delivery

    def __aiter__(self) -> AsyncConsumer:
        """Deliveries until the consumer is closed or stopped."""
        return self

    async def __anext__(self) -> Delivery:
        # What the session has at once needs no receive() (it runs once per message);
        # receive() lets the loop run after something was told, and waits.
        if not self._told and self._waiter is None and get_ident() == self._loop_thread:
            try:
                delivery = self._next_ready()
            except ClosedError:
                raise StopAsyncIteration from None
            if self._session.outbox:
                self._flush()
            if delivery is not None:
                return delivery
        try:
            return await self.receive()
        except ClosedError:
            raise StopAsyncIteration from None

    def deliver_then_stop(self) -> None:
        """Stop once every message received so far is delivered and confirmed; iteration
        then ends.

        Raises:
            ClosedError: the consumer was closed.
        """
        if get_ident() != self._loop_thread:
            wrong_thread("AsyncConsumer")
        self._session.deliver_then_stop()
        self._wake_reader()
        self._flush()

    def close(self) -> None:
        """Stop now; tells the producer side what is confirmed (unconfirmed messages stay
        with the producer, to be delivered to the next consumer). A task waiting in
        `receive` gets `ClosedError` (an ``async for`` ends).

        Raises:
            DedupStoreError: the deduplication store could not be flushed (nothing was
                told to the producer side; the handle is closed all the same).
        """
        if get_ident() != self._loop_thread:
            wrong_thread("AsyncConsumer")
        try:
            self._session.close()
        finally:
            self._wake_reader()
        self._flush()

    async def __aenter__(self) -> AsyncConsumer:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()

    def snapshot(self) -> ConsumerSnapshot:
        if get_ident() != self._loop_thread:
            wrong_thread("AsyncConsumer")
        return self._session.snapshot()

    def statistics(self) -> ConsumerStats:
        if get_ident() != self._loop_thread:
            wrong_thread("AsyncConsumer")
        return self._session.statistics()

    # --- internals (on the loop's thread unless said otherwise) -----------------------

    def _check_one_reader(self) -> None:
        """Raises if another task is parked in `receive` (after the session's own checks,
        which come first)."""
        if self._waiter is not None:
            self._session.check_can_receive()
            msg = "Consumer: another task is waiting in receive(): receive from one task"
            raise LocalProtocolError(msg)

    async def _wait(self, deadline: float | None, timeout: float | None) -> None:
        """Park until the inbox fills. Announce the parking first, then look once more: a
        message appended after that look finds ``_waiter`` set and wakes us."""
        loop = self._loop
        remaining = None
        if deadline is not None:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise self._session.nothing_delivered(timeout)
        waiter = _Waiter(loop.create_future())
        self._waiter = waiter
        try:
            if self._session.inbox:
                return
            if remaining is None:
                await waiter.future
            else:
                try:
                    async with asyncio.timeout(remaining):
                        await waiter.future
                except TimeoutError:
                    raise self._session.nothing_delivered(timeout) from None
        finally:
            self._waiter = None
        self._session.check_open()

    def _arrived(self) -> None:
        """Any thread: something was appended while a reader is parked: wake it, once
        (the rest of the batch finds it woken and only appends)."""
        waiter = self._waiter
        if waiter is not None and not waiter.woken:
            waiter.woken = True
            if get_ident() == self._loop_thread:
                wake(waiter.future)
            else:
                call_in_loop(self._loop, wake, waiter.future)

    def _wake_reader(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            waiter.woken = True
            wake(waiter.future)

    def _answer_elsewhere(self, confirm_to: _ConfirmTo, reason: str | None) -> None:
        """Any thread: an answer (a confirmation, or a rejection with ``reason``) given
        off the loop, or given twice: checked here, carried out on the loop."""
        session = self._session
        if confirm_to.used or not session.expects(confirm_to):
            session.refuse("confirm" if reason is None else "reject")
        if reason is not None:
            session.check_can_reject()
        confirm_to.used = True
        if not call_in_loop(self._loop, self._answered, confirm_to, reason):
            msg = "Consumer: its event loop is closed"
            raise ClosedError(msg)

    def _answered(self, confirm_to: _ConfirmTo, reason: str | None) -> None:
        """On the loop: an answer given on another thread."""
        session = self._session
        if not session.expects(confirm_to):
            return  # closed meanwhile: the producer keeps it unconfirmed
        if reason is None:
            self._tell(session.confirm(confirm_to))
        else:
            self._tell(session.reject(confirm_to, reason))

    def _flush(self) -> None:
        self._tell(self._session.take_outbox())

    def _tell(self, sends: Sends) -> None:
        """Tell what the core sent, once its step is done: a producer answering at once on
        this thread must find the consumer consistent."""
        if sends:
            self._told = True
            for to, message in sends:
                to.tell(message)
