"""`WorkPullingProducer`: work pulling for code that is not an actor.

The handle runs a `WorkPullingCore` inline in the caller's thread, as `Producer` runs a
`ProducerCore`: `send` picks a worker with demand and tells the message straight to that
worker's consumer side, with no thread hop. What the workers send back (`Request`, `Ack`,
`Resend`, each to the endpoint of its own session), the registry's listings and timer
firings arrive on other threads; they are queued and processed by whichever thread next
holds the handle's lock: the arriving thread itself when the application is not inside a
call (so an idle producer still answers resends and hands a departed worker's messages
to the others), otherwise the application's thread before it returns. Nobody waits for
that lock except the application's own calls. This is the scheme of handles/producer.py
(the waiting of handles/_blocking.py around a session, delivery/session/work_pulling.py),
for the same reason: `WorkPullingProducerController`, an actor, costs the producer a
thread hop per message, which on a small machine limits how far adding workers scales.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from typing import Any

from pykka_delivery.delivery.core.settings import WorkPullingSettings
from pykka_delivery.delivery.core.work_pulling import (
    WorkerMessage,
    WorkerStats,
    WorkPullingCore,
    WorkPullingSnapshot,
    WorkPullingStats,
)
from pykka_delivery.delivery.handles._blocking import BlockingProducer
from pykka_delivery.delivery.registry import ServiceRegistry, default_registry
from pykka_delivery.delivery.session.producer import Ignore, load_durable
from pykka_delivery.delivery.session.work_pulling import WorkPullingSession
from pykka_delivery.delivery.stores.calls import wall_clock_millis
from pykka_delivery.delivery.stores.durable_queue import DurableProducerQueue
from pykka_delivery.delivery.timers import Timers, TimerService
from pykka_delivery.protocol.messages import Ref

__all__ = ["WorkPullingProducer"]


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


class WorkPullingProducer(BlockingProducer[WorkPullingSession]):
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
        self.producer_id = producer_id
        self.worker_service_key = worker_service_key
        durable, state = load_durable(
            durable_queue,
            self.settings.producer_controller_settings,
            f"WorkPullingProducer {producer_id!r}",
        )

        def worker_ref(worker_id: str) -> Ref:
            local = _WorkerEndpoint(self, worker_id)
            return local if worker_ref_factory is None else worker_ref_factory(local, worker_id)

        ignore = Ignore()  # no RequestNext is ever sent: demand is read from the core
        core = WorkPullingCore(
            producer_id,
            ignore,
            ignore,
            worker_ref,
            self.settings,
            rng=rng,
            durable_state=state,
            clock_millis=clock_millis,
            ack_each_message=ack_each_message,
            payload_encoders=(durable_queue,),
        )
        self._open(
            WorkPullingSession(
                core,
                Timers(self._inbound, timer_service),
                durable,
                name="WorkPullingProducer",
                on_failure=self._on_failure,
                registry=registry if registry is not None else default_registry(),
                worker_service_key=worker_service_key,
                check_interval=self.settings.dead_worker_check_interval,
            )
        )
        try:
            self._session.subscribe(self._inbound)
        except BaseException:
            self.close()
            raise

    def send(self, message: Any, timeout: float | None = None) -> int:
        """Send ``message`` to a worker with demand, waiting for one; returns its seq_nr
        (numbered across all workers).

        Raises:
            DeliveryTimeout: no worker had demand within ``timeout`` seconds (nothing was
                sent).
            ClosedError: the producer was closed.
            SerializationError: its payload cannot be encoded for a registered worker in
                another process or the durable queue (nothing was sent or numbered).
            DurableQueueError: storing it failed every attempt (the producer is closed).
        """
        with self._lock:
            session = self._session
            seq_nr = None
            if not (self._inbox or session.closed):
                self._caller = threading.get_ident()  # as in _run: a worker may answer at once
                try:
                    seq_nr = session.try_send(message)
                finally:
                    self._caller = 0
            if seq_nr is None:
                self._wait_for(self._has_demand, timeout, session.DEMAND_TO_SEND)
                seq_nr = session.send(message)
        if self._inbox:
            self._after_release()
        return seq_nr

    def worker_stats(self) -> WorkerStats:
        """How many workers are registered now (as the registry last said)."""
        with self._lock:
            self._drain()
            return self._session.worker_stats()

    def snapshot(self) -> WorkPullingSnapshot:
        with self._lock:
            return self._session.snapshot()

    def statistics(self) -> WorkPullingStats:
        with self._lock:
            return self._session.statistics()
