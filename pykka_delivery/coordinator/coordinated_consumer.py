"""`CoordinatedConsumer`: a `Consumer` that consumes only while the coordinator says so.

Theory of operation:

* It registers one subscription in a group through a `CoordinatorClient`. While the
  coordinator has not made it the group's active consumer, iterating it yields nothing
  (it blocks).
* Told ``active=True``, it creates a `Consumer` handle and registers it to the producer
  (`Consumer.register_to`); the producer moves its stream to it and resends what no one
  confirmed, so the new consumer continues from the first unconfirmed message.
* Told to step down (``active=False``), it lets the delivery in flight be confirmed, then
  closes the `Consumer` (which acks what is confirmed to the producer) and only then
  answers ``activate``, so the coordinator activates the next consumer after this one
  stopped: never two consumers of a group process at once. Copies of the step-down sent
  again before the next ``active`` on the same stream are not answered again (see
  `_on_update`).
* Cut off from the coordinator (the client's stream broke), it stops the same way,
  without answering: the coordinator cannot tell it apart from a crashed consumer and
  will give the group to another one after its ``disconnected_timeout``. When the
  connection comes back in time, the coordinator re-sends ``active`` and it resumes, or
  re-sends a step-down still pending, which it answers then (the client does not re-send
  an answer of the broken stream).
  This relies on the client noticing the break (gRPC keepalive) before that timeout.
* Each activation's `Consumer` gets the coordinator's fencing epoch (`epoch`). Shut out
  by a newer one (`ConsumerFenced`), it stops as when cut off, without answering, and
  waits for its next activation; `receive` does not raise it.
* When its client closes with a goodbye, it returns a future from the connection
  listener that is done once it stopped: the client sends the goodbye (which hands the
  group over at once) only after the delivery in flight is confirmed.
* A `Consumer` that stops on its own (its deduplication store gave up: `confirm` raises
  the store's error) is ended, and while the subscription is active the next `receive`
  starts a new one with a new store, which continues from the first message not
  confirmed.
* If the client's re-registration after a reconnect is refused, it stops for good:
  `receive` raises that `CoordinatorRefused`.
* Each period of consuming is recorded as an `ActivationInterval` (monotonic clock), so
  tests can check that the intervals of a group's consumers never overlap, and handed to
  the ``on_activated`` / ``on_deactivated`` hooks when it starts and when it ends.
* Lag as data: while it consumes, its client reports its position in the producer's
  stream (last seq_nr received and confirmed) at every ``report_interval``, read from the
  `Consumer`'s snapshot then (docs/coordinator.md, "Lag").

Threads: updates arrive on the client's thread, deliveries are taken and confirmed on the
application's; one lock orders them. A step-down that arrives while the application waits
for a message closes the `Consumer` at once (the wait goes on, for the next activation).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from pykka_delivery.coordinator._activation import (
    ActivationHooks,
    ActivationInterval,
    ConfirmTo,
    positions_of,
    register,
)
from pykka_delivery.coordinator.client import (
    ConnectionRejected,
    CoordinatorClient,
    CoordinatorRefused,
)
from pykka_delivery.coordinator.commands import Registered
from pykka_delivery.coordinator.effects import SendConsumerUpdate
from pykka_delivery.coordinator.lag import ConsumerPosition
from pykka_delivery.coordinator.state import SIMPLE, GroupId
from pykka_delivery.delivery.core.settings import ConsumerControllerSettings
from pykka_delivery.delivery.handles.consumer import Consumer
from pykka_delivery.delivery.handles.merged import MergedConsumer, ProducerSet
from pykka_delivery.delivery.messages import Delivery
from pykka_delivery.delivery.stores.dedup import DedupStore, DedupStoreError
from pykka_delivery.delivery.stores.dedup_tx import transactional
from pykka_delivery.delivery.timers import TimerService
from pykka_delivery.errors import (
    ClosedError,
    ConsumerFenced,
    DeliveryError,
    DeliveryTimeout,
    LocalProtocolError,
)
from pykka_delivery.protocol.messages import Ref
from pykka_delivery.protocol.serialization import Serialization

if TYPE_CHECKING:
    from pykka_delivery.transport.node import Node

__all__ = ["ActivationInterval", "CoordinatedConsumer"]

logger = logging.getLogger("pykka_delivery.coordinator.consumer")


class CoordinatedConsumer:
    """Consumes a producer's stream while the coordinator makes it its group's active
    consumer; use it like a `Consumer`::

        for delivery in coordinated:
            handle(delivery.message)
            delivery.confirm()

    Args:
        client: the process's connection to the coordinator.
        namespace: the group's namespace.
        stream: the group's stream.
        name: the group's name.
        producer: the producer (a `Producer`'s ref, a producer controller, a remote ref),
            or a `ProducerSet` of several: each activation then consumes all of them
            through a `MergedConsumer` (one delivery at a time), following the set.
        partition_index: `SIMPLE` (-1) for a simple group, or the partition's index.
        subscription_id: default: the client's next one.
        settings: for each `Consumer` it creates.
        serialization: for each `Consumer` it creates.
        timer_service: for each `Consumer` it creates.
        node: a transport node to expose each `Consumer` on (under a fresh name per
            activation, withdrawn when it stops), for a producer in another process.
        self_ref_factory: instead of ``node``, builds each `Consumer`'s ref (called once
            per activation).
        timeout: bound on the registration.
        dedup_store: called at each activation for the deduplication store of the
            `Consumer` it creates (``Consumer(dedup_store=...)``); the store is closed when
            that activation ends, before the step-down is answered, so the group's next
            consumer (in this process or another) can open it. None: no deduplication.
            A store that fails to open makes `receive` raise its error (the next
            `receive` tries again). With a `TxDedupStore` (``lambda:
            SqliteTxDedupStore(db, consumer_id)``), apply each effect in `transaction`.
        on_activated: called with the new `ActivationInterval` when an activation
            starts (its `Consumer` is created, in `receive`, on the consuming thread).
        on_deactivated: called with the ended `ActivationInterval` when it stops, on
            the thread that stopped it (the client's, on a step-down or a lost
            connection; the consuming one, confirming the delivery in flight; the one
            calling `close`), before the step-down is answered or the unregistration
            sent: so a group's next ``on_activated`` comes after it. Hooks run one at a
            time, in order; they must not block (they hold up that thread: the hand-over,
            the client's updates). One that raises is logged; consuming goes on.

    Raises:
        ValueError: both ``node`` and ``self_ref_factory``, or a bad group name.
        CoordinatorRefused, ConnectionRejected: the registration failed.
        DeliveryTimeout: no answer to the registration within ``timeout``; its removal
            is queued behind it, so the abandoned consumer never blocks its group.
    """

    def __init__(
        self,
        client: CoordinatorClient,
        namespace: str,
        stream: str,
        name: str,
        producer: Ref | ProducerSet,
        *,
        partition_index: int = SIMPLE,
        subscription_id: int | None = None,
        settings: ConsumerControllerSettings | None = None,
        serialization: Serialization | None = None,
        timer_service: TimerService | None = None,
        node: Node | None = None,
        self_ref_factory: Callable[[Ref], Ref] | None = None,
        timeout: float | None = None,
        dedup_store: Callable[[], DedupStore] | None = None,
        on_activated: Callable[[ActivationInterval], None] | None = None,
        on_deactivated: Callable[[ActivationInterval], None] | None = None,
    ) -> None:
        if node is not None and self_ref_factory is not None:
            msg = "CoordinatedConsumer: give node or self_ref_factory, not both"
            raise ValueError(msg)
        self.group = GroupId(namespace, stream, name)
        self.partition_index = partition_index
        self.subscription_id = (
            client.next_subscription_id() if subscription_id is None else subscription_id
        )
        self._client = client
        self._producer = producer
        self._consumer_args: dict[str, Any] = {
            "serialization": serialization,
            "timer_service": timer_service,
        }
        self._settings = settings
        self._node = node
        self._self_ref_factory = self_ref_factory
        self._dedup_factory = dedup_store
        self._dedup: DedupStore | None = None  # the current activation's store
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._told_active = False  # the coordinator's last word, while connected
        self._told_epoch = 0  # the epoch of the last ``active``
        self._owed_epoch = 0  # the epoch of the last step-down (its answer names it)
        self._owe_activate = False  # told to step down; answer once stopped
        # Answered a step-down since the last ``active`` on this stream: a repeated
        # step-down is not answered again (the first answer is delivered, unless the
        # stream breaks first: the client then drops it, and this is reset).
        self._answered = False
        self._refused: CoordinatorRefused | None = None  # re-registering was refused
        # Done once the current Consumer stopped (the client's close waits for them).
        self._stop_waiters: list[concurrent.futures.Future[None]] = []
        self._consumer: Consumer | MergedConsumer | None = None
        self._exposed: str | None = None  # the current Consumer's name on the node
        self._in_flight: Delivery | None = None
        self._intervals: list[ActivationInterval] = []
        self._confirmed = 0
        self._closed = False
        self._hooks = ActivationHooks(self._lock, self.group, on_activated, on_deactivated)
        client.add_listener(self._on_connection)
        try:
            self.registered: Registered = client.register(
                self.group,
                self.subscription_id,
                self._on_update,
                partition_index=partition_index,
                timeout=timeout,
                on_refused=self._on_refused,
            )
        except BaseException as error:
            client.remove_listener(self._on_connection)
            if not isinstance(error, CoordinatorRefused | ConnectionRejected | ClosedError):
                # A timed-out (or interrupted) registration stays queued in the client and
                # would be applied later, for a consumer nobody iterates: in a simple group
                # it would stay the active one for good. Queue its removal behind it.
                with contextlib.suppress(DeliveryError):
                    client.unregister(self.group, self.subscription_id, timeout=0)
            raise
        client.add_position_source(self._positions)

    # --- the application's side ---------------------------------------------------------

    def receive(self, timeout: float | None = None) -> Delivery:
        """The next delivery, waiting (also for this consumer to be made active) if
        needed. Confirm it before the next call.

        Raises:
            DeliveryTimeout: nothing within ``timeout`` seconds.
            ClosedError: this consumer was closed.
            CoordinatorRefused: its client registered it again after a reconnect and
                the coordinator refused (it had lost this consumer, and the group now
                has another partition index): it will never be active again. Close it.
            LocalProtocolError: the previous delivery is not confirmed yet.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            consumer, fresh = self._current_consumer(deadline, timeout)
            if fresh:
                self._hooks.run()
            try:
                if fresh:
                    register(consumer, self._producer)
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                delivery = consumer.receive(remaining)
            except ClosedError as error:
                # Stopped by a step-down or a lost connection: wait for the next turn. Or
                # it closed itself (its store failed): the next one starts afresh.
                self._closed_itself(consumer, error)
                continue
            except ConsumerFenced as error:
                self._fenced(consumer, error)
                continue
            with self._lock:
                if self._consumer is not consumer:
                    continue  # stopped meanwhile: unconfirmed, so the next consumer gets it
                self._in_flight = delivery
            return dataclasses.replace(delivery, confirm_to=ConfirmTo(self, delivery))

    def __iter__(self) -> Iterator[Delivery]:
        """Deliveries until this consumer is closed; it ends with `CoordinatorRefused`
        if the coordinator refused it after a reconnect (see `receive`)."""
        while True:
            try:
                yield self.receive()
            except ClosedError:
                return

    def close(self, *, unregister: bool = True, timeout: float | None = None) -> None:
        """Stop consuming and leave the group (the next consumer takes over).

        Call it from the consuming thread, or once the delivery in flight is confirmed: a
        delivery not confirmed by then stays with the producer, for the next consumer.
        With ``unregister=False`` the subscription stays registered (for a client about to
        close without goodbye, say). Idempotent. From the client's thread (a callback) the
        unregister is sent without waiting for its answer.

        This is how another thread stops a consuming loop: a thread blocked in `receive`
        (or in ``for delivery in consumer:``) gets `ClosedError` at once (the loop ends),
        whether it was waiting to be made active or for a message.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._told_active = False
            self._in_flight = None
            if self._consumer is not None:
                self._stop_consumer("closed")
            owed, self._owe_activate = self._owe_activate, False
            self._changed.notify_all()
        self._hooks.run()
        self._client.remove_listener(self._on_connection)
        self._client.remove_position_source(self._positions)
        if unregister:
            try:
                self._client.unregister(self.group, self.subscription_id, timeout=timeout)
            except LocalProtocolError:
                # On the client's thread (from a callback), where waiting for the answer
                # would wait for this very thread.
                self._client.send_unregister(self.group, self.subscription_id)
            except (ClosedError, ConnectionRejected, DeliveryTimeout) as error:
                logger.warning("Unregistering from %s failed: %s", self.group, error)
        elif owed:
            self._client.send_activate(self.group, self.subscription_id, epoch=self._owed_epoch)

    def __enter__(self) -> CoordinatedConsumer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def transaction(self, conn: Any, delivery: Delivery) -> contextlib.AbstractContextManager[Any]:
        """``with coordinated.transaction(conn, delivery): apply(conn)``: the effect and
        ``delivery``'s position commit together in the current activation's store, which
        ``dedup_store`` must make transactional (`SqliteTxDedupStore`). Confirm after.

        Raises:
            TypeError: no transactional store (none given, or not consuming now).
        """
        return transactional(self._dedup, "CoordinatedConsumer").transaction(conn, delivery)

    @property
    def active_dedup_store(self) -> DedupStore | None:
        """The current activation's deduplication store, None while not consuming."""
        return self._dedup

    @property
    def epoch(self) -> int:
        """The fencing epoch of the activation it consumes under (or was told of and
        starts at the next `receive`); 0 when not active."""
        with self._lock:
            if self._consumer is not None:
                return self._intervals[-1].epoch
            return self._told_epoch if self._told_active else 0

    @property
    def is_consuming(self) -> bool:
        """Whether a `Consumer` is open now (this subscription is active)."""
        return self._consumer is not None

    @property
    def confirmed(self) -> int:
        """Deliveries confirmed through this consumer so far."""
        return self._confirmed

    def intervals(self) -> tuple[ActivationInterval, ...]:
        """Every period of consuming so far, oldest first (the last may be open)."""
        with self._lock:
            return tuple(self._intervals)

    # --- internals -----------------------------------------------------------------------

    def _current_consumer(
        self, deadline: float | None, timeout: float | None
    ) -> tuple[Consumer | MergedConsumer, bool]:
        """The open `Consumer` and whether it was just created (so not registered to the
        producer yet), waiting until there is one."""
        with self._lock:
            while True:
                if self._closed:
                    msg = f"CoordinatedConsumer of {self.group} is closed"
                    raise ClosedError(msg)
                if self._in_flight is not None:
                    msg = (
                        f"CoordinatedConsumer: delivery seq_nr {self._in_flight.seq_nr} is not "
                        "confirmed yet: call delivery.confirm() before receiving the next"
                    )
                    raise LocalProtocolError(msg)
                if self._refused is not None:
                    refused = self._refused
                    raise CoordinatorRefused(refused.reason, refused.message)
                if self._consumer is not None:
                    return self._consumer, False
                if self._told_active:
                    started = self._start_consumer()
                    if started is not None:
                        return started, True
                    continue  # fenced at once: wait for the next activation
                if deadline is None:
                    self._changed.wait()
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    msg = f"CoordinatedConsumer of {self.group}: nothing within {timeout} s"
                    raise DeliveryTimeout(msg)
                self._changed.wait(remaining)

    def _start_consumer(self) -> Consumer | MergedConsumer | None:
        """With the lock held: a new `Consumer` for this activation (None: its
        deduplication store holds a newer epoch already: it is fenced)."""
        factory = self._self_ref_factory
        if self._node is not None:
            self._exposed = (
                f"sac-{self._client.connection_id}-{self.subscription_id}-{len(self._intervals)}"
            )
            factory = self._node.expose(self._exposed)
        dedup = None
        try:
            dedup = None if self._dedup_factory is None else self._dedup_factory()
            handle = MergedConsumer if isinstance(self._producer, ProducerSet) else Consumer
            consumer = handle(
                self._settings,
                self_ref_factory=factory,
                dedup_store=dedup,
                epoch=self._told_epoch,
                **self._consumer_args,
            )
        except ConsumerFenced as error:
            self._release_activation(dedup)
            self._log_fenced(self._told_epoch, error)
            self._told_active = False
            return None
        except BaseException:
            self._release_activation(dedup)
            raise
        self._dedup = dedup
        self._consumer = consumer
        self._intervals.append(ActivationInterval(time.monotonic(), epoch=self._told_epoch))
        self._hooks.due("on_activated", self._intervals[-1])
        logger.info("Subscription %d active in %s: consuming", self.subscription_id, self.group)
        return consumer

    def _stop_consumer(self, why: str) -> None:
        """With the lock held: close the `Consumer` (it acks what is confirmed) and end
        the interval."""
        consumer = self._consumer
        assert consumer is not None
        self._consumer = None
        try:
            consumer.close()
        except (DedupStoreError, ConsumerFenced) as error:  # logged: the next one took over
            logger.warning("Subscription %d in %s: %s", self.subscription_id, self.group, error)
        dedup, self._dedup = self._dedup, None
        self._release_activation(dedup)
        self._intervals[-1] = dataclasses.replace(self._intervals[-1], end=time.monotonic())
        self._hooks.due("on_deactivated", self._intervals[-1])
        waiters, self._stop_waiters = self._stop_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._changed.notify_all()
        logger.info("Subscription %d in %s stopped (%s)", self.subscription_id, self.group, why)

    def _release_activation(self, dedup: DedupStore | None) -> None:
        """With the lock held: withdraw the activation's name from the node and close its
        deduplication store (before any answer to a step-down: the next consumer opens it)."""
        if self._node is not None and self._exposed is not None:
            self._node.unregister(self._exposed)
            self._exposed = None
        if dedup is not None:
            try:
                dedup.close()
            except (DedupStoreError, ClosedError) as error:
                logger.warning(
                    "Subscription %d in %s: closing its deduplication store failed: %s",
                    self.subscription_id,
                    self.group,
                    error,
                )

    def _stop_if_idle(self, why: str) -> bool:
        """With the lock held, after the coordinator withdrew its ``active``: stop now
        unless a delivery is in flight (then `_confirm` stops). Returns whether the
        step-down is to be answered now."""
        if self._consumer is None or self._in_flight is not None:
            return False
        self._stop_consumer(why)
        owed, self._owe_activate = self._owe_activate, False
        if owed:
            self._answered = True
        return owed

    def _confirm(self, delivery: Delivery) -> None:
        with self._lock:
            if self._in_flight is not delivery:
                msg = (
                    "CoordinatedConsumer: confirm() of a delivery that is not the outstanding "
                    "one (confirmed already, or this consumer was closed)"
                )
                raise LocalProtocolError(msg)
            consumer = self._consumer
        try:
            delivery.confirm()
        except ConsumerFenced as error:  # not counted: a newer activation has its position
            if consumer is not None:
                self._fenced(consumer, error)
            return
        except DeliveryError as error:  # its store gave up: unconfirmed, with the producer
            if consumer is not None and not isinstance(error, LocalProtocolError):
                self._closed_itself(consumer, error)
            raise
        with self._lock:
            self._in_flight = None
            self._confirmed += 1
            stopping = not self._told_active
            answer = stopping and self._stop_if_idle("stepped down after confirming")
            epoch = self._owed_epoch
        if stopping:  # not per message: only when this delivery ends an activation
            self._hooks.run()
        if answer:
            self._answer(epoch)

    def _on_update(self, update: SendConsumerUpdate) -> None:
        """On the client's thread: the coordinator's word for this subscription."""
        with self._lock:
            if update.stepping_down:
                self._owed_epoch = update.epoch
            if self._closed:
                answer = update.stepping_down
            elif update.active:
                answer = False
                self._told_active = True
                self._told_epoch = update.epoch
                self._answered = False
                self._changed.notify_all()
            elif self._consumer is None:
                # The coordinator tells a deactivating consumer again when its group
                # re-checks, and on every re-attach. One answer per step-down and stream:
                # a second one, arriving after this consumer was made active and told to
                # step down anew, would count for that step-down while it still consumes.
                # (The copy re-sent on a re-attach is answered: `_on_connection`.)
                self._told_active = False
                answer = not self._answered
                self._answered = True
            else:
                self._told_active = False
                self._owe_activate = True
                answer = self._stop_if_idle("stepping down")
        self._hooks.run()
        if answer:
            self._answer(update.epoch)

    def _answer(self, epoch: int) -> None:
        """Answer the step-down of ``epoch`` (not holding the lock). If the answer cannot
        be delivered (the connection was refused), the next copy of the step-down is
        answered again."""
        future = self._client.send_activate(self.group, self.subscription_id, epoch=epoch)
        future.add_done_callback(self._answer_done)

    def _fenced(self, consumer: Consumer | MergedConsumer, error: ConsumerFenced) -> None:
        """A newer activation of the group shut ``consumer`` out: stop it as when cut off,
        without answering (the coordinator has moved on), and wait for the next
        activation."""
        with self._lock:
            if self._consumer is not consumer:
                return  # stopped meanwhile
            epoch = self._intervals[-1].epoch
            self._log_fenced(epoch, error)
            if self._told_epoch <= epoch:  # unless already told of a newer activation
                self._told_active = False
            self._owe_activate = False
            self._in_flight = None
            self._stop_consumer("fenced")
        self._hooks.run()

    def _closed_itself(self, consumer: Consumer | MergedConsumer, error: DeliveryError) -> None:
        """``consumer`` stopped on its own (its deduplication store gave up): end it (its
        delivery in flight stays unconfirmed, with the producer), answer a step-down owed,
        and while still active let the next `receive` start a new one (a new store), which
        continues from the first message not confirmed. Nothing when it was stopped here."""
        with self._lock:
            if self._consumer is not consumer:
                return
            logger.warning(
                "Subscription %d in %s: its consumer stopped (%s); starting a new one",
                self.subscription_id,
                self.group,
                error,
            )
            self._in_flight = None
            self._stop_consumer("its consumer stopped")
            answer = not self._told_active and self._owe_activate
            if answer:
                self._owe_activate = False
                self._answered = True
            epoch = self._owed_epoch
        self._hooks.run()
        if answer:
            self._answer(epoch)

    def _answer_done(self, future: concurrent.futures.Future[Any]) -> None:
        if future.cancelled() or isinstance(future.exception(), ConnectionRejected):
            with self._lock:
                self._answered = False

    def _log_fenced(self, epoch: int, error: ConsumerFenced) -> None:
        logger.warning(
            "Subscription %d in %s was fenced: a newer activation (epoch %s) of its group "
            "shut out this one (epoch %s); stopping until activated again (%s)",
            self.subscription_id,
            self.group,
            error.newer_epoch or "unknown",
            epoch,
            error,
        )

    def _on_connection(self, up: bool) -> concurrent.futures.Future[None] | None:
        """On the client's thread: cut off from the coordinator (or its client closing),
        stop consuming, without answering a step-down: the coordinator re-sends
        ``active``, or a step-down still pending, when the connection comes back.

        Returns a future done once the `Consumer` stopped, if a delivery is in flight (so
        it stops only after its confirmation): the client's close waits for it before
        saying goodbye, which hands the group over at once."""
        if up:
            return None
        with self._lock:
            self._told_active = False
            # The client does not re-send an answer of the broken stream: one owed is not
            # given, and the copy of a step-down re-sent on attaching is answered.
            self._owe_activate = False
            self._answered = False
            self._stop_if_idle("connection to the coordinator lost")
            waiter: concurrent.futures.Future[None] | None = None
            if self._consumer is not None:
                waiter = concurrent.futures.Future()
                self._stop_waiters.append(waiter)
        self._hooks.run()
        return waiter

    def _positions(self) -> list[ConsumerPosition]:
        """On the client's thread, at each report: where the open `Consumer` is in its
        producer's stream. Nothing while not consuming (the active consumer reports)."""
        return positions_of(self.group, self.partition_index, self._consumer, self._in_flight)

    def _on_refused(self, refused: CoordinatorRefused) -> None:
        """On the client's thread: registering again after a reconnect was refused; the
        client dropped the subscription. Stop (after the delivery in flight) and make
        `receive` raise it (the client logged it)."""
        with self._lock:
            self._refused = refused
            self._told_active = False
            self._owe_activate = False
            self._stop_if_idle("registration refused")
            self._changed.notify_all()
        self._hooks.run()
