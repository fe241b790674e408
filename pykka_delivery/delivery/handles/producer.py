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

The protocol is the `ProducerSession`'s (delivery/session/producer.py); this module and
handles/_blocking.py are only the waiting around it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pykka_delivery import _observed
from pykka_delivery.delivery.core.producer import ProducerSnapshot, ProducerStats
from pykka_delivery.delivery.core.settings import ProducerControllerSettings
from pykka_delivery.delivery.handles._blocking import BlockingProducer
from pykka_delivery.delivery.session.producer import ProducerSession
from pykka_delivery.delivery.stores.calls import wall_clock_millis
from pykka_delivery.delivery.stores.durable_queue import DurableProducerQueue
from pykka_delivery.delivery.timers import Timers, TimerService
from pykka_delivery.protocol.messages import Ref, RegisterConsumer
from pykka_delivery.protocol.serialization import Serialization

__all__ = ["Producer"]


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


class Producer(BlockingProducer[ProducerSession]):
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
        self.producer_id = producer_id
        self._endpoint = _Endpoint(self)
        self._self_ref: Ref = (
            self_ref_factory(self._endpoint) if self_ref_factory is not None else self._endpoint
        )
        session = ProducerSession.for_handle(
            producer_id,
            self._self_ref,
            Timers(self._endpoint.tell, timer_service),
            settings=settings,
            serialization=serialization,
            durable_queue=durable_queue,
            clock_millis=clock_millis,
            on_failure=self._on_failure,
        )
        self._open(session)
        self._core = session.core
        _observed.observe(_observed.PRODUCER, self)

    @property
    def ref(self) -> Ref:
        """Where the consumer side reaches this producer (its "producer controller")."""
        return self._self_ref

    def register_consumer(self, consumer_controller: Ref) -> None:
        """Deliver to ``consumer_controller`` (a `Consumer`'s ref, a consumer controller
        actor, or a remote reference). A later call moves the stream to another consumer,
        resending what is unconfirmed.

        Raises:
            ClosedError: the producer was closed.
        """
        with self._lock:
            self._session.check_open()
        self._inbound(RegisterConsumer(consumer_controller))

    def send(self, message: Any, timeout: float | None = None) -> int:
        """Send ``message`` once the consumer has room for it; returns its seq_nr.

        Raises:
            DeliveryTimeout: no demand within ``timeout`` seconds (nothing was sent).
            ClosedError: the producer was closed.
            SerializationError: the consumer side is in another process (or the durable
                queue stores bytes) and its serializers cannot encode ``message``: nothing
                was sent, and the next message takes this one's seq_nr.
            DurableQueueError: storing it failed every attempt (the producer is closed).
        """
        lock = self._lock
        lock.acquire()  # not `with`: this runs for every message, and `with` costs more
        try:
            session = self._session
            seq_nr = None if self._inbox or session.closed else session.try_send(message)
            if seq_nr is None:
                self._wait_for(self._has_demand, timeout, session.DEMAND_TO_SEND)
                seq_nr = session.send(message)
        finally:
            lock.release()
        if self._inbox:
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
            self._wait_for(self._has_demand, timeout, self._session.DEMAND_TO_SEND)
        self._after_release()

    def snapshot(self) -> ProducerSnapshot:
        with self._lock:
            return self._session.snapshot()

    def statistics(self) -> ProducerStats:
        with self._lock:
            return self._session.statistics()
