"""`FanInConsumer`: one consumer per producer id, behind one ref.

Why: a `Consumer` follows one producer session at a time. A `SequencedMessage` of another
producer makes it associate with that producer instead (consumer_core.py,
``_changed_producer``), so two producers sending to one `Consumer` would take it from each
other in turn. A worker that serves many producers at once, and one after the other (each
Spark task is a `WorkPullingProducer` with a producer id of its own, sending rows to the
workers of a service key), needs one consumer per producer.

Theory of operation (Akka's ``ShardingConsumerController`` plays this part for sharded
entities; this is our own design for the handles):

* The fan-in has one endpoint, and one ref built from it (``self_ref_factory``, e.g. a
  transport node's ``expose``). Producers send to that ref, or find it under
  ``service_key`` in a registry.
* Routing: each `SequencedMessage` goes to the `Consumer` of its ``producer_id``, created
  the first time that id is seen. A batch from a transport (``tell_many``) is split per
  producer id, keeping the order inside each, and handed on with one ``tell_many`` per
  producer id. Routing runs on the sender's (the transport's) thread: a dict lookup and
  an append under the fan-in's lock, no I/O; creating a consumer (which may read a
  deduplication store) is left to that producer's own thread, which takes the messages
  that arrived meanwhile in order. `PeerLinkChanged` (what a transport node tells every
  exposed ref) goes to every live consumer; anything else is logged and dropped.
* Each producer id has a thread: ``receive`` -> ``handler(delivery)`` -> confirm. A
  handler that raises is called again with the same delivery after a backoff, so nothing
  is skipped. Hence: **each producer's messages are handled in order, one at a time; the
  producers' messages concurrently**, one thread each.
* Idle: when nothing arrived for that producer within ``idle_timeout``, its consumer is
  detached (routing hands it nothing more: routing and detaching share the fan-in's lock,
  and a message that arrived during the last wait keeps it attached) and closed, which
  tells the producer what is confirmed; then the producer id leaves the routing table.
  What arrives while it closes waits, and goes to a new consumer created after the old
  one's last `Ack` went out. If the producer sends later, a new consumer is created too;
  it meets the session midway, asks for ``Resend(0)``, and the producer resends what is
  unconfirmed, the first marked first (consumer_core.py, P10): nothing is lost, the
  order is kept.
* ``max_producers`` bounds the live producer ids: a message of a new id beyond it is
  dropped with a warning and counted. A producer resends a session's first message on
  its own (``resend_first_interval``); a later one is recovered only when that producer
  sends again once a slot is free (its new consumer asks for ``Resend(0)``), so a
  producer refused after its last message waits until it sends more.
* `close` deregisters the ref from the service key first (no new work comes), then
  closes every consumer (a delivery still in its handler stays unconfirmed, with its
  producer), then waits for the threads.

Delivery is at least once, as with a `Consumer`: a message handled but not confirmed when
its consumer closed (close during the handler, or a final `Ack` lost between processes)
is delivered again. With a ``dedup_store`` every consumer of the fan-in shares it (one
position per producer id), so messages confirmed before, by this fan-in or the one it
replaces, are not delivered again.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from pykka_delivery._fields import check_field_types
from pykka_delivery.delivery.core.consumer_control import check_epoch
from pykka_delivery.delivery.core.settings import ConsumerControllerSettings
from pykka_delivery.delivery.handles._routing import split_by_producer
from pykka_delivery.delivery.handles.consumer import Consumer
from pykka_delivery.delivery.messages import Delivery
from pykka_delivery.delivery.registry import ServiceRegistry, default_registry
from pykka_delivery.delivery.stores.dedup import DedupStore
from pykka_delivery.delivery.timers import TimerService
from pykka_delivery.errors import ConsumerFenced, DeliveryError, DeliveryTimeout
from pykka_delivery.protocol.messages import Fenced, Ref
from pykka_delivery.protocol.serialization import Serialization
from pykka_delivery.retry import Backoff, Delays

__all__ = ["FanInConsumer", "FanInSettings", "FanInStats"]

logger = logging.getLogger("pykka_delivery.consumer")

_MAX_SECONDS = 86_400.0
_MAX_PRODUCERS = 10_000_000


@dataclass(frozen=True, slots=True)
class FanInSettings:
    """Settings of a `FanInConsumer`. Durations are seconds.

    Attributes:
        consumer: the settings of each producer's `Consumer` (window, retries, dedup
            store retries); None (the default): `ConsumerControllerSettings` defaults.
        idle_timeout: a producer's consumer that received nothing for this long (with no
            delivery in the handler) is closed and forgotten; it is created again if that
            producer sends later. Default 30; above 0, at most 86400.
        max_producers: the most producer ids served at once; a message of a new one
            beyond it is dropped (warning, counted in ``refused``); its producer resends
            it (module docstring: when). Default 10000; 1 to 10000000.
        retry_backoff_min: the wait before a handler that raised is called again with
            the same delivery; doubled after each further failure. Default 0.1; above 0,
            at most 3600.
        retry_backoff_max: the longest wait between two calls. Default 5; at least
            ``retry_backoff_min``, at most 3600.
        close_timeout: how long `FanInConsumer.close` waits for each producer's thread to
            end (a handler still running is not waited for longer). Default 10; 0 to 3600.
    """

    consumer: ConsumerControllerSettings | None = None
    idle_timeout: float = 30.0
    max_producers: int = 10_000
    retry_backoff_min: float = 0.1
    retry_backoff_max: float = 5.0
    close_timeout: float = 10.0

    def __post_init__(self) -> None:
        check_field_types(self)
        if self.consumer is not None and not isinstance(self.consumer, ConsumerControllerSettings):
            msg = (
                f"FanInSettings.consumer must be a ConsumerControllerSettings or None, got "
                f"{type(self.consumer).__name__}"
            )
            raise TypeError(msg)
        if type(self.max_producers) is not int or not 1 <= self.max_producers <= _MAX_PRODUCERS:
            msg = (
                f"FanInSettings.max_producers must be an int from 1 to {_MAX_PRODUCERS}, "
                f"got {self.max_producers!r}"
            )
            raise ValueError(msg)
        for name, low, high, strict in (
            ("idle_timeout", 0.0, _MAX_SECONDS, True),
            ("retry_backoff_min", 0.0, 3600.0, True),
            ("retry_backoff_max", self.retry_backoff_min, 3600.0, False),
            ("close_timeout", 0.0, 3600.0, False),
        ):
            _check_seconds(name, getattr(self, name), low, high, strict=strict)


def _check_seconds(name: str, value: object, low: float, high: float, *, strict: bool) -> None:
    ok = (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and (value > low if strict else value >= low)
        and value <= high
    )
    if not ok:
        bound = "above" if strict else "at least"
        msg = (
            f"FanInSettings.{name} must be a number of seconds {bound} {low:g} and at most "
            f"{high:g}, got {value!r}"
        )
        raise ValueError(msg)


@dataclass(frozen=True, slots=True)
class FanInStats:
    """Counters of a `FanInConsumer`, as a frozen snapshot.

    Attributes:
        handled: deliveries handled and confirmed, all producers together.
        per_producer: deliveries handled and confirmed per producer id, for every
            producer id served since the fan-in started (idle ones included).
        live_producers: producer ids with a consumer now.
        handler_failures: handler calls that raised (each called again).
        idle_closed: consumers closed because their producer was idle.
        refused: messages dropped because ``max_producers`` producer ids were live.
    """

    handled: int
    per_producer: dict[str, int]
    live_producers: int
    handler_failures: int
    idle_closed: int
    refused: int


class _Inbox(Protocol):
    """A `Consumer`'s local endpoint: it takes a batch with one call."""

    def tell(self, message: Any) -> None: ...

    def tell_many(self, messages: list[Any]) -> None: ...


