"""`Consumer`: reliable receiving for code that is not an actor.

The handle runs a `ConsumerSession` (session/consumer.py) inline in the application's
thread, under a lock: this module only waits. The producer side's messages are appended to
the session's inbox by whatever thread delivers them (no lock, no wake-up unless the
application is waiting); `receive` and iteration take them one at a time through the
session, and ``delivery.confirm()`` is a direct call into it. A batch that arrives at once
is therefore consumed with no thread hop per message.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from pykka_delivery import _observed
from pykka_delivery.delivery.core.consumer import ConsumerSnapshot, ConsumerStats
from pykka_delivery.delivery.core.settings import ConsumerControllerSettings
from pykka_delivery.delivery.messages import CONFIRMED, Delivery, Rejected
from pykka_delivery.delivery.registry import ServiceRegistry, default_registry
from pykka_delivery.delivery.session.consumer import (
    ConsumerSession,
    Sends,
    nothing_ready,
)
from pykka_delivery.delivery.stores.dead_letters import DeadLetterDestination
from pykka_delivery.delivery.stores.dedup import DedupStore
from pykka_delivery.delivery.stores.dedup_tx import transactional
from pykka_delivery.delivery.timers import Timers, TimerService
from pykka_delivery.errors import ClosedError
from pykka_delivery.protocol.messages import Ref
from pykka_delivery.protocol.serialization import Serialization

__all__ = ["Consumer"]


class _Endpoint:
    """The consumer's address for the producer side: append, wake the reader if waiting."""

    __slots__ = ("_consumer", "_inbox")

    def __init__(self, consumer: Consumer, inbox: deque[Any]) -> None:
        self._consumer = consumer
        self._inbox = inbox

    def __repr__(self) -> str:
        return "Consumer()"

    def tell(self, message: Any) -> None:
        self._inbox.append(message)
        consumer = self._consumer
        if consumer._waiting:
            with consumer._lock:
                consumer._arrived.notify()

    def tell_many(self, messages: list[Any]) -> None:
        """A whole batch from a transport: one append, at most one wake-up."""
        self._inbox.extend(messages)
        consumer = self._consumer
        if consumer._waiting:
            with consumer._lock:
                consumer._arrived.notify()

    tell_runs = tell_many  # runs stay whole: the session delivers from them (TakesRuns)


class _ConfirmTo:
    """``Delivery.confirm_to`` of one delivery: answering is a direct call into the
    session, on any thread, and a second answer of the same delivery is told apart from
    the next one's.

    Each `Consumer` makes its own subclass naming its lock and session, so that one is
    made per delivery without an ``__init__`` call: it is made for every message.
    """

    __slots__ = ()
    _lock: threading.Lock
    _session: ConsumerSession

    def tell(self, message: Any) -> None:
        lock = self._lock
        lock.acquire()  # not `with`: this runs for every message, and `with` costs more
        try:
            if message is CONFIRMED or type(message) is not Rejected:
                sends = self._session.confirm(self)
            else:
                sends = self._session.reject(self, message.reason)
        finally:
            lock.release()
        if sends:
            _tell_all(sends)


def _confirm_to_class(lock: threading.Lock) -> type[_ConfirmTo]:
    return type("_ConfirmTo", (_ConfirmTo,), {"__slots__": (), "_lock": lock})


