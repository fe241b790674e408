"""`MergedConsumer`: several producers' streams consumed at one ref, one delivery at a time,
following a `ProducerSet` (handles/producer_set.py, re-exported here).

Why: a `Consumer` follows one producer session at a time (a second producer takes it
over: consumer_core ``_changed_producer``), so consuming every producer of a stream at
once needs one consumer session per producer id. `FanInConsumer` does that with a thread
and a handler per producer; here the application pulls (`MergedConsumer.receive`, then
confirm) on one thread, and sees one delivery at a time, whichever producer it is from.

Theory of operation:

* One `ConsumerSession` per producer id (an "inner consumer"), all behind the one ref,
  all under the merged consumer's one lock, sharing its ``dedup_store`` (one position per
  producer id) and its fencing ``epoch``.
* Routing runs on the sender's (the transport's) thread, with no lock: a batch is split
  per producer id (`split_by_producer`, the rule `FanInConsumer` uses too) and appended
  to each inner consumer's inbox; then the reader is woken if it waits. The routing table
  is replaced, never changed in place, so reading it needs no lock. A message of a
  producer id not in the set (one that left) is dropped, logged at debug level and
  counted in ``statistics().dropped``; its producer resends it if it registers again.
* The inner consumers' timers (retries on silence, a resend of the first message)
  append to their inboxes and wake the reader the same way, so they work while the
  application waits in `receive`.
* `receive` polls the inner consumers in turn, starting after the one that gave the last
  delivery (round robin: a busy producer cannot starve another), and returns the first
  delivery found; each producer's deliveries come in seq_nr order.
* Following the set: a change of the `ProducerSet` only marks the merged consumer stale
  and wakes `receive`; the change is applied there, on the consuming thread, once no
  delivery is in flight (the previous one was confirmed): added producer ids get an inner
  consumer registered to their producer, removed ones' inner consumers are closed (each
  acks what is confirmed), and a producer id whose ref changed is registered to again.
* One failure rule, as for a `Consumer`: an inner consumer whose deduplication store
  failed, or that was fenced, closes the whole merged consumer (the others ack what is
  confirmed); the call that met it raises the error, later calls `ClosedError` naming it,
  or `ConsumerFenced`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from pykka_delivery.delivery.core.consumer import ConsumerSnapshot, ConsumerStats
from pykka_delivery.delivery.core.consumer_control import check_epoch
from pykka_delivery.delivery.core.settings import ConsumerControllerSettings
from pykka_delivery.delivery.handles._routing import split_by_producer
from pykka_delivery.delivery.handles.consumer import _confirm_to_class, _tell_all
from pykka_delivery.delivery.handles.producer_set import ProducerSet
from pykka_delivery.delivery.messages import Delivery
from pykka_delivery.delivery.session.consumer import ConsumerSession
from pykka_delivery.delivery.stores.dedup import DedupStore, DedupStoreError
from pykka_delivery.delivery.stores.dedup_tx import transactional
from pykka_delivery.delivery.timers import Timers, TimerService
from pykka_delivery.errors import ClosedError, ConsumerFenced, DeliveryTimeout
from pykka_delivery.protocol.messages import Ref, SequencedMessage, with_link_problem
from pykka_delivery.protocol.serialization import Serialization

__all__ = ["MergedConsumer", "ProducerSet"]

logger = logging.getLogger("pykka_delivery.consumer")

_Failure = DedupStoreError | ConsumerFenced | ClosedError


class _Inner:
    """One producer's consumer session in a merged consumer."""

    __slots__ = ("inbox", "producer", "producer_id", "session")

    def __init__(self, producer_id: str, producer: Ref, session: ConsumerSession) -> None:
        self.producer_id = producer_id
        self.producer = producer
        self.session = session
        self.inbox = session.inbox


