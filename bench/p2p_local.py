"""Point-to-point delivery in one process: actors and handles against a pykka ceiling.

Measures, in the same run, messages per second with one-by-one confirmation (window 50,
100-byte payloads):

* ``pykka_pingpong``: the ceiling, a raw pykka ping-pong where each message waits for its
  reply (two actors, ``tell`` both ways) — what one-by-one confirmation costs in bare pykka;
* ``actor``: producer actor -> ProducerController -> ConsumerController -> consumer actor;
* ``handle``: a `Producer` in one thread -> a `Consumer` in another.

Each figure is the median of ``--runs`` runs. The last line printed is one JSON object with
the figures and the ratios, for machines to compare runs.

Usage: python bench/p2p_local.py [--messages N] [--runs R]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import platform
import statistics
import threading
import time
from typing import Any

import pykka

from pykka_delivery import (
    Consumer,
    ConsumerController,
    ConsumerControllerSettings,
    Producer,
    ProducerController,
    RegisterToProducerController,
    RequestNext,
)

PAYLOAD = b"x" * 100
WINDOW = 50
WAIT = 120.0


class _Pong(pykka.ThreadingActor):
    def on_receive(self, message: Any) -> None:
        message[1].tell(message[0])


class _Ping(pykka.ThreadingActor):
    def __init__(self, count: int, pong: pykka.ActorRef[Any], done: threading.Event) -> None:
        super().__init__()
        self.count = count
        self.pong = pong
        self.done = done

    def on_receive(self, message: Any) -> None:
        if message >= self.count:
            self.done.set()
            return
        self.pong.tell((message + 1, self.actor_ref))


def pykka_pingpong(count: int) -> float:
    done = threading.Event()
    pong = _Pong.start()
    ping = _Ping.start(count, pong, done)
    started = time.perf_counter()
    ping.tell(0)
    if not done.wait(WAIT):
        raise RuntimeError("ping-pong did not finish")
    elapsed = time.perf_counter() - started
    pykka.ActorRegistry.stop_all()
    return count / elapsed


class _Producer(pykka.ThreadingActor):
    def __init__(self, count: int) -> None:
        super().__init__()
        self.count = count
        self.sent = 0

    def on_receive(self, message: Any) -> None:
        if isinstance(message, RequestNext) and self.sent < self.count:
            self.sent += 1
            message.send_next_to.tell(PAYLOAD)


class _Consumer(pykka.ThreadingActor):
    def __init__(self, count: int, done: threading.Event) -> None:
        super().__init__()
        self.count = count
        self.done = done

    def on_receive(self, delivery: Any) -> None:
        delivery.confirm()
        if delivery.seq_nr >= self.count:
            self.done.set()


def actors(count: int) -> float:
    done = threading.Event()
    settings = ConsumerControllerSettings(flow_control_window=WINDOW)
    cc = ConsumerController.start(settings)
    cc.tell(ConsumerController.Start(_Consumer.start(count, done)))
    pc = ProducerController.start("bench")
    started = time.perf_counter()
    pc.tell(ProducerController.Start(_Producer.start(count)))
    cc.tell(RegisterToProducerController(pc))
    if not done.wait(WAIT):
        raise RuntimeError("actor delivery did not finish")
    elapsed = time.perf_counter() - started
    pykka.ActorRegistry.stop_all()
    return count / elapsed


def handles(count: int) -> float:
    producer = Producer("bench")
    consumer = Consumer(ConsumerControllerSettings(flow_control_window=WINDOW))
    consumer.register_to(producer.ref)

    def consume() -> None:
        for delivery in consumer:
            delivery.confirm()
            if delivery.seq_nr >= count:
                return

    reader = threading.Thread(target=consume)
    started = time.perf_counter()
    reader.start()
    for _ in range(count):
        producer.send(PAYLOAD)
    reader.join(WAIT)
    elapsed = time.perf_counter() - started
    if reader.is_alive():
        raise RuntimeError("handle delivery did not finish")
    producer.close()
    consumer.close()
    return count / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000, help="per actor/ping-pong run")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    n = args.messages
    figures: dict[str, list[float]] = {"pykka_pingpong": [], "actor": [], "handle": []}
    for _ in range(args.runs):  # interleaved, so drifting machine load hits all alike
        figures["pykka_pingpong"].append(pykka_pingpong(n))
        figures["actor"].append(actors(n))
        figures["handle"].append(handles(n * 5))
    median = {name: statistics.median(values) for name, values in figures.items()}
    ceiling = median["pykka_pingpong"]
    versions = f"python {platform.python_version()}, pykka {importlib.metadata.version('pykka')}"
    print(f"{versions}, window {WINDOW}")
    print(f"{'route':<16}{'msgs/s (median)':>18}{'x ceiling':>12}   runs")
    for name, value in median.items():
        runs = ", ".join(f"{v:,.0f}" for v in figures[name])
        print(f"{name:<16}{value:>18,.0f}{value / ceiling:>12.2f}   {runs}")
    print(
        json.dumps(
            {
                "actor_msgs_per_s": round(median["actor"]),
                "handle_msgs_per_s": round(median["handle"]),
                "pykka_pingpong_msgs_per_s": round(ceiling),
                "actor_vs_pingpong": round(median["actor"] / ceiling, 3),
                "handle_vs_pingpong": round(median["handle"] / ceiling, 3),
                "window": WINDOW,
                "payload_bytes": len(PAYLOAD),
                "runs": args.runs,
            }
        )
    )


if __name__ == "__main__":
    main()
