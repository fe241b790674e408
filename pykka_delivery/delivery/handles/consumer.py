"""`Consumer`: reliable receiving for code that is not an actor.

The handle runs a `ConsumerCore` inline in the application's thread. The producer side's
messages are appended to an inbox by whatever thread delivers them (no lock, no wake-up
unless the application is waiting); `receive` takes them one at a time through the core,
and ``delivery.confirm()`` is a direct call into the core. A batch that arrives at once is
therefore consumed with no thread hop per message.

Messages are fed to the core only when it can deliver (never while a delivery awaits
confirmation), so the core's stash stays empty and the inbox is the buffer; the producer
side never sends more than the flow-control window, so it stays bounded.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
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
from pykka_delivery.delivery.core.settings import ConsumerControllerSettings
from pykka_delivery.delivery.handles._parts import DeliveryFeed, ReadyDeliveries
from pykka_delivery.delivery.messages import CONFIRMED, Delivery, Rejected
from pykka_delivery.delivery.registry import ServiceRegistry, default_registry
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

__all__ = ["Consumer"]


class _Endpoint:
    """The consumer's address for the producer side: append, wake the reader if waiting."""

    __slots__ = ("_consumer",)

    def __init__(self, consumer: Consumer) -> None:
        self._consumer = consumer

    def __repr__(self) -> str:
        return "Consumer()"

    def tell(self, message: Any) -> None:
        consumer = self._consumer
        consumer._inbox.append(message)
        if consumer._waiting:
            with consumer._lock:
                consumer._arrived.notify()

    def tell_many(self, messages: list[Any]) -> None:
        """A whole batch from a transport: one append, at most one wake-up."""
        consumer = self._consumer
        consumer._inbox.extend(messages)
        if consumer._waiting:
            with consumer._lock:
                consumer._arrived.notify()

    tell_runs = tell_many  # runs stay whole: the handle delivers from them (TakesRuns)


class _ConfirmTo:
    """``Delivery.confirm_to`` of one delivery: confirming is a direct call, on any thread,
    and a second confirmation of the same delivery is told apart from the next one's.

    Each `Consumer` makes its own subclass naming it (`_confirm_to_class`), so that one
    is made per delivery without an ``__init__`` call: it is made for every message.
    """

    __slots__ = ()
    _consumer: Consumer

    def tell(self, message: Any) -> None:
        if message is CONFIRMED:
            self._consumer._confirm(self)
        elif type(message) is Rejected:
            self._consumer._reject(self, message.reason)
        else:
            self._consumer._confirm(self)


def _confirm_to_class(consumer: Consumer) -> type[_ConfirmTo]:
    return type("_ConfirmTo", (_ConfirmTo,), {"__slots__": (), "_consumer": consumer})


