"""`WorkPullingProducer`: work pulling for code that is not an actor.

The handle runs a `WorkPullingCore` inline in the caller's thread, as `Producer` runs a
`ProducerCore`: `send` picks a worker with demand and tells the message straight to that
worker's consumer side, with no thread hop. What the workers send back (`Request`, `Ack`,
`Resend`, each to the endpoint of its own session), the registry's listings and timer
firings arrive on other threads; they are queued and processed by whichever thread next
holds the handle's lock: the arriving thread itself when the application is not inside a
call (so an idle producer still answers resends and hands a departed worker's messages
to the others), otherwise the application's thread before it returns. Nobody waits for
that lock except the application's own calls. This is the scheme of producer_handle.py,
for the same reason: `WorkPullingProducerController`, an actor, costs the producer a
thread hop per message, which on a small machine limits how far adding workers scales.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import pykka

from pykka_delivery.delivery.core.effects import Effect
from pykka_delivery.delivery.core.settings import WorkPullingSettings
from pykka_delivery.delivery.core.work_pulling import (
    CurrentWorkers,
    WorkerMessage,
    WorkerStats,
    WorkPullingCore,
    WorkPullingSnapshot,
    WorkPullingStats,
)
from pykka_delivery.delivery.handles._parts import (
    Ignore,
    InboxLock,
    ProducerEffects,
    ReplySlot,
    failed_error,
    open_durable,
)
from pykka_delivery.delivery.registry import ServiceRegistry, Subscription, default_registry
from pykka_delivery.delivery.stores.calls import wall_clock_millis
from pykka_delivery.delivery.stores.durable_queue import DurableProducerQueue, DurableQueueError
from pykka_delivery.delivery.timers import TimerFired, Timers, TimerService
from pykka_delivery.errors import ClosedError, DeliveryTimeout, LocalProtocolError, WouldBlock
from pykka_delivery.protocol.messages import Ref

__all__ = ["WorkPullingProducer"]

logger = logging.getLogger("pykka_delivery.work_pulling")

_CHECK_WORKERS = "check_workers"
"""Key of the timer that asks the registry for the listing (worker timers hold a "/")."""


class _WorkerEndpoint:
    """Where one worker's consumer side answers: what it is told reaches the core as a
    `WorkerMessage` of that worker (one endpoint per worker session)."""

    __slots__ = ("_producer", "worker_id")

    def __init__(self, producer: WorkPullingProducer, worker_id: str) -> None:
        self._producer = producer
        self.worker_id = worker_id

    def __repr__(self) -> str:
        return f"WorkPullingProducer({self._producer.producer_id!r}, worker {self.worker_id})"

    def tell(self, message: Any) -> None:
        self._producer._inbound(WorkerMessage(self.worker_id, message))

    def tell_many(self, messages: list[Any]) -> None:
        """A whole batch from a transport: queued at once, processed once."""
        worker_id = self.worker_id
        self._producer._inbound_many([WorkerMessage(worker_id, m) for m in messages])


class WorkPullingProducer(InboxLock, ProducerEffects):
    """Sends messages to the workers registered under a service key, each message to one
    worker with demand, one `send` at a time; the unconfirmed messages of a worker that
    leaves go to the others.

    Workers are consumer controllers (or `Consumer` handles) registered under
    ``worker_service_key``, as for `WorkPullingProducerController`, whose behaviour this
    handle shares (docs/durable.md, "Work pulling"): each worker has a session of its own,
    producer id ``"<producer_id>-<worker_id>"``; delivery is at least once when workers
    leave.

    Args:
        producer_id: identifies the stream.
        worker_service_key: the key workers register under.
        settings: see `WorkPullingSettings`.
        registry: where workers register; default: the process-wide `default_registry()`.
            Across processes, a `CoordinatorServiceRegistry`.
        timer_service: default: the process-wide one.
        rng: picks among workers with demand and makes worker ids; default: seeded by the
            OS.
        worker_ref_factory: builds, from the local endpoint a worker's consumer side
            answers to and the worker id, the ref stamped on that worker's messages; for
            workers in other processes, expose it on the transport node, e.g.
            ``lambda ref, worker_id: node.register(f"jobs-{worker_id}", ref)``. Default:
            the local endpoint.
        durable_queue: where messages are stored before they are sent (a queue of this
            producer's own); None (the default): none. Its state is loaded here, and the
            messages it holds unconfirmed go to the first workers with demand. The caller
            owns the queue: `close` flushes it, the caller closes it. If a store fails
            ``durable_queue_retry_attempts`` times (see
            ``settings.producer_controller_settings``) the producer closes itself and the
            call raises `DurableQueueError`, as does every later call; create a new
            producer on the same queue to carry on.
        clock_millis: the clock of the stored timestamps; default: the wall clock.
        ack_each_message: False (the default): a worker confirms the messages it
            processed with its `Request`s, every half flow-control window, and only the
            messages of `send_and_confirm` are acknowledged one by one; after the last
            `send`, the last confirmations come with the workers' retries (their
            ``resend_interval_min``), which is how long `wait_confirmed` may wait for
            them. True: every message is acknowledged at once, as Akka does, at the cost
            of a message on the wire per message, back to this producer (across
            processes that costs the producer more than sending: see bench/workpull.py).

    Thread-safe, but meant for one sending thread.

    Raises:
        ValueError: an empty ``worker_service_key``.
        DurableQueueError: loading the durable queue's state failed every attempt.
        Exception: what ``registry.subscribe`` raised (a coordinator that cannot be
            reached, say); the producer is closed then.
    """

    def __init__(
        self,
        producer_id: str,
        worker_service_key: str,
        settings: WorkPullingSettings | None = None,
        *,
        registry: ServiceRegistry | None = None,
        timer_service: TimerService | None = None,
        rng: random.Random | None = None,
        worker_ref_factory: Callable[[Ref, str], Ref] | None = None,
        durable_queue: DurableProducerQueue | None = None,
        clock_millis: Callable[[], int] = wall_clock_millis,
        ack_each_message: bool = False,
    ) -> None:
        if not isinstance(worker_service_key, str) or not worker_service_key:
            msg = f"worker_service_key must be a non-empty str, got {worker_service_key!r}"
            raise ValueError(msg)
        self.settings = settings or WorkPullingSettings()
        self._durable, state = open_durable(
            durable_queue,
            self.settings.producer_controller_settings,
            f"WorkPullingProducer {producer_id!r}",
        )
        self._failure: DurableQueueError | None = None
        self.producer_id = producer_id
        self.worker_service_key = worker_service_key
        self._registry = registry if registry is not None else default_registry()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._inbox: deque[Any] = deque()
        self._closed = False
        self._sleeping = False  # the lock holder is about to wait for a change
        self._caller = 0  # the thread telling others under the lock (see _process_inbound)
        self._timers = Timers(self._inbound, timer_service)

        def worker_ref(worker_id: str) -> Ref:
            local = _WorkerEndpoint(self, worker_id)
            return local if worker_ref_factory is None else worker_ref_factory(local, worker_id)

        ignore = Ignore()  # no RequestNext is ever sent: demand is read from the core
        self._core = WorkPullingCore(
            producer_id,
            ignore,
            ignore,
            worker_ref,
            self.settings,
            rng=rng,
            durable_state=state,
            clock_millis=clock_millis,
            ack_each_message=ack_each_message,
        )
        with self._lock:
            self._timers.start(_CHECK_WORKERS, self.settings.dead_worker_check_interval)
        self._subscription: Subscription | None = None
        try:
            self._subscription = self._registry.subscribe(worker_service_key, self._on_listing)
        except BaseException:
            self.close()
            raise

    # --- sending -----------------------------------------------------------------------

    def send(self, message: Any, timeout: float | None = None) -> int:
        """Send ``message`` to a worker with demand, waiting for one; returns its seq_nr
        (numbered across all workers).

        Raises:
            DeliveryTimeout: no worker had demand within ``timeout`` seconds (nothing was
                sent).
            ClosedError: the producer was closed.
            DurableQueueError: storing it failed every attempt (the producer is closed).
        """
        with self._lock:
            core = self._core
            seq_nr = core.current_seq_nr
            # The steady state first: picked, numbered and told at once, no effects.
            if self._inbox or self._closed or not self._send_fast(message):
                self._wait_for(self._has_demand, timeout, "worker with demand")
                seq_nr = core.current_seq_nr
                self._run(core.on_msg(message))
        if self._inbox:
            self._after_release()
        return seq_nr

    def send_many(self, messages: Iterable[Any], timeout: float | None = None) -> list[int]:
        """Send ``messages``, each to a worker with demand once there is one; returns
        their seq_nrs. The lock is taken once for all, and what the workers answer
        meanwhile is processed between messages.

        Raises:
            DeliveryTimeout: not all were sent within ``timeout`` seconds; the error says
                how many were (those are in the stream; the rest were not sent).
            ClosedError: the producer was closed.
            DurableQueueError: storing failed every attempt (the producer is closed).
        """
        pending = list(messages)
        seq_nrs: list[int] = []
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            core = self._core
            for message in pending:
                seq_nr = core.current_seq_nr
                if self._inbox or self._closed or not self._send_fast(message):
                    remaining = None if deadline is None else deadline - time.monotonic()
                    try:
                        self._wait_for(self._has_demand, remaining, "worker with demand")
                    except DeliveryTimeout:
                        msg = (
                            f"WorkPullingProducer {self.producer_id!r}: no worker with demand "
                            f"within {timeout} s: the first {len(seq_nrs)} of {len(pending)} "
                            "messages were sent"
                        )
                        raise DeliveryTimeout(msg) from None
                    seq_nr = core.current_seq_nr
                    self._run(core.on_msg(message))
                seq_nrs.append(seq_nr)
        self._after_release()
        return seq_nrs

    def send_nowait(self, message: Any) -> int:
        """Send ``message`` if a worker has demand now; returns its seq_nr.

        Raises:
            WouldBlock: no worker has demand at the moment (nothing was sent).
        """
        with self._lock:
            self._check_open()
            self._drain()
            if not self._core.has_demand:
                msg = (
                    f"WorkPullingProducer {self.producer_id!r} has no worker with demand "
                    f"({len(self._core.workers)} workers registered under "
                    f"{self.worker_service_key!r})"
                )
                raise WouldBlock(msg)
            seq_nr = self._core.current_seq_nr
            self._run(self._core.on_msg(message))
        self._after_release()
        return seq_nr

    def send_and_confirm(self, message: Any, timeout: float | None = None) -> int:
        """Send ``message`` and wait until a worker confirmed it (with a durable queue,
        until it is stored, as in Akka); returns its seq_nr. If its worker leaves first,
        the message goes to another worker and the wait goes on.

        Raises:
            DeliveryTimeout: not sent, or not confirmed, within ``timeout`` seconds (if it
                was sent, it stays in the stream and will still be processed).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        slot = ReplySlot()
        with self._lock:
            self._wait_for(self._has_demand, timeout, "worker with demand")
            seq_nr = self._core.current_seq_nr
            self._run(self._core.on_msg(message, slot))
            self._wait_for(
                lambda: slot.seq_nr is not None,
                None if deadline is None else deadline - time.monotonic(),
                f"confirmation of seq_nr {seq_nr}",
            )
        self._after_release()
        return seq_nr

    def wait_confirmed(self, timeout: float | None = None) -> None:
        """Block until workers confirmed every message sent so far. Without
        ``ack_each_message``, the last confirmations come with the workers' retries, up to
        their ``resend_interval_min`` after the last message was processed.

        Raises:
            DeliveryTimeout: some are still unconfirmed after ``timeout`` seconds.
        """
        with self._lock:
            self._wait_for(
                lambda: self._core.all_confirmed, timeout, "confirmation of every message"
            )
        self._after_release()

    def close(self) -> None:
        """Stop the timers and the registry subscription, refuse further sends and ignore
        the workers from now on: unconfirmed messages are not sent again (close after
        `wait_confirmed` to be sure nothing is lost, or use a durable queue). The durable
        queue, if any, is flushed, not closed: its owner closes it."""
        with self._lock:
            self._closed = True
            self._timers.cancel_all()
            self._inbox.clear()
            self._changed.notify_all()
            flush = self._durable is not None and self._failure is None
            subscription, self._subscription = self._subscription, None
        if subscription is not None:
            subscription.cancel()  # outside the lock: a registry may call back
        if flush:
            assert self._durable is not None
            self._durable.flush_on_stop()

    def __enter__(self) -> WorkPullingProducer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- queries -----------------------------------------------------------------------

    def worker_stats(self) -> WorkerStats:
        """How many workers are registered now (as the registry last said)."""
        with self._lock:
            self._drain()
            return self._core.worker_stats()

    def snapshot(self) -> WorkPullingSnapshot:
        with self._lock:
            return self._core.snapshot()

    def statistics(self) -> WorkPullingStats:
        with self._lock:
            return self._core.statistics()

    # --- internals (call with the lock held unless said otherwise) ----------------------

    def _has_demand(self) -> bool:
        return self._core.has_demand

    def _on_listing(self, workers: frozenset[Ref]) -> None:
        """The registry's listener (any thread)."""
        self._inbound(CurrentWorkers(workers))

    def _check_open(self) -> None:
        if self._closed:
            if self._failure is not None:
                raise failed_error(self.producer_id) from self._failure
            msg = f"WorkPullingProducer {self.producer_id!r} is closed"
            raise ClosedError(msg)

    def _timeout_message(self, what: str, timeout: float | None) -> str:
        return (
            f"WorkPullingProducer {self.producer_id!r}: no {what} within "
            f"{timeout} s ({len(self._core.workers)} workers registered)"
        )

    def _effects_of(self, message: Any) -> list[Effect] | None:
        if type(message) is TimerFired:
            if not self._timers.accept(message):
                return None
            if message.key == _CHECK_WORKERS:
                # A local registry drops the workers it finds dead and tells us the
                # listing, on this thread (queued, and processed by the running drain).
                self._caller = threading.get_ident()
                try:
                    self._registry.listing(self.worker_service_key)
                finally:
                    self._caller = 0
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

    def _send_fast(self, message: Any) -> bool:
        """`WorkPullingCore.next_message`, the message told to its worker; False when it
        needs `on_msg` (nothing was sent then)."""
        picked = self._core.next_message(message)
        if picked is None:
            return False
        self._caller = threading.get_ident()  # as in _run
        try:
            self._tell(*picked)
        finally:
            self._caller = 0
        return True

    def _tell(self, to: Ref, message: Any) -> None:
        try:
            to.tell(message)
        except pykka.ActorDeadError:
            # A worker actor that died: the registry's listing drops it (the periodic
            # check), and its unconfirmed messages go to the others.
            logger.debug("Dropped %s: %r is dead", type(message).__name__, to)

    def _wake_waiters(self) -> None:
        self._changed.notify_all()
