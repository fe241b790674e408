"""`ProducerController`: the pykka actor around `ProducerCore`.

Usage, in Akka's shape::

    pc = ProducerController.start("orders")
    pc.tell(ProducerController.Start(my_producer_ref))   # gets RequestNext messages
    cc.tell(ConsumerController.RegisterToProducerController(pc))

On each `RequestNext` the producer sends one message with
``request_next.send_next_to.tell(message)`` (or asks for a confirmation with
``request_next.ask_next_to.tell(MessageWithConfirmation(message, reply_to))``). When the
consumer side is in another process (or the durable queue stores bytes), that ``tell``
checks the payload in the producer's thread and raises `SerializationError` if it cannot
be encoded: nothing is sent, and the `RequestNext` still holds (send another message).

With a durable queue (``ProducerController.start("orders", durable_queue=queue)``) every
message is stored before it is sent, and a controller started again with the same
producer id on the same queue resends what was not confirmed and continues the numbering
(see core/producer.py). The actor's mailbox is the waiting; a `ProducerSession`
(session/producer.py) carries out what the core decides, as for the `Producer` handle.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pykka

from pykka_delivery.delivery.actors._shell import AskNextAdapter, ProducerShell, SendNextAdapter
from pykka_delivery.delivery.core.producer import ProducerCore, ProducerSnapshot, ProducerStats
from pykka_delivery.delivery.core.settings import ProducerControllerSettings
from pykka_delivery.delivery.messages import (
    MessageWithConfirmation,
    ProducerStart,
    RequestNext,
)
from pykka_delivery.delivery.session.producer import ProducerSession, load_durable
from pykka_delivery.delivery.stores.calls import wall_clock_millis
from pykka_delivery.delivery.stores.durable_queue import DurableProducerQueue
from pykka_delivery.delivery.timers import TimerService
from pykka_delivery.protocol.messages import Ref, RegisterConsumer
from pykka_delivery.protocol.serialization import Serialization

__all__ = ["ProducerController"]


class ProducerController(ProducerShell):
    """Numbers a producer's messages and delivers them to one consumer controller, within
    the consumer's flow-control window, resending what is lost.

    Args:
        producer_id: identifies the stream (stamped on every message).
        settings: see `ProducerControllerSettings`.
        serialization: for chunking; default `default_serialization`.
        self_ref_factory: builds the ref the consumer side uses to reach this controller
            from its pykka ref (a transport's remote address, or a fault injector in tests).
        timer_service: default: the process-wide one.
        durable_queue: where messages are stored before they are sent; None (the default):
            none, messages live in memory only. Its state is loaded when the controller
            is created, so ``start`` raises `DurableQueueError` if every attempt fails.
            The caller owns the queue: one controller at a time uses it, and the caller
            closes it after that controller stopped (the controller flushes it on stop).
            If a store fails ``durable_queue_retry_attempts`` times, the controller logs
            an error and stops; start another on the same queue to carry on.
        clock_millis: the clock of the stored timestamps; default: the wall clock.
    """

    Start = ProducerStart
    RequestNext = RequestNext
    MessageWithConfirmation = MessageWithConfirmation
    RegisterConsumer = RegisterConsumer

    def __init__(
        self,
        producer_id: str,
        settings: ProducerControllerSettings | None = None,
        *,
        serialization: Serialization | None = None,
        self_ref_factory: Callable[[pykka.ActorRef[Any]], Ref] | None = None,
        timer_service: TimerService | None = None,
        durable_queue: DurableProducerQueue | None = None,
        clock_millis: Callable[[], int] = wall_clock_millis,
    ) -> None:
        super().__init__(self_ref_factory=self_ref_factory, timer_service=timer_service)
        settings = settings or ProducerControllerSettings()
        durable, state = load_durable(
            durable_queue, settings, f"ProducerController {producer_id!r}"
        )
        send_next, ask_next = SendNextAdapter(self.actor_ref), AskNextAdapter(self.actor_ref)
        self.core = ProducerCore(
            producer_id,
            self.self_ref,
            send_next,
            settings,
            serialization,
            durable_state=state,
            clock_millis=clock_millis,
            payload_encoders=(durable_queue,),
            ask_next_to=ask_next,
        )
        send_next.gate = ask_next.gate = self.core.gate
        self._session = ProducerSession(
            self.core,
            self._timers,
            durable,
            name="ProducerController",
            on_failure=self.stop,
            drop_dead_targets=True,
        )

    # Queries, for `proxy()` or `ask`: answered in the actor's thread.

    def snapshot(self) -> ProducerSnapshot:
        return self.core.snapshot()

    def statistics(self) -> ProducerStats:
        return self.core.statistics()
