"""The consumer controller actor's own behaviour (beyond what the core tests cover)."""

from __future__ import annotations

import queue
import threading
from typing import Any

from pykka_delivery.delivery import ConsumerController, ConsumerControllerSettings
from pykka_delivery.delivery.messages import Delivery
from pykka_delivery.protocol.messages import Ack, Fenced, Request, SequencedMessage
from tests.harness import ManualTimerService


class BlockingConsumer:
    """A consumer whose ``tell`` holds the controller until released; ``is_alive`` is settable."""

    def __init__(self) -> None:
        self.alive = True
        self.deliveries: queue.Queue[Any] = queue.Queue()
        self.release = threading.Event()

    def is_alive(self) -> bool:
        return self.alive

    def tell(self, message: Any) -> None:
        self.deliveries.put(message)
        self.release.wait(5)


class Recording:
    def __init__(self) -> None:
        self.messages: queue.Queue[Any] = queue.Queue()

    def tell(self, message: Any) -> None:
        self.messages.put(message)

    def drain(self) -> list[Any]:
        out = []
        while not self.messages.empty():
            out.append(self.messages.get())
        return out


def test_last_confirmed_of_a_stopping_consumer_is_acked_before_the_controller_stops() -> None:
    # Regression: the retry tick found the consumer dead while its last Confirmed was still
    # queued behind the tick; the controller stopped with Ack(0) and rejected the Confirmed,
    # so a processed message counted as unconfirmed.
    timers = ManualTimerService()
    consumer, producer_controller = BlockingConsumer(), Recording()
    cc = ConsumerController.start(
        ConsumerControllerSettings(flow_control_window=20),
        timer_service=timers,  # type: ignore[arg-type]
    )
    cc.tell(ConsumerController.Start(consumer))
    cc.tell(SequencedMessage("p-1", 1, "msg-1", True, False, producer_controller))
    delivery = consumer.deliveries.get(timeout=5)  # the controller is inside tell(Delivery)
    assert isinstance(delivery, Delivery)

    timers.fire_all()  # the retry tick is queued first,
    delivery.confirm()  # then the consumer's Confirmed,
    consumer.alive = False  # and the consumer stops
    consumer.release.set()

    assert cc.actor_stopped.wait(5)
    assert producer_controller.drain() == [
        Request(0, 20, True, False),
        Request(1, 20, True, False),
        Ack(1),
    ]


def test_a_controller_told_fenced_by_a_newer_epoch_stops_without_an_ack() -> None:
    timers = ManualTimerService()
    consumer, producer_controller = Recording(), Recording()
    cc = ConsumerController.start(
        ConsumerControllerSettings(flow_control_window=20),
        timer_service=timers,  # type: ignore[arg-type]
        epoch=1,
    )
    cc.tell(ConsumerController.Start(consumer))
    cc.tell(SequencedMessage("p-1", 1, "msg-1", True, False, producer_controller))

    cc.tell(Fenced(2, "p-1"))

    cc.actor_stopped.wait(5)
    assert cc.actor_stopped.is_set()
    assert [type(m) for m in producer_controller.drain()] == [Request]  # no Ack on stopping