class _Endpoint:
    """The merged consumer's address for every producer (what ``self_ref_factory`` wraps)."""

    __slots__ = ("_merged",)

    def __init__(self, merged: MergedConsumer) -> None:
        self._merged = merged

    def __repr__(self) -> str:
        return "MergedConsumer()"

    def tell(self, message: Any) -> None:
        merged = self._merged
        if type(message) is SequencedMessage:  # the steady state, one message at a time
            inner = merged._routes.get(message.producer_id)
            if inner is not None:
                inner.inbox.append(message)
                if merged._waiting:
                    merged._wake()
                return
        merged._route([message])

    def tell_many(self, messages: list[Any]) -> None:
        """A whole batch from a transport: split per producer id, order kept in each."""
        self._merged._route(messages)

    tell_runs = tell_many  # runs stay whole: each is one producer's (the sessions take them)


class MergedConsumer:
    """Consumes several producers' streams at one ref, one delivery at a time::

        producers = ProducerSet({"orders@web-1": ref_1, "orders@web-2": ref_2})
        merged = MergedConsumer(dedup_store=store)
        merged.register_to(producers)
        for delivery in merged:
            handle(delivery.producer_id, delivery.message)
            delivery.confirm()

    Args:
        settings: of each producer's inner consumer (window, retries, dedup store retries).
        serialization: for chunked messages; default `default_serialization`.
        timer_service: for the inner consumers' timers; default the process-wide one.
        self_ref_factory: builds the ref every producer sends to from the local endpoint
            (a transport node's ``expose``, for producers in other processes).
        dedup_store: shared by every inner consumer (one position per producer id; each
            uses it under this consumer's lock): deduplication across restarts, as for a
            `Consumer`. The caller owns it and closes it after this consumer.
        epoch: the fencing epoch of this activation (0: none), given to every inner
            consumer; above 0 a store with a ``fence`` method is fenced with it here.

    Raises:
        TypeError, ValueError: ``epoch`` is not an int >= 0.
        ConsumerFenced: the deduplication store holds a newer epoch already.
    """

    def __init__(
        self,
        settings: ConsumerControllerSettings | None = None,
        *,
        serialization: Serialization | None = None,
        timer_service: TimerService | None = None,
        self_ref_factory: Callable[[Ref], Ref] | None = None,
        dedup_store: DedupStore | None = None,
        epoch: int = 0,
    ) -> None:
        check_epoch(epoch, "MergedConsumer")
        fence = getattr(dedup_store, "fence", None) if epoch else None
        if fence is not None:
            fence(epoch)
        self._settings = settings
        self._serialization = serialization
        self._timer_service = timer_service
        self._dedup_store = dedup_store
        self._epoch = epoch
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._waiting = False
        self._inners: dict[str, _Inner] = {}
        self._routes: dict[str, _Inner] = {}  # replaced whole: read by senders, no lock
        self._order: list[_Inner] = []  # the round robin's order
        self._next = 0  # where the next round starts
        self._current: _Inner | None = None  # gave the last delivery
        self._producers: ProducerSet | None = None
        self._stale = False  # the set changed since it was last followed
        self._closed = False
        self._failure: _Failure | None = None
        self._unknown = 0  # messages of producer ids not in the set
        self._retired: list[ConsumerStats] = []  # of inner consumers closed
        endpoint = _Endpoint(self)
        self._ref: Ref = self_ref_factory(endpoint) if self_ref_factory is not None else endpoint

    def __repr__(self) -> str:
        return f"MergedConsumer({sorted(self._routes)!r})"

    @property
    def ref(self) -> Ref:
        """Where every producer sends to."""
        return self._ref

    def register_to(self, producers: ProducerSet) -> None:
        """Register to every producer of ``producers`` and follow the set from now on
        (see the module docstring): added producers are registered to, removed ones'
        inner consumers closed once the delivery in flight is confirmed.

        Raises:
            ClosedError: this consumer is closed.
            DedupStoreError: an inner consumer's store could not be loaded (the set is
                followed all the same; the next `receive` tries again).
        """
        with self._lock:
            self._check_open()
            previous, self._producers = self._producers, producers
            self._stale = True
            in_flight = self._current is not None and self._current.session.outstanding
        if previous is not None:
            previous.remove_listener(self._on_change)
        producers.add_listener(self._on_change)
        if not in_flight:  # else the next receive follows it
            self._follow()

    def receive(self, timeout: float | None = None) -> Delivery:
        """The next delivery of any producer, waiting for it if needed. Confirm it before
        the next call.

        Raises:
            DeliveryTimeout: nothing arrived within ``timeout`` seconds.
            ClosedError: this consumer was closed (naming the failure that closed it).
            LocalProtocolError: the previous delivery is not confirmed yet.
            ConsumerFenced: an inner consumer was fenced: so is this whole consumer.
            DedupStoreError: the deduplication store failed.
        """
        deadline = None
        while True:
            with self._lock:
                self._check_can_receive()
                stale = self._stale
            if stale:
                self._follow()
            sends: list[tuple[Ref, Any]] = []
            delivery = None
            failure: _Failure | None = None
            with self._lock:
                try:
                    self._check_open()
                    delivery = self._poll_round(sends)
                except (DedupStoreError, ConsumerFenced, ClosedError) as error:
                    failure = self._fail(error, sends)
                if failure is None and delivery is None and not sends:
                    if deadline is None and timeout is not None:
                        deadline = time.monotonic() + timeout
                    self._wait(deadline, timeout)
            if sends:
                _tell_all(sends)
            if failure is not None:
                raise failure
            if delivery is not None:
                return delivery

    def __iter__(self) -> Iterator[Delivery]:
        """Deliveries until this consumer is closed."""
        while True:
            try:
                yield self.receive()
            except ClosedError:
                return

    def close(self) -> None:
        """Close every inner consumer (each tells its producer what is confirmed; what is
        not stays with the producer) and stop following the set. A thread waiting in
        `receive` gets `ClosedError`. Calling it again does nothing.

        Raises:
            DedupStoreError: the store could not be flushed for an inner consumer (nothing
                was told to that producer; every inner consumer is closed all the same).
        """
        sends: list[tuple[Ref, Any]] = []
        with self._lock:
            self._closed = True
            producers, self._producers = self._producers, None
            error = self._close_all(sends)
        if producers is not None:
            producers.remove_listener(self._on_change)
        _tell_all(sends)
        if error is not None:
            raise error

    def __enter__(self) -> MergedConsumer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def snapshots(self) -> list[ConsumerSnapshot]:
        """One per inner consumer, each naming its producer id (before its first message
        too)."""
        with self._lock:
            snapshots = [(inner.producer_id, inner.session.snapshot()) for inner in self._order]
        return [
            s if s.producer_id == producer_id else dataclasses.replace(s, producer_id=producer_id)
            for producer_id, s in snapshots
        ]

    def statistics(self) -> ConsumerStats:
        """The inner consumers' counters summed, those closed included; ``dropped`` also
        counts the messages of producer ids not in the set."""
        with self._lock:
            stats = [inner.session.statistics() for inner in self._order]
            stats += self._retired
            unknown = self._unknown
        total = _summed(stats)
        return dataclasses.replace(total, dropped=total.dropped + unknown)

    def transaction(self, conn: Any, delivery: Delivery) -> contextlib.AbstractContextManager[Any]:
        """As `Consumer.transaction`: ``delivery``'s position commits with the effect on
        ``conn`` (the shared ``dedup_store`` must be a `TxDedupStore`).

        Raises:
            TypeError: no transactional deduplication store.
        """
        return transactional(self._dedup_store, "MergedConsumer").transaction(conn, delivery)

    # --- routing (the sender's thread) ------------------------------------------------

    def _route(self, messages: Iterable[Any]) -> None:
        batches, links = split_by_producer(messages, self)
        routes = self._routes
        for producer_id, batch in batches.items():
            inner = routes.get(producer_id)
            if inner is not None:
                inner.inbox.extend(batch)
                continue
            with self._lock:  # rare: a producer that left, or a batch after close
                self._unknown += len(batch)
            logger.debug(
                "%r: %d message(s) of producer %r, not in the set, dropped",
                self,
                len(batch),
                producer_id,
            )
        if links:
            for inner in routes.values():
                inner.inbox.extend(links)
        if self._waiting:
            self._wake()

    def _arrive(self, inbox: deque[Any], message: Any) -> None:
        """An inner consumer's timer fired: into its inbox, and wake the reader."""
        inbox.append(message)
        if self._waiting:
            self._wake()

    def _wake(self) -> None:
        with self._lock:
            self._arrived.notify()

    def _on_change(self) -> None:
        """The set changed (on the thread that changed it): `receive` applies it."""
        self._stale = True
        if self._waiting:
            self._wake()

    # --- the consuming thread ---------------------------------------------------------

    def _poll_round(self, sends: list[tuple[Ref, Any]]) -> Delivery | None:
        """With the lock held: the next delivery, asking each inner consumer in turn from
        where the last round stopped; what they send meanwhile is added to ``sends``."""
        order = self._order
        count = len(order)
        start = self._next
        for k in range(count):
            index = (start + k) % count
            inner = order[index]
            session = inner.session
            delivery = session.poll()
            if session.outbox:
                sends += session.take_outbox()
            if delivery is not None:
                self._next = index + 1
                self._current = inner
                return delivery
        return None

    def _wait(self, deadline: float | None, timeout: float | None) -> None:
        """With the lock held: wait for something to arrive. Announce the wait, then look
        once more: what arrives after that look finds ``_waiting`` set and wakes us."""
        self._waiting = True
        try:
            if self._stale or any(inner.inbox for inner in self._order):
                return
            if deadline is None:
                self._arrived.wait()
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._nothing_delivered(timeout)
            self._arrived.wait(remaining)
        finally:
            self._waiting = False

    def _follow(self) -> None:
        """On the consuming thread, nothing in flight: apply the set as it is now."""
        self._stale = False  # before reading it: a change after the read marks it again
        producers = self._producers
        wanted = {} if producers is None else producers.current()
        with self._lock:
            have = dict(self._inners)
        added: list[_Inner] = []
        try:
            for producer_id, ref in wanted.items():
                if producer_id not in have:
                    added.append(self._open(producer_id, ref))
        except DedupStoreError:
            self._stale = True  # tried again at the next receive
            self._discard(added)
            raise
        except ConsumerFenced as error:
            self._discard(added)
            sends: list[tuple[Ref, Any]] = []
            with self._lock:
                fenced = self._fail(error, sends)
            _tell_all(sends)
            raise fenced from None
        sends = []
        failure: _Failure | None = None
        with self._lock:
            closed = self._closed
            if not closed:
                failure = self._apply(wanted, added, sends)
        if closed:
            self._discard(added)
            return
        _tell_all(sends)
        if failure is not None:
            raise failure

    def _apply(
        self, wanted: dict[str, Ref], added: list[_Inner], sends: list[tuple[Ref, Any]]
    ) -> _Failure | None:
        """With the lock held: take the ``added`` inner consumers in, close those of the
        producers not ``wanted``, register to new and moved producers."""
        for inner in added:
            self._inners[inner.producer_id] = inner
        inners = self._inners
        try:
            for producer_id, inner in list(inners.items()):
                if producer_id not in wanted:
                    del inners[producer_id]
                    self._retire(inner, sends)
            self._routes = dict(inners)
            self._order = list(inners.values())
            self._next = 0
            for inner in self._order:
                ref = wanted[inner.producer_id]
                if inner in added or inner.producer != ref:
                    inner.producer = ref
                    inner.session.register_to(ref)
                    sends += inner.session.take_outbox()
        except (DedupStoreError, ConsumerFenced, ClosedError) as error:
            return self._fail(error, sends)
        return None

    def _open(self, producer_id: str, producer: Ref) -> _Inner:
        """A new inner consumer for ``producer_id`` (not registered yet), not under the
        lock: its session loads the deduplication store."""
        inbox: deque[Any] = deque()
        confirm_to = _confirm_to_class(self._lock)
        session = ConsumerSession(
            self._ref,
            self._settings,
            name="MergedConsumer",
            timers=Timers(functools.partial(self._arrive, inbox), self._timer_service),
            inbox=inbox,
            serialization=self._serialization,
            new_confirm_to=confirm_to,
            dedup_store=self._dedup_store,
            on_end=self._arrived.notify_all,  # called with the lock held
            epoch=self._epoch,
        )
        confirm_to._session = session
        with self._lock:
            session.start()
        return _Inner(producer_id, producer, session)

    def _discard(self, inners: list[_Inner]) -> None:
        """Close inner consumers that were never registered (nothing to tell)."""
        for inner in inners:
            with self._lock, contextlib.suppress(DedupStoreError, ConsumerFenced):
                inner.session.close()

    def _retire(self, inner: _Inner, sends: list[tuple[Ref, Any]]) -> None:
        """With the lock held: close ``inner`` (it acks what is confirmed), keep its
        counters."""
        try:
            inner.session.close()
        finally:
            sends += inner.session.take_outbox()
            self._retired.append(inner.session.statistics())
            if self._current is inner:
                self._current = None
        logger.debug("%r: producer %r left the set, its consumer closed", self, inner.producer_id)

    def _close_all(self, sends: list[tuple[Ref, Any]]) -> DedupStoreError | None:
        """With the lock held: close every inner consumer; the first store failure met."""
        first: DedupStoreError | None = None
        for inner in list(self._inners.values()):
            try:
                self._retire(inner, sends)
            except (DedupStoreError, ConsumerFenced) as error:
                if isinstance(error, DedupStoreError) and first is None:
                    first = error
                logger.warning(
                    "%r: closing producer %r's consumer: %s", self, inner.producer_id, error
                )
        self._inners = {}
        self._routes = {}
        self._order = []
        self._arrived.notify_all()
        return first

    def _fail(self, error: _Failure, sends: list[tuple[Ref, Any]]) -> _Failure:
        """With the lock held: an inner consumer's store failed, or it was fenced: the
        whole consumer closes (the others ack what is confirmed). Returns the error for
        the caller to raise."""
        if not self._closed:
            self._closed = True
            self._failure = error
            producers, self._producers = self._producers, None
            if producers is not None:
                producers.remove_listener(self._on_change)
            self._close_all(sends)
            logger.error("%r closed: %s", self, error)
        return error

    def _check_open(self) -> None:
        """With the lock held: raise once closed, naming the failure that closed it."""
        if not self._closed:
            return
        failure = self._failure
        if isinstance(failure, ConsumerFenced):
            raise ConsumerFenced(str(failure), failure.epoch, failure.newer_epoch)
        if failure is not None:
            msg = f"MergedConsumer was closed because an inner consumer failed: {failure}"
            raise ClosedError(msg) from failure
        msg = "MergedConsumer is closed"
        raise ClosedError(msg)

    def _check_can_receive(self) -> None:
        """With the lock held: closed, or the last delivery still unconfirmed."""
        self._check_open()
        current = self._current
        if current is not None and current.session.outstanding is not None:
            current.session.check_can_receive()  # raises LocalProtocolError

    def _nothing_delivered(self, timeout: float | None) -> DeliveryTimeout:
        msg = f"MergedConsumer: nothing delivered within {timeout} s from {len(self._order)} "
        msg += "producer(s)"
        for inner in self._order:
            msg = with_link_problem(msg, inner.producer)
        return DeliveryTimeout(msg)


def _summed(stats: list[ConsumerStats]) -> ConsumerStats:
    names = [f.name for f in dataclasses.fields(ConsumerStats)]
    return ConsumerStats(**{name: sum(getattr(s, name) for s in stats) for name in names})
