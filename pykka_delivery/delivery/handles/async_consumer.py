"""`AsyncProducer` and `AsyncConsumer`: reliable delivery for asyncio code.

The same protocol, guarantees and errors as `Producer` and `Consumer` (producer_handle.py,
consumer_handle.py), for code that runs in an event loop. A handle is created inside a
running loop and belongs to it: every step of its core runs on the loop's thread, and its
methods are called there. Two exceptions: ``delivery.confirm()`` may be called on any
thread (it is handed to the loop), and so may `AsyncProducer.register_consumer`.

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
import os
from collections import deque
from collections.abc import Callable
from threading import get_ident
from typing import Any

from pykka_delivery.delivery.core.consumer import ConsumerCore, ConsumerSnapshot, ConsumerStats
from pykka_delivery.delivery.core.effects import (
    CancelTimer,
    Effect,
    RecordConfirmed,
    Send,
    StartTimer,
    Stop,
    WriteDeadLetter,
)
from pykka_delivery.delivery.core.settings import (
    ConsumerControllerSettings,
)
from pykka_delivery.delivery.handles._loop import call_in_loop, wake, wrong_thread
from pykka_delivery.delivery.handles._parts import (
    DeliveryFeed,
    ReadyDeliveries,
)
from pykka_delivery.delivery.messages import CONFIRMED, Delivery, Rejected
from pykka_delivery.delivery.stores.dead_letters import (
    DeadLetterDestination,
    DeadLetterError,
    dead_letter_destination,
    write_dead_letter,
)
from pykka_delivery.delivery.stores.dedup import DedupStore, DedupStoreError, DedupWriter
from pykka_delivery.delivery.timers import Timers, TimerService
from pykka_delivery.errors import ClosedError, DeliveryTimeout, LocalProtocolError, WouldBlock
from pykka_delivery.protocol.messages import Ref, SequencedRun
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

    __slots__ = ("_consumer",)

    def __init__(self, consumer: AsyncConsumer) -> None:
        self._consumer = consumer

    def __repr__(self) -> str:
        return "AsyncConsumer()"

    def tell(self, message: Any) -> None:
        consumer = self._consumer
        consumer._inbox.append(message)
        waiter = consumer._waiter
        if waiter is not None and not waiter.woken:
            # The first arrival wakes the parked reader; the rest of the batch finds it
            # woken and only appends.
            waiter.woken = True
            if get_ident() == consumer._loop_thread:
                wake(waiter.future)
            else:
                call_in_loop(consumer._loop, wake, waiter.future)

    def tell_many(self, messages: list[Any]) -> None:
        """A whole batch from a transport: one append, at most one wake-up."""
        consumer = self._consumer
        consumer._inbox.extend(messages)
        waiter = consumer._waiter
        if waiter is not None and not waiter.woken:
            waiter.woken = True
            if get_ident() == consumer._loop_thread:
                wake(waiter.future)
            else:
                call_in_loop(consumer._loop, wake, waiter.future)

    tell_runs = tell_many  # runs stay whole: the handle delivers from them (TakesRuns)


class _ConfirmTo:
    """``Delivery.confirm_to`` of one delivery: confirming is a direct call, and a second
    confirmation of the same delivery is told apart from the next one's.

    Each `AsyncConsumer` makes its own subclass naming it (`_confirm_to_class`), so that
    one is made per delivery without an ``__init__`` call. ``used`` is set (in the
    instance's ``__dict__``) by a confirmation made on another thread, which reaches the
    loop later: a second one meanwhile is refused.
    """

    _consumer: AsyncConsumer
    used = False

    def tell(self, message: Any) -> None:
        if message is CONFIRMED:
            self._consumer._confirm(self)
        elif type(message) is Rejected:
            self._consumer._reject(self, message.reason)
        else:
            self._consumer._confirm(self)


def _confirm_to_class(consumer: AsyncConsumer) -> type[_ConfirmTo]:
    return type("_ConfirmTo", (_ConfirmTo,), {"_consumer": consumer})


class AsyncConsumer(DeliveryFeed):
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

    Raises:
        RuntimeError: created outside a running event loop.
        DedupStoreError: the deduplication store could not be loaded.
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
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = get_ident()
        settings = settings or ConsumerControllerSettings()
        self._dead_letters, self._owns_dead_letters = dead_letter_destination(dead_letters)
        self._dead_letter_error: DeadLetterError | None = None
        self._dedup = None if dedup_store is None else DedupWriter(dedup_store, settings)
        positions = None if self._dedup is None else self._dedup.load()
        self._inbox: deque[Any] = deque()
        self._waiter: _Waiter | None = None
        self._closed = False
        self._outstanding: Delivery | None = None
        self._outbox: list[tuple[Ref, Any]] = []  # told once the core's step is done
        self._told = False  # something was told since receive() last let the loop run
        self._endpoint = _ConsumerEndpoint(self)
        self._self_ref: Ref = (
            self_ref_factory(self._endpoint) if self_ref_factory is not None else self._endpoint
        )
        self._ready = ReadyDeliveries()
        self._timers = Timers(self._endpoint.tell, timer_service)
        # Each delivery gets its own confirm_to, so a second confirm() of an old delivery
        # cannot confirm the current one.
        self._core = ConsumerCore(
            self._self_ref,
            settings,
            serialization,
            new_confirm_to=_confirm_to_class(self),
            dedup_positions=positions,
        )
        self._run(self._core.on_spawned())
        self._run(self._core.on_start(self._ready))
        self._flush()

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
        self._check_open()
        self._run(self._core.on_register_to(producer_controller))
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
        deadline = None
        while True:
            if self._closed or self._outstanding is not None or self._waiter is not None:
                self._check_can_receive()
            delivery = self._next_ready()
            if self._outbox:
                self._flush()  # a producer on this thread may answer at once: look again
                if delivery is None:
                    continue
            if delivery is not None:
                return delivery
            if self._core.is_stopped:
                msg = "Consumer stopped after delivering every message (deliver_then_stop)"
                raise ClosedError(msg)
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
        self._check_can_receive()
        delivery = self._next_ready()
        self._flush()
        if delivery is None:
            msg = "Consumer has no delivery ready"
            raise WouldBlock(msg)
        return delivery

    def __aiter__(self) -> AsyncConsumer:
        """Deliveries until the consumer is closed or stopped."""
        return self

    async def __anext__(self) -> Delivery:
        # The steady state over a transport, inlined (it runs once per message): the next
        # message of the run at the head of the inbox is the next delivery.
        inbox = self._inbox
        if (
            inbox
            and type(inbox[0]) is SequencedRun
            and self._outstanding is None
            and not self._told
            and not self._closed
            and self._waiter is None
            and not self._ready.deliveries
            and get_ident() == self._loop_thread
        ):
            head = inbox[0]
            delivery = self._core.next_run_delivery(head)
            if delivery is not None:
                if head.seq_nr == head.last_seq_nr:
                    inbox.popleft()
                self._outstanding = delivery
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
        self._check_open()
        # What already arrived counts as received: take it into the core first.
        inbox = self._inbox
        while inbox:
            self._feed(inbox.popleft())
        self._run(self._core.on_deliver_then_stop())
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
        if self._closed:
            return
        self._closed = True
        try:
            self._run(self._core.on_stopped())
            if self._dedup is not None:
                self._dedup_call(self._dedup.flush)
        finally:
            self._timers.cancel_all()
            self._wake_reader()
            if self._owns_dead_letters:
                self._dead_letters.close()  # type: ignore[union-attr] # owned: SQLite
        self._flush()

    async def __aenter__(self) -> AsyncConsumer:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()

    def snapshot(self) -> ConsumerSnapshot:
        if get_ident() != self._loop_thread:
            wrong_thread("AsyncConsumer")
        return self._core.snapshot()

    def statistics(self) -> ConsumerStats:
        if get_ident() != self._loop_thread:
            wrong_thread("AsyncConsumer")
        return self._core.statistics()

    # --- internals (on the loop's thread unless said otherwise) -----------------------

    def _dedup_call(self, call: Callable[..., None], *args: Any) -> None:
        """Call the deduplication store; if it gives up, close this handle at once and
        raise."""
        try:
            call(*args)
        except DedupStoreError:
            self._break()
            raise

    def _break(self) -> None:
        """Close at once because a store failed: the outbox is dropped (nothing unflushed
        or unwritten reaches the producer side), a waiting reader wakes to `ClosedError`."""
        self._closed = True
        self._outbox = []
        self._timers.cancel_all()
        self._wake_reader()

    def _check_can_receive(self) -> None:
        super()._check_can_receive()
        if self._waiter is not None:
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
                msg = f"Consumer: nothing delivered within {timeout} s"
                raise DeliveryTimeout(msg)
        waiter = _Waiter(loop.create_future())
        self._waiter = waiter
        try:
            if self._inbox:
                return
            if remaining is None:
                await waiter.future
            else:
                try:
                    async with asyncio.timeout(remaining):
                        await waiter.future
                except TimeoutError:
                    msg = f"Consumer: nothing delivered within {timeout} s"
                    raise DeliveryTimeout(msg) from None
        finally:
            self._waiter = None
        self._check_open()

    def _wake_reader(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            waiter.woken = True
            wake(waiter.future)

    def _check_confirm(self, confirm_to: _ConfirmTo) -> None:
        """Any thread: raise unless ``confirm_to`` is the outstanding delivery's, unused."""
        self._check_open()
        outstanding = self._outstanding
        if confirm_to.used or outstanding is None or outstanding.confirm_to is not confirm_to:
            msg = (
                "Consumer: confirm() of a delivery that is not the outstanding one "
                "(already confirmed?): confirm each delivery once"
            )
            raise LocalProtocolError(msg)

    def _confirm(self, confirm_to: _ConfirmTo) -> None:
        """Any thread; the core's part runs on the loop."""
        outstanding = self._outstanding
        if (
            outstanding is not None
            and outstanding.confirm_to is confirm_to
            and not confirm_to.used
            and not self._closed
            and get_ident() == self._loop_thread
        ):
            # On the loop, the steady state (it runs once per message).
            self._outstanding = None
            effects = self._core.on_confirmed()
            if effects:  # mostly none: a Request goes out once per half window
                self._run(effects)
                self._flush()
            return
        self._check_confirm(confirm_to)
        confirm_to.used = True
        if get_ident() == self._loop_thread:
            self._confirmed()
        elif not call_in_loop(self._loop, self._confirmed_elsewhere, confirm_to):
            msg = "Consumer: its event loop is closed"
            raise ClosedError(msg)

    def _reject(self, confirm_to: _ConfirmTo, reason: str) -> None:
        """Any thread; the core's part runs on the loop."""
        self._check_confirm(confirm_to)
        if self._dead_letters is None:
            msg = (
                "Consumer: reject() needs a dead-letter destination for the messages "
                "rejected max_attempts times: pass AsyncConsumer(dead_letters=path or "
                "destination); nothing changed"
            )
            raise LocalProtocolError(msg)
        confirm_to.used = True
        if get_ident() == self._loop_thread:
            self._rejected(reason)
        elif not call_in_loop(self._loop, self._rejected_elsewhere, confirm_to, reason):
            msg = "Consumer: its event loop is closed"
            raise ClosedError(msg)

    def _rejected_elsewhere(self, confirm_to: _ConfirmTo, reason: str) -> None:
        outstanding = self._outstanding
        if self._closed or outstanding is None or outstanding.confirm_to is not confirm_to:
            return  # closed meanwhile: the producer keeps it unconfirmed
        self._rejected(reason)

    def _rejected(self, reason: str) -> None:
        self._outstanding = None
        self._run(self._core.on_rejected(reason))
        self._flush()

    def _confirmed_elsewhere(self, confirm_to: _ConfirmTo) -> None:
        """On the loop: the confirmation of a delivery confirmed on another thread."""
        outstanding = self._outstanding
        if self._closed or outstanding is None or outstanding.confirm_to is not confirm_to:
            return  # closed meanwhile: the producer keeps it unconfirmed
        self._confirmed()

    def _confirmed(self) -> None:
        self._outstanding = None
        self._run(self._core.on_confirmed())
        self._flush()

    def _flush(self) -> None:
        """Tell what the core sent, once its step is done: a producer answering at once on
        this thread must find the consumer consistent."""
        sends = self._outbox
        if sends:
            self._outbox = []
            self._told = True
            for to, message in sends:
                to.tell(message)

    def _run(self, effects: list[Effect]) -> None:
        dedup = self._dedup
        for effect in effects:
            if type(effect) is Send:
                if effect.to is self._ready:
                    self._ready.deliveries.append(effect.message)
                else:
                    if dedup is not None:  # flushed before any Request/Ack is told
                        self._dedup_call(dedup.before_send, effect.message)
                    self._outbox.append((effect.to, effect.message))
            elif type(effect) is StartTimer:
                self._timers.start(effect.key, effect.interval)
            elif type(effect) is CancelTimer:
                self._timers.cancel(effect.key)
            elif type(effect) is Stop:
                self._timers.cancel_all()
            elif type(effect) is RecordConfirmed and dedup is not None:
                self._dedup_call(dedup.record, effect.producer_id, effect.seq_nr)
            elif type(effect) is WriteDeadLetter:
                try:
                    write_dead_letter(self._dead_letters, effect)
                except DeadLetterError as error:
                    self._dead_letter_error = error
                    self._break()
                    raise
