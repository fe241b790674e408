"""Reliable delivery over a lossy link: 100 000 messages, nothing lost, nothing doubled.

A producer sends numbered messages to a consumer through the delivery controllers while a
fault injector (`LossyRef`) drops a share of the wire messages in both directions: the
producer's `SequencedMessage`s, and the consumer's `Request`, `Resend` and `Ack`. The
consumer side asks again for what is missing, the producer side resends it, and the
application sees every message exactly once, in order.

It runs twice: through the pykka actors (`ProducerController` / `ConsumerController`) and
through the handles (`Producer` / `Consumer`, which drive the same protocol inline in the
caller's thread). Run with ``make demo`` or ``python examples/p2p_demo.py --help``.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pykka

from pykka_delivery import (
    Consumer,
    ConsumerController,
    ConsumerControllerSettings,
    LossyRef,
    Producer,
    ProducerController,
    ProducerControllerSettings,
    RegisterToProducerController,
    RequestNext,
)
from pykka_delivery.delivery import Ack, Request, Resend, SequencedMessage

TO_CONSUMER = (SequencedMessage,)
TO_PRODUCER = (Request, Resend, Ack)
PRODUCER_SETTINGS = ProducerControllerSettings(resend_first_interval=0.01)


@dataclass
class Report:
    route: str
    received: list[int]
    sent: int
    seconds: float
    dropped: int

    def line(self) -> str:
        unique = set(self.received)
        duplicates = len(self.received) - len(unique)
        lost = self.sent - len(unique & set(range(1, self.sent + 1)))
        in_order = all(a < b for a, b in zip(self.received, self.received[1:], strict=False))
        rate = len(self.received) / self.seconds
        return (
            f"{self.route:<8}{len(unique):>10,}{duplicates:>12,}{lost:>7,}"
            f"{'yes' if in_order else 'NO':>10}{rate:>12,.0f}{self.dropped:>14,}"
        )


def lossy_factory(
    faults: list[LossyRef], drop: float, seed: int
) -> Callable[[tuple[type, ...], int], Callable[[Any], LossyRef]]:
    """``lossy(types, salt)`` makes a ``self_ref_factory`` that puts a `LossyRef` dropping
    ``types`` in front of a controller or handle, and records it in ``faults``."""

    def lossy(types: tuple[type, ...], salt: int) -> Callable[[Any], LossyRef]:
        def factory(ref: Any) -> LossyRef:
            faults.append(LossyRef(ref, drop=drop, types=types, seed=seed + salt))
            return faults[-1]

        return factory

    return lossy


def consumer_settings(window: int) -> ConsumerControllerSettings:
    return ConsumerControllerSettings(
        flow_control_window=window, resend_interval_min=0.01, resend_interval_max=0.5
    )


class NumberProducer(pykka.ThreadingActor):
    """Sends 1, 2, 3, ... one per RequestNext."""

    def __init__(self, count: int) -> None:
        super().__init__()
        self.count = count
        self.sent = 0

    def on_receive(self, message: Any) -> None:
        if isinstance(message, RequestNext) and self.sent < self.count:
            self.sent += 1
            message.send_next_to.tell(self.sent)


class Recorder(pykka.ThreadingActor):
    """Records every delivery, confirms it, and signals when the last one arrived."""

    def __init__(self, count: int, done: threading.Event) -> None:
        super().__init__()
        self.count = count
        self.done = done
        self.received: list[int] = []

    def on_receive(self, delivery: Any) -> None:
        self.received.append(delivery.message)
        delivery.confirm()
        if delivery.message == self.count:
            self.done.set()


def through_actors(count: int, drop: float, window: int, seed: int, timeout: float) -> Report:
    faults: list[LossyRef] = []
    lossy = lossy_factory(faults, drop, seed)
    done = threading.Event()
    recorder = Recorder.start(count, done)
    cc = ConsumerController.start(consumer_settings(window), self_ref_factory=lossy(TO_CONSUMER, 1))
    pc = ProducerController.start(
        "demo-actors", PRODUCER_SETTINGS, self_ref_factory=lossy(TO_PRODUCER, 2)
    )
    cc.tell(ConsumerController.Start(recorder))
    started = time.perf_counter()
    pc.tell(ProducerController.Start(NumberProducer.start(count)))
    cc.tell(RegisterToProducerController(pc.proxy().self_ref.get()))
    done.wait(timeout)
    seconds = time.perf_counter() - started
    received = recorder.proxy().received.get()
    pykka.ActorRegistry.stop_all()
    return Report("actors", received, count, seconds, sum(f.dropped for f in faults))


def through_handles(count: int, drop: float, window: int, seed: int, timeout: float) -> Report:
    faults: list[LossyRef] = []
    lossy = lossy_factory(faults, drop, seed)
    producer = Producer("demo-handles", PRODUCER_SETTINGS, self_ref_factory=lossy(TO_PRODUCER, 3))
    consumer = Consumer(consumer_settings(window), self_ref_factory=lossy(TO_CONSUMER, 4))
    consumer.register_to(producer.ref)
    received: list[int] = []

    def consume() -> None:
        for delivery in consumer:
            received.append(delivery.message)
            delivery.confirm()
            if delivery.message == count:
                return

    reader = threading.Thread(target=consume, daemon=True)
    started = time.perf_counter()
    reader.start()
    for number in range(1, count + 1):
        producer.send(number, timeout=timeout)
    reader.join(timeout)
    seconds = time.perf_counter() - started
    producer.close()
    consumer.close()
    return Report("handles", received, count, seconds, sum(f.dropped for f in faults))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--drop", type=float, default=0.05, help="share of wire messages lost")
    parser.add_argument("--window", type=int, default=50, help="flow-control window")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per route")
    args = parser.parse_args()
    print(
        f"pykka-delivery demo: {args.messages:,} messages producer -> consumer, "
        f"{args.drop:.0%} of wire messages dropped in each direction, window {args.window}\n"
    )
    print(
        f"{'route':<8}{'delivered':>10}{'duplicates':>12}{'lost':>7}{'in order':>10}"
        f"{'msgs/s':>12}{'wire drops':>14}"
    )
    for route in (through_actors, through_handles):
        report = route(args.messages, args.drop, args.window, args.seed, args.timeout)
        print(report.line(), flush=True)


if __name__ == "__main__":
    main()