class Consumer:
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
            `ClosedError`); nothing unflushed is confirmed to the producer side. A
            `SqliteTxDedupStore` makes the effect exactly once: apply it in `transaction`.
        dead_letters: where a message goes once it was rejected
            (``delivery.reject(reason)``) ``settings.max_attempts`` times: a
            `DeadLetterDestination`, the path of an SQLite file for a
            `SqliteDeadLetters`, or a ``postgresql://`` URL for a ``PostgresDeadLetters``,
            that this handle owns (closed with it). None (the default):
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
        epoch: the fencing epoch of this activation, from a coordinator (0, the default:
            none). It goes with the registration, Requests and Acks; a producer that
            serves a newer epoch answers `Fenced`, after which nothing more is delivered
            or confirmed and every call (``receive``, ``confirm``, iteration) raises
            `ConsumerFenced`. Above 0, a ``dedup_store`` with a ``fence`` method is
            fenced with it here, before its positions are loaded; a write it refuses
            later fences the consumer the same way.

    Connect it with `register_to` (or let a producer call ``register_consumer(consumer.ref)``).
    Retries on silence are sent while the application waits in `receive`.

    Raises:
        DedupStoreError: the deduplication store could not be loaded.
        ConsumerFenced: the deduplication store holds a newer epoch already.
        TypeError, ValueError: ``epoch`` is not an int >= 0.
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
        epoch: int = 0,
    ) -> None:
        if service_key is not None and (not isinstance(service_key, str) or not service_key):
            msg = f"service_key must be a non-empty str or None, got {service_key!r}"
            raise ValueError(msg)
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._waiting = False
        inbox: deque[Any] = deque()
        endpoint = _Endpoint(self, inbox)
        self._self_ref: Ref = (
            self_ref_factory(endpoint) if self_ref_factory is not None else endpoint
        )
        # Each delivery gets its own confirm_to, so a second confirm() of an old delivery
        # cannot confirm the current one.
        confirm_to = _confirm_to_class(self._lock)
        self._session = ConsumerSession(
            self._self_ref,
            settings,
            name="Consumer",
            timers=Timers(endpoint.tell, timer_service),
            inbox=inbox,
            serialization=serialization,
            new_confirm_to=confirm_to,
            dedup_store=dedup_store,
            dead_letters=dead_letters,
            on_end=self._arrived.notify_all,  # called with the lock held
            epoch=epoch,
        )
        confirm_to._session = self._session
        self._dedup_store = dedup_store
        with self._lock:
            self._session.start()
        _observed.observe(_observed.CONSUMER, self)
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
            self._session.register_to(producer_controller)
            sends = self._session.take_outbox()
        if sends:
            _tell_all(sends)

    def receive(self, timeout: float | None = None) -> Delivery:
        """The next delivery, waiting for it if needed. Confirm it before the next call.

        Raises:
            DeliveryTimeout: nothing arrived within ``timeout`` seconds.
            ClosedError: the consumer was closed, or stopped after `deliver_then_stop`.
            LocalProtocolError: the previous delivery is not confirmed yet.
        """
        session = self._session
        deadline = None
        while True:
            with self._lock:
                delivery = session.poll()
                if delivery is None and not session.outbox:
                    session.check_not_stopped()
                    if deadline is None and timeout is not None:
                        deadline = time.monotonic() + timeout
                    self._wait(deadline, timeout)
                sends = session.take_outbox()
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
            delivery = self._session.poll()
            sends = self._session.take_outbox()
        if sends:
            _tell_all(sends)
        if delivery is None:
            raise nothing_ready()
        return delivery

    def __iter__(self) -> Iterator[Delivery]:
        """Deliveries until the consumer is closed or stopped."""
        session = self._session
        poll = session.poll
        acquire = self._lock.acquire
        release = self._lock.release
        while True:
            acquire()  # not `with`: it costs more, once per message
            try:
                delivery = poll()
                sends = session.take_outbox() if session.outbox else None
            except ClosedError:
                return
            finally:
                release()
            if sends:
                _tell_all(sends)
            if delivery is None:
                try:
                    delivery = self.receive()
                except ClosedError:
                    return
            yield delivery

    def transaction(self, conn: Any, delivery: Delivery) -> contextlib.AbstractContextManager[Any]:
        """``with consumer.transaction(conn, delivery): apply(conn, delivery.message)``:
        the effect and ``delivery``'s position commit together on the application's
        connection, for exactly-once effect (`TxDedupStore.transaction`; the handle's
        ``dedup_store`` must be a `SqliteTxDedupStore` or another `TxDedupStore`).
        Confirm the delivery after the block.

        Raises:
            TypeError: the handle has no transactional deduplication store.
        """
        return transactional(self._dedup_store, "Consumer").transaction(conn, delivery)

    def deliver_then_stop(self) -> None:
        """Stop once every message received so far is delivered and confirmed; iteration
        then ends."""
        with self._lock:
            self._session.deliver_then_stop()
            self._arrived.notify_all()
            sends = self._session.take_outbox()
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
                try:
                    self._session.close()
                finally:
                    self._arrived.notify_all()
                sends = self._session.take_outbox()
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
            return self._session.snapshot()

    def statistics(self) -> ConsumerStats:
        with self._lock:
            return self._session.statistics()

    def _leave_service(self) -> None:
        """Deregister from the service key, once (not under the lock: a registry may call
        its listeners, or wait for the coordinator)."""
        with self._lock:
            registry, self._registry = self._registry, None
        if registry is not None:
            assert self._service_key is not None
            registry.deregister(self._service_key, self._self_ref)

    def _wait(self, deadline: float | None, timeout: float | None) -> None:
        """With the lock held: wait for the inbox to fill. Announce the wait first, then
        look once more: a message appended after that look finds ``_waiting`` set and
        notifies us."""
        self._waiting = True
        try:
            if self._session.inbox:
                return
            if deadline is None:
                self._arrived.wait()
            else:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise self._session.nothing_delivered(timeout)
                self._arrived.wait(remaining)
        finally:
            self._waiting = False
        self._session.check_open()


def _tell_all(sends: Sends) -> None:
    """Tell what the core sent, outside the lock: a producer answering at once on this
    thread must find our lock free."""
    for to, message in sends:
        to.tell(message)