class _Route:
    """One producer id's entry in the routing table: its consumer (once created), what
    arrived before that, and how many batches were routed to it (its idle check)."""

    __slots__ = ("consumer", "endpoint", "pending", "producer_id", "routed", "thread")

    def __init__(self, producer_id: str) -> None:
        self.producer_id = producer_id
        self.consumer: Consumer | None = None
        self.endpoint: _Inbox | None = None  # the consumer's local endpoint, once created
        self.pending: list[Any] = []  # arrived before the consumer was created
        self.routed = 0
        self.thread: threading.Thread | None = None


class _Endpoint:
    """The fan-in's address for the producer side (what ``self_ref_factory`` wraps)."""

    __slots__ = ("_fan_in",)

    def __init__(self, fan_in: FanInConsumer) -> None:
        self._fan_in = fan_in

    def __repr__(self) -> str:
        return f"FanInConsumer({self._fan_in.name!r})"

    def tell(self, message: Any) -> None:
        self._fan_in._route([message])

    def tell_many(self, messages: list[Any]) -> None:
        """A whole batch from a transport: split per producer id, order kept in each."""
        self._fan_in._route(messages)


class _Answered:
    """``confirm_to`` of the delivery the handler sees: forwards, and notes that the
    handler confirmed (or rejected) it itself, so the fan-in does not confirm twice."""

    __slots__ = ("answered", "target")

    def __init__(self, target: Ref) -> None:
        self.target = target
        self.answered = False

    def tell(self, message: Any) -> None:
        self.target.tell(message)
        self.answered = True