class Consumer(DeliveryFeed):
    """Receives one producer's messages reliably, in order, one at a time.

    Use it as an iterator, confirming each delivery when it is processed::

        for delivery in consumer:
            handle(delivery.message)
            delivery.confirm()

    Args:
        settings: see `ConsumerControllerSettings`.
        serialization: for chunked messages; default `default_serialization`.
        timer_service: default: the process-wide one.
        self_ref_factory: builds the ref the other side uses to reach this handle from
            its local endpoint (a transport's remote address, or a fault injector in tests).
        dedup_store: turns on deduplication across restarts (dedup.py): positions are
            loaded from it here, each ``confirm()`` records one, and the store is flushed
            before every Request/Ack and on `close`. The caller owns the store (closes it
            after this handle). If the store keeps failing, the call that met the failure
            raises `DedupStoreError` and the handle closes itself (later calls raise
            `ClosedError`); nothing unflushed is confirmed to the producer side.
        dead_letters: where a message goes once it was rejected
            (``delivery.reject(reason)``) ``settings.max_attempts`` times: a
            `DeadLetterDestination`, or the path of an SQLite file for a
            `SqliteDeadLetters` this handle owns (closed with it). None (the default):
            ``reject`` raises `LocalProtocolError`, since a rejected message would have
            nowhere to go. If the destination fails, ``reject`` raises `DeadLetterError`
            and the handle closes itself (the message stays unconfirmed at the producer).
        service_key: makes this consumer a worker of the work-pulling producers of that
            key (Akka's ``ConsumerController(serviceKey)``): its ref is registered under
            the key in ``registry`` here, and deregistered by `close` after the last
            confirmations went out. None (the default): no registration.
        registry: where to register; default: the process-wide `default_registry()`;
            across processes a `CoordinatorServiceRegistry` (then expose the consumer
            with ``self_ref_factory=node.expose(name)``).

    Connect it with `register_to` (or let a producer call ``register_consumer(consumer.ref)``).
    Retries on silence are sent while the application waits in `receive`.

    Raises:
        DedupStoreError: the deduplication store could not be loaded.
        ValueError: an empty ``service_key``.
        Exception: what ``registry.register`` raised (the consumer is closed then), e.g.
            `TypeError` from a `CoordinatorServiceRegistry` for a consumer not exposed on
            a transport node.
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
        service_key: str | None = None,
        registry: ServiceRegistry | None = None,
    ) -> None:
        if service_key is not None and (not isinstance(service_key, str) or not service_key):
            msg = f"service_key must be a non-empty str or None, got {service_key!r}"
            raise ValueError(msg)
        settings = settings or ConsumerControllerSettings()
        self._dead_letters, self._owns_dead_letters = dead_letter_destination(dead_letters)
        self._dead_letter_error: DeadLetterError | None = None
        self._dedup = None if dedup_store is None else DedupWriter(dedup_store, settings)
        positions = None if self._dedup is None else self._dedup.load()
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._inbox: deque[Any] = deque()
        self._waiting = False
        self._closed = False
        self._outstanding: Delivery | None = None
        self._outbox: list[tuple[Ref, Any]] = []  # told only after the lock is released
        self._endpoint = _Endpoint(self)
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
        with self._lock:
            self._run(self._core.on_spawned())
            self._run(self._core.on_start(self._ready))
        self._service_key = service_key
        self._registry: ServiceRegistry | None = None
        if service_key is not None:
            registry = registry if registry is not None else default_registry()
            try:
                registry.register(service_key, self._self_ref)
            except BaseException:
                self.close()  # its timers, and an owned dead-letter store
                raise
            self._registry = registry

    @property
    def ref(self) -> Ref:
        """Where the producer side sends to (this consumer's "consumer controller")."""
        return self._self_ref

    def register_to(self, producer_controller: Ref) -> None:
        """Connect to ``producer_controller`` (a `Producer`'s ref, a producer controller
        actor, or a remote reference); repeated until its first message arrives."""
        with self._lock:
            self._check_open()
            self._run(self._core.on_register_to(producer_controller))
            sends = self._take_outbox()
        if sends:
            _tell_all(sends)

    def receive(self, timeout: float | None = None) -> Delivery:
        """The next delivery, waiting for it if needed. Confirm it before the next call.

        Raises:
            DeliveryTimeout: nothing arrived within ``timeout`` seconds.
            ClosedError: the consumer was closed, or stopped after `deliver_then_stop`.
            LocalProtocolError: the previous delivery is not confirmed yet.
        """
        deadline = None
        while True:
            with self._lock:
                if self._closed or self._outstanding is not None:
                    self._check_can_receive()
                delivery = self._next_ready()
                if delivery is None and not self._outbox:
                    if self._core.is_stopped:
                        msg = "Consumer stopped after delivering every message (deliver_then_stop)"
                        raise ClosedError(msg)
                    if deadline is None and timeout is not None:
                        deadline = time.monotonic() + timeout
                    self._wait(deadline, timeout)
                sends = self._take_outbox()
            if sends:
                _tell_all(sends)
            if delivery is not None:
                return delivery

    def receive_nowait(self) -> Delivery:
        """The next delivery if one is here already.

        Raises:
            WouldBlock: none is ready.
        """
        with self._lock:
            self._check_can_receive()
            delivery = self._next_ready()
            sends = self._take_outbox()
        if sends:
            _tell_all(sends)
        if delivery is None:
            msg = "Consumer has no delivery ready"
            raise WouldBlock(msg)
        return delivery

    def __iter__(self) -> Iterator[Delivery]:
        """Deliveries until the consumer is closed or stopped."""
        lock = self._lock
        inbox = self._inbox
        ready = self._ready.deliveries
        next_run_delivery = self._core.next_run_delivery
        acquire = lock.acquire
        release = lock.release
        while True:
            # The steady state over a transport, inlined (it runs once per message): the
            # next message of the run at the head of the inbox is the next delivery.
            delivery = None
            acquire()  # not `with`: it costs more, once per message
            try:
                if (
                    inbox
                    and type(inbox[0]) is SequencedRun
                    and self._outstanding is None
                    and not self._closed
                    and not ready
                    and not self._outbox
                ):
                    head = inbox[0]
                    delivery = next_run_delivery(head)
                    if delivery is not None:
                        if head.seq_nr == head.last_seq_nr:
                            inbox.popleft()
                        self._outstanding = delivery
            finally:
                release()
            if delivery is None:
                try:
                    delivery = self.receive()
                except ClosedError:
                    return
            yield delivery

    def deliver_then_stop(self) -> None:
        """Stop once every message received so far is delivered and confirmed; iteration
        then ends."""
        with self._lock:
            self._check_open()
            # What already arrived counts as received: take it into the core first.
            while self._inbox:
                self._feed(self._inbox.popleft())
            self._run(self._core.on_deliver_then_stop())
            self._arrived.notify_all()
            sends = self._take_outbox()
        if sends:
            _tell_all(sends)

    def close(self) -> None:
        """Stop now; tells the producer side what is confirmed (unconfirmed messages stay
        with the producer, to be delivered to the next consumer).

        Raises:
            DedupStoreError: the deduplication store could not be flushed (nothing was
                told to the producer side; the handle is closed all the same).
        """
        try:
            with self._lock:
                if self._closed:
                    return
                self._closed = True
                try:
                    self._run(self._core.on_stopped())
                    if self._dedup is not None:
                        self._dedup_call(self._dedup.flush)
                finally:
                    self._timers.cancel_all()
                    self._arrived.notify_all()
                    if self._owns_dead_letters:
                        self._dead_letters.close()  # type: ignore[union-attr] # owned: SQLite
                sends = self._take_outbox()
            if sends:
                _tell_all(sends)
        finally:
            # After the last Ack above: a work-pulling producer takes it in before it
            # hands this worker's unconfirmed messages to the others (fewer duplicates).
            # Also when the handle had closed itself (a failed store): it is no worker now.
            self._leave_service()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def snapshot(self) -> ConsumerSnapshot:
        with self._lock:
            return self._core.snapshot()

    def statistics(self) -> ConsumerStats:
        with self._lock:
            return self._core.statistics()

    def _leave_service(self) -> None:
        """Deregister from the service key, once (not under the lock: a registry may call
        its listeners, or wait for the coordinator)."""
        with self._lock:
            registry, self._registry = self._registry, None
        if registry is not None:
            assert self._service_key is not None
            registry.deregister(self._service_key, self._self_ref)

    # --- internals (call with the lock held) ------------------------------------------

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
        self._arrived.notify_all()

    def _wait(self, deadline: float | None, timeout: float | None) -> None:
        """Wait for the inbox to fill. Announce the wait first, then look once more: a
        message appended after that look finds ``_waiting`` set and notifies us."""
        self._waiting = True
        try:
            if self._inbox:
                return
            if deadline is None:
                self._arrived.wait()
            else:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    msg = f"Consumer: nothing delivered within {timeout} s"
                    raise DeliveryTimeout(msg)
                self._arrived.wait(remaining)
        finally:
            self._waiting = False
        self._check_open()

    def _confirm(self, confirm_to: _ConfirmTo) -> None:
        lock = self._lock
        lock.acquire()  # not `with`: this runs for every message, and `with` costs more
        try:
            if self._closed:
                self._check_open()
            outstanding = self._outstanding
            if outstanding is None or outstanding.confirm_to is not confirm_to:
                msg = (
                    "Consumer: confirm() of a delivery that is not the outstanding one "
                    "(already confirmed?): confirm each delivery once"
                )
                raise LocalProtocolError(msg)
            self._outstanding = None
            effects = self._core.on_confirmed()
            if effects:  # mostly none: a Request goes out once per half window
                self._run(effects)
            sends = self._outbox
            if sends:
                self._outbox = []
        finally:
            lock.release()
        if sends:
            _tell_all(sends)

    def _reject(self, confirm_to: _ConfirmTo, reason: str) -> None:
        with self._lock:
            if self._closed:
                self._check_open()
            outstanding = self._outstanding
            if outstanding is None or outstanding.confirm_to is not confirm_to:
                msg = (
                    "Consumer: reject() of a delivery that is not the outstanding one "
                    "(already confirmed or rejected?): answer each delivery once"
                )
                raise LocalProtocolError(msg)
            if self._dead_letters is None:
                msg = (
                    "Consumer: reject() needs a dead-letter destination for the messages "
                    "rejected max_attempts times: pass Consumer(dead_letters=path or "
                    "destination); nothing changed"
                )
                raise LocalProtocolError(msg)
            self._outstanding = None
            self._run(self._core.on_rejected(reason))
            sends = self._take_outbox()
        if sends:
            _tell_all(sends)

    def _take_outbox(self) -> list[tuple[Ref, Any]]:
        sends = self._outbox
        if sends:
            self._outbox = []
        return sends

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
                self._write_dead_letter(effect)

    def _write_dead_letter(self, effect: WriteDeadLetter) -> None:
        """Write it before the confirmation that follows it goes anywhere; if that fails,
        close at once (dropping the outbox) and raise."""
        try:
            write_dead_letter(self._dead_letters, effect)
        except DeadLetterError as error:
            self._dead_letter_error = error
            self._break()
            raise


def _tell_all(sends: list[tuple[Ref, Any]]) -> None:
    """Tell what the core sent, outside the lock: a producer answering at once on this
    thread must find our lock free."""
    for to, message in sends:
        to.tell(message)
