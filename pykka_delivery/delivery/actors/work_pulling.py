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
with demand; the messages a worker leaves unconfirmed go to the others.

Workers are found through a `ServiceRegistry` (registry.py; the process-wide one unless
another is given): the controller subscribes to the service key when it starts and
cancels the subscription when it stops.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable
from typing import Any

import pykka

from pykka_delivery.delivery.actors._shell import ControllerActor
from pykka_delivery.delivery.core.effects import Effect
from pykka_delivery.delivery.core.settings import WorkPullingSettings
from pykka_delivery.delivery.core.work_pulling import (
    CurrentWorkers,
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
    SendNext,
)
from pykka_delivery.delivery.registry import (
    ServiceRegistry,
    Subscription,
    default_registry,
)
from pykka_delivery.delivery.stores.calls import STORE_EFFECTS, DurableQueueCalls, wall_clock_millis
from pykka_delivery.delivery.stores.durable_queue import DurableProducerQueue, DurableQueueError
from pykka_delivery.delivery.timers import TimerService
from pykka_delivery.protocol.messages import Ref

__all__ = ["WorkPullingProducerController"]

_WorkerStats = WorkerStats  # the class attribute of the same name hides it in annotations

_CHECK_WORKERS = "check_workers"
"""Key of the timer that asks the registry for the listing (worker timers hold a "/")."""


class _SendNextAdapter:
    """``RequestNext.send_next_to``: wraps the producer's message in `SendNext`."""

    __slots__ = ("_ref",)

    def __init__(self, ref: Ref) -> None:
        self._ref = ref

    def __repr__(self) -> str:
        return f"SendNextTo({self._ref!r})"

    def tell(self, message: Any) -> None:
        self._ref.tell(SendNext(message))


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


class WorkPullingProducerController(ControllerActor):
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
        self._registry = registry if registry is not None else default_registry()
        self._subscription: Subscription | None = None
        self._durable: DurableQueueCalls | None = None
        self._failed = False
        state = None
        if durable_queue is not None:
            self._durable = DurableQueueCalls(
                durable_queue,
                self.settings.producer_controller_settings,
                f"WorkPullingProducerController {producer_id!r}",
            )
            state = self._durable.load()
        actor_ref = self.actor_ref

        def worker_ref(worker_id: str) -> Ref:
            local = _WorkerRef(actor_ref, worker_id)
            return local if worker_ref_factory is None else worker_ref_factory(local, worker_id)

        self.core = WorkPullingCore(
            producer_id,
            _SendNextAdapter(actor_ref),
            actor_ref,
            worker_ref,
            self.settings,
            rng=rng,
            durable_state=state,
            clock_millis=clock_millis,
        )

    def on_start(self) -> None:
        actor_ref = self.actor_ref

        def on_listing(workers: frozenset[Ref]) -> None:
            with contextlib.suppress(pykka.ActorDeadError):  # stopped: no more listings
                actor_ref.tell(CurrentWorkers(workers))

        self._subscription = self._registry.subscribe(self.worker_service_key, on_listing)
        self._timers.start(_CHECK_WORKERS, self.settings.dead_worker_check_interval)

    def on_stop(self) -> None:
        if self._subscription is not None:
            self._subscription.cancel()
        super().on_stop()
        if self._durable is not None and not self._failed:
            self._durable.flush_on_stop()

    def on_receive(self, message: Any) -> None:
        if self._failed:
            return  # stopping: what the core would do now rests on a state the queue lacks
        super().on_receive(message)

    def _core_receive(self, message: Any) -> list[Effect]:
        return self.core.receive(message)

    def _core_timer(self, key: str) -> list[Effect]:
        if key == _CHECK_WORKERS:
            # A local registry drops the workers it finds dead and tells us the listing.
            self._registry.listing(self.worker_service_key)
            return []
        return self.core.on_timer(key)

    def _run_other(self, effect: Effect) -> bool:
        if self._durable is None or not isinstance(effect, STORE_EFFECTS):
            return super()._run_other(effect)
        try:
            self._durable.store(effect)
        except DurableQueueError:
            # Logged with the fix. Akka's controller crashes here; so do we, cleanly.
            self._failed = True
            self._timers.cancel_all()
            self.stop()
            return False
        return True

    # Queries, for `proxy()` or `ask`: answered in the actor's thread.

    def worker_stats(self) -> _WorkerStats:
        return self.core.worker_stats()

    def snapshot(self) -> WorkPullingSnapshot:
        return self.core.snapshot()

    def statistics(self) -> WorkPullingStats:
        return self.core.statistics()