class FanInConsumer:
    """Consumes many producers' messages at one ref: one `Consumer` per producer id.

    ::

        def handle(delivery: Delivery) -> None:
            store(delivery.producer_id, delivery.message)

        with FanInConsumer(handle, service_key="rows", registry=registry) as fan_in:
            ...  # work-pulling producers of "rows" send to fan_in.ref

    Args:
        handler: called with each `Delivery`, on its producer's thread; the delivery is
            confirmed when it returns (if the handler confirmed it itself, it is not
            confirmed again). One producer's deliveries come in order, one at a time;
            different producers' at the same time. A handler that raises is called again
            with the same delivery after a backoff. ``delivery.reject`` is not available
            (no dead-letter destination): it raises, which counts as a failure.
        settings: see `FanInSettings`.
        serialization: for chunked messages; default `default_serialization`.
        timer_service: for the consumers' timers; default the process-wide one.
        self_ref_factory: builds the fan-in's ref from its local endpoint (a transport
            node's ``expose``, so producers in other processes reach it). Default: the
            endpoint itself.
        dedup_store: shared by every producer's consumer (one position per producer id):
            turns on deduplication across restarts (dedup.py). The consumers call it
            from their threads at once, which `SqliteDedupStore` and `MemoryDedupStore`
            allow (each guards itself with a lock); another implementation must too. The
            caller owns the store and closes it after this fan-in.
        service_key: registers the fan-in's ref under this key in ``registry`` (it is
            then one worker of the work-pulling producers of that key); `close`
            deregisters it first. None (the default): no registration.
        registry: where to register; default `default_registry()`.
        name: names the threads and the log lines.
        epoch: the fencing epoch of this activation (0, the default: none), given to
            every consumer it creates (see `Consumer`). A consumer that is fenced stops
            as one whose store failed; one that cannot be created because the store
            holds a newer epoch is not retried (logged as an error).

    Raises:
        ValueError: an empty ``service_key``.
        Exception: what ``registry.register`` raised (nothing was started).
    """

    def __init__(
        self,
        handler: Callable[[Delivery], None],
        settings: FanInSettings | None = None,
        *,
        serialization: Serialization | None = None,
        timer_service: TimerService | None = None,
        self_ref_factory: Callable[[Ref], Ref] | None = None,
        dedup_store: DedupStore | None = None,
        service_key: str | None = None,
        registry: ServiceRegistry | None = None,
        name: str = "fan-in",
        epoch: int = 0,
    ) -> None:
        check_epoch(epoch, "FanInConsumer")
        if service_key is not None and (not isinstance(service_key, str) or not service_key):
            msg = f"service_key must be a non-empty str or None, got {service_key!r}"
            raise ValueError(msg)
        self.name = name
        self.settings = settings = settings or FanInSettings()
        self._handler = handler
        self._serialization = serialization
        self._timer_service = timer_service
        self._dedup_store = dedup_store
        self._epoch = epoch
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._routes: dict[str, _Route] = {}
        self._threads: list[threading.Thread] = []
        self._handled: dict[str, int] = {}
        self._failures = self._idle_closed = self._refused = 0
        endpoint = _Endpoint(self)
        self._ref: Ref = self_ref_factory(endpoint) if self_ref_factory is not None else endpoint
        self._service_key = service_key
        self._registry: ServiceRegistry | None = None
        if service_key is not None:
            registry = registry if registry is not None else default_registry()
            registry.register(service_key, self._ref)
            self._registry = registry

    def __repr__(self) -> str:
        return f"FanInConsumer({self.name!r})"

    @property
    def ref(self) -> Ref:
        """Where producers send to (every producer the same ref)."""
        return self._ref

    def statistics(self) -> FanInStats:
        """The counters now (see `FanInStats`)."""
        with self._lock:
            per_producer = dict(self._handled)
            return FanInStats(
                sum(per_producer.values()),
                per_producer,
                len(self._routes),
                self._failures,
                self._idle_closed,
                self._refused,
            )

    def close(self) -> None:
        """Deregister from the service key, close every producer's consumer (each tells
        its producer what is confirmed and flushes the deduplication store), then wait up
        to ``settings.close_timeout`` for each thread. A delivery still in the handler
        stays unconfirmed, with its producer. Calling it again does nothing."""
        with self._lock:
            if self._stopping.is_set():
                return
            self._stopping.set()
            registry, self._registry = self._registry, None
        if registry is not None:
            assert self._service_key is not None
            registry.deregister(self._service_key, self._ref)
        with self._lock:
            routes = list(self._routes.values())
            self._routes.clear()
            threads = list(self._threads)
        for route in routes:
            if route.consumer is not None:  # else its thread closes it when created
                self._close_consumer(route.producer_id, route.consumer)
        deadline_each = self.settings.close_timeout
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(deadline_each)
        logger.info("%r closed", self)

    def __enter__(self) -> FanInConsumer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- routing (the sender's thread) ------------------------------------------------

    def _route(self, messages: list[Any]) -> None:
        """Hand ``messages`` on to their producers' consumers, grouped per producer id."""
        batches, links = split_by_producer(messages, self)
        with self._lock:
            if self._stopping.is_set():
                return  # closed: the producers keep what is unconfirmed
            for producer_id, batch in batches.items():
                route = self._routes.get(producer_id)
                if route is None and any(type(m) is not Fenced for m in batch):
                    route = self._open_route(producer_id, batch)  # not for a Fenced alone
                if route is None:
                    continue
                route.routed += 1
                # Under the lock, so that nothing reaches a consumer after it left the
                # table (see _serve). Cheap: an append, at most a wake-up.
                if route.endpoint is not None:
                    route.endpoint.tell_many(batch)
                else:
                    route.pending.extend(batch)
            if links:
                for route in self._routes.values():
                    if route.endpoint is not None:
                        route.endpoint.tell_many(links)

    def _open_route(self, producer_id: str, batch: list[Any]) -> _Route | None:
        """With the lock held: a new producer id's entry and thread (the thread creates its
        consumer), or None when ``max_producers`` are live (the batch is dropped)."""
        if len(self._routes) >= self.settings.max_producers:
            self._refused += len(batch)
            logger.warning(
                "%r: producer %r refused, %d producer ids are live already (max_producers); "
                "dropped %d message(s), its producer resends them later",
                self,
                producer_id,
                len(self._routes),
                len(batch),
            )
            return None
        route = _Route(producer_id)
        self._routes[producer_id] = route
        self._handled.setdefault(producer_id, 0)
        route.thread = threading.Thread(
            target=self._serve, args=(route,), name=f"{self.name}-{producer_id}", daemon=True
        )
        self._threads = [t for t in self._threads if t.is_alive()]
        self._threads.append(route.thread)
        route.thread.start()
        return route

    # --- one producer's thread ----------------------------------------------------------

    def _serve(self, route: _Route) -> None:
        """A producer id's thread: create its consumer, handle its deliveries until it is
        idle (or broke), close it, and leave the routing table; or, if messages arrived
        while it closed, start over with a new consumer."""
        while True:
            consumer = self._create(route)
            if consumer is None or not self._consume(route, consumer):
                return
            # Detached: what arrives now waits in route.pending. The old consumer's last
            # Ack goes out here, before a new consumer can ask the producer to resend.
            self._close_consumer(route.producer_id, consumer)
            with self._lock:
                if self._stopping.is_set():
                    return
                if not route.pending:
                    del self._routes[route.producer_id]
                    return

    def _consume(self, route: _Route, consumer: Consumer) -> bool:
        """Handle ``consumer``'s deliveries. True once it is detached from the route
        (idle, or closed itself because its store failed): the caller closes it. False
        when the fan-in closes (`close` closes it)."""
        while True:
            with self._lock:
                seen = route.routed
            try:
                delivery = consumer.receive(timeout=self.settings.idle_timeout)
            except DeliveryTimeout:
                with self._lock:
                    if self._stopping.is_set():
                        return False
                    if route.routed != seen:
                        continue  # something arrived during the wait: not idle
                    self._detach(route)
                    self._idle_closed += 1
                logger.debug(
                    "%r: producer %r idle for %.3g s, closing its consumer",
                    self,
                    route.producer_id,
                    self.settings.idle_timeout,
                )
                return True
            except DeliveryError as error:  # closed by close(), or its store failed
                with self._lock:
                    if self._stopping.is_set():
                        return False
                    self._detach(route)
                logger.error(
                    "%r: the consumer of producer %r stopped (%s); the next message of that "
                    "producer starts a new one",
                    self,
                    route.producer_id,
                    error,
                )
                return True
            if not self._handle(route.producer_id, delivery):
                return False

    @staticmethod
    def _detach(route: _Route) -> None:
        """With the lock held: route nothing more to the route's consumer. The route stays
        in the table, so that a message of its producer waits in ``pending`` instead of
        creating a second consumer while this one closes."""
        route.consumer = None
        route.endpoint = None

    def _create(self, route: _Route) -> Consumer | None:
        """Create the producer's consumer (retried with backoff while it fails, say a
        deduplication store that cannot load), then hand it what arrived meanwhile.
        None if the fan-in closed first, or the consumer is fenced."""
        delays = self._retry_delays()
        captured: list[_Inbox] = []

        def capture(endpoint: Ref) -> Ref:
            captured.append(endpoint)  # type: ignore[arg-type] # the Consumer's _Endpoint
            return self._ref

        while True:
            captured.clear()
            try:
                consumer = Consumer(
                    self.settings.consumer,
                    serialization=self._serialization,
                    timer_service=self._timer_service,
                    self_ref_factory=capture,
                    dedup_store=self._dedup_store,
                    epoch=self._epoch,
                )
                break
            except ConsumerFenced as error:  # a newer activation took over: trying won't help
                logger.error("%r: producer %r: %s", self, route.producer_id, error)
                return None
            except DeliveryError as error:
                with self._lock:
                    self._failures += 1
                delay = next(delays)
                logger.warning(
                    "%r: creating the consumer of producer %r failed (%s); trying again in %.3g s",
                    self,
                    route.producer_id,
                    error,
                    delay,
                )
                if self._stopping.wait(delay):
                    return None
        with self._lock:
            if not self._stopping.is_set():
                route.consumer, route.endpoint = consumer, captured[0]
                pending, route.pending = route.pending, []
                if pending:
                    route.endpoint.tell_many(pending)
                return consumer
        consumer.close()  # the fan-in closed meanwhile
        return None

    def _retry_delays(self) -> Delays:
        """The waits before creating a consumer, or calling a handler, again."""
        return Backoff(self.settings.retry_backoff_min, self.settings.retry_backoff_max).delays()

    def _handle(self, producer_id: str, delivery: Delivery) -> bool:
        """Call the handler until it returns, then confirm (unless it did); False if the
        fan-in closed meanwhile or the confirmation failed (the delivery stays
        unconfirmed, with its producer)."""
        delays: Delays | None = None  # made at the first failure: this runs per delivery
        while True:
            answered = _Answered(delivery.confirm_to)
            seen = Delivery(
                delivery.message, answered, delivery.producer_id, delivery.seq_nr, delivery.attempt
            )
            try:
                self._handler(seen)
                break
            except Exception as error:  # logged, counted, called again
                with self._lock:
                    self._failures += 1
                if answered.answered:  # it confirmed, then raised: done with this delivery
                    logger.warning(
                        "%r: the handler raised on producer %r seq_nr %d after confirming "
                        "it (%s: %s); not calling it again",
                        self,
                        producer_id,
                        delivery.seq_nr,
                        type(error).__name__,
                        error,
                    )
                    break
                if delays is None:
                    delays = self._retry_delays()
                delay = next(delays)
                logger.warning(
                    "%r: the handler failed on producer %r seq_nr %d (%s: %s); calling it "
                    "again in %.3g s",
                    self,
                    producer_id,
                    delivery.seq_nr,
                    type(error).__name__,
                    error,
                    delay,
                )
                if self._stopping.wait(delay):
                    return False
        if not answered.answered and not self._confirm(producer_id, delivery):
            return not self._stopping.is_set()  # if not closing, the next receive raises
        with self._lock:
            self._handled[producer_id] = self._handled.get(producer_id, 0) + 1
        return True

    def _confirm(self, producer_id: str, delivery: Delivery) -> bool:
        """Confirm for the handler; False if that failed (closed, or a store gave up)."""
        try:
            delivery.confirm()
        except DeliveryError as error:
            if not self._stopping.is_set():
                logger.error(
                    "%r: confirming producer %r seq_nr %d failed: %s",
                    self,
                    producer_id,
                    delivery.seq_nr,
                    error,
                )
            return False
        return True

    def _close_consumer(self, producer_id: str, consumer: Consumer) -> None:
        try:
            consumer.close()
        except DeliveryError as error:
            logger.error(
                "%r: closing the consumer of producer %r failed: %s", self, producer_id, error
            )
