"""`WorkPullingProducerController`: the pykka actor around `WorkPullingCore`.

Usage, in Akka's shape::

    wppc = WorkPullingProducerController.start("jobs", "worker")
    wppc.tell(WorkPullingProducerController.Start(my_producer_ref))  # gets RequestNext
    # each worker: a consumer controller registered under the service key "worker"
    cc = ConsumerController.start(service_key="worker")
    cc.tell(ConsumerController.Start(my_worker_ref))                  # gets Delivery

On each `RequestNext` the producer sends one message with
``request_next.send_next_to.tell(message)``, or asks to be told the message's seq_nr once
a worker confirmed it with ``request_next.ask_next_to.tell(MessageWithConfirmation(message,
reply_to))`` (with a durable queue: once it is stored). Each message goes to one worker
with demand; the messages a worker leaves unconfirmed go to the others. When a worker is
in another process (or the durable queue stores bytes), that ``tell`` checks the payload
in the producer's thread and raises `SerializationError` if it cannot be encoded: nothing
is sent, and the `RequestNext` still holds.

Workers are found through a `ServiceRegistry` (registry.py; the process-wide one unless
another is given): the controller subscribes to the service key when it starts and
cancels the subscription when it stops.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from pykka_delivery.delivery.actors._shell import (
    AskNextAdapter,
    ProducerShell,
    SendNextAdapter,
    quiet_tell,
)
from pykka_delivery.delivery.core.settings import WorkPullingSettings
from pykka_delivery.delivery.core.work_pulling import (
    GetWorkerStats,
    WorkerMessage,
    WorkerStats,
    WorkPullingCore,
    WorkPullingSnapshot,
    WorkPullingStats,
)
from pykka_delivery.delivery.messages import (
    MessageWithConfirmation,
    ProducerStart,
    RequestNext,
)
from pykka_delivery.delivery.registry import ServiceRegistry, default_registry
from pykka_delivery.delivery.session.producer import load_durable
from pykka_delivery.delivery.session.work_pulling import WorkPullingSession
from pykka_delivery.delivery.stores.calls import wall_clock_millis
from pykka_delivery.delivery.stores.durable_queue import DurableProducerQueue
from pykka_delivery.delivery.timers import TimerService
from pykka_delivery.protocol.messages import Ref

__all__ = ["WorkPullingProducerController"]

_WorkerStats = WorkerStats  # the class attribute of the same name hides it in annotations


class _WorkerRef:
    """Where one worker's consumer controller answers: what it is told reaches the
    controller as `WorkerMessage`, for that worker's producer core. One per worker, so the
    consumer controller sees one producer controller per session, as with Akka's child
    actor per worker."""

    __slots__ = ("_ref", "worker_id")

    def __init__(self, ref: Ref, worker_id: str) -> None:
        self._ref = ref
        self.worker_id = worker_id

    def __repr__(self) -> str:
        return f"WorkerProducerController({self._ref!r}, {self.worker_id})"

    def tell(self, message: Any) -> None:
        self._ref.tell(WorkerMessage(self.worker_id, message))


class WorkPullingProducerController(ProducerShell):
    """Sends a producer's messages to the workers registered under a service key, each
    message to one worker with demand, and the unconfirmed messages of a worker that leaves
    to the others.

    Args:
        producer_id: identifies the stream; each worker's session is
            ``"<producer_id>-<worker_id>"``.
        worker_service_key: the key workers register under.
        settings: see `WorkPullingSettings`.
        registry: where workers register; default: the process-wide `default_registry()`.
        durable_queue: where messages are stored before they are sent (a queue of this
            controller's own, not shared with a point-to-point producer controller); None
            (the default): in memory only. Its state is loaded when the controller is
            created, so ``start`` raises `DurableQueueError` if every attempt fails; the
            messages it holds unconfirmed are sent again to the workers. The caller owns
            the queue and closes it after the controller stopped (the controller flushes
            it on stop). If a store fails ``durable_queue_retry_attempts`` times (see
            ``settings.producer_controller_settings``), the controller logs an error and
            stops; start another on the same queue to carry on.
        timer_service: default: the process-wide one.
        rng: picks among workers with demand and makes worker ids; default: seeded by the
            OS.
        worker_ref_factory: builds, from the local ref a worker's consumer controller
            answers to and the worker id, the ref stamped on that worker's messages; for
            workers in other processes, expose it on the transport node, e.g.
            ``lambda ref, worker_id: node.register(f"jobs-{worker_id}", ref)``. Default:
            the local ref.
        clock_millis: the clock of the stored timestamps; default: the wall clock.

    Raises:
        ValueError: an empty ``worker_service_key``.
        DurableQueueError: the durable queue's state could not be loaded.
    """

    Start = ProducerStart
    RequestNext = RequestNext
    MessageWithConfirmation = MessageWithConfirmation
    GetWorkerStats = GetWorkerStats
    WorkerStats = WorkerStats

    _session: WorkPullingSession

    def __init__(
        self,
        producer_id: str,
        worker_service_key: str,
        settings: WorkPullingSettings | None = None,
        *,
        registry: ServiceRegistry | None = None,
        durable_queue: DurableProducerQueue | None = None,
        timer_service: TimerService | None = None,
        rng: random.Random | None = None,
        clock_millis: Callable[[], int] = wall_clock_millis,
        worker_ref_factory: Callable[[Ref, str], Ref] | None = None,
    ) -> None:
        if not isinstance(worker_service_key, str) or not worker_service_key:
            msg = f"worker_service_key must be a non-empty str, got {worker_service_key!r}"
            raise ValueError(msg)
        super().__init__(timer_service=timer_service)
        self.settings = settings or WorkPullingSettings()
        self.worker_service_key = worker_service_key
        durable, state = load_durable(
            durable_queue,
            self.settings.producer_controller_settings,
            f"WorkPullingProducerController {producer_id!r}",
        )
        actor_ref = self.actor_ref

        def worker_ref(worker_id: str) -> Ref:
            local = _WorkerRef(actor_ref, worker_id)
            return local if worker_ref_factory is None else worker_ref_factory(local, worker_id)

        send_next, ask_next = SendNextAdapter(actor_ref), AskNextAdapter(actor_ref)
        self.core = WorkPullingCore(
            producer_id,
            send_next,
            ask_next,
            worker_ref,
            self.settings,
            rng=rng,
            durable_state=state,
            clock_millis=clock_millis,
            payload_encoders=(durable_queue,),
        )
        send_next.gate = ask_next.gate = self.core.gate
        self._session = WorkPullingSession(
            self.core,
            self._timers,
            durable,
            name="WorkPullingProducerController",
            on_failure=self.stop,
            registry=registry if registry is not None else default_registry(),
            worker_service_key=worker_service_key,
            check_interval=self.settings.dead_worker_check_interval,
        )

    def on_start(self) -> None:
        self._session.subscribe(quiet_tell(self.actor_ref))  # stopped: no more listings

    # Queries, for `proxy()` or `ask`: answered in the actor's thread.

    def worker_stats(self) -> _WorkerStats:
        return self.core.worker_stats()

    def snapshot(self) -> WorkPullingSnapshot:
        return self.core.snapshot()

    def statistics(self) -> WorkPullingStats:
        return self.core.statistics()
