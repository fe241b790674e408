"""Consumer service: receives a remote producer's messages, in order, exactly once.

    python examples/remote_consumer.py --producer 127.0.0.1:7001/orders --count 100000
    python examples/remote_consumer.py --producer 127.0.0.1:7001/orders --asyncio

It starts a node on 127.0.0.1 (any free port), registers its consumer with the producer
and confirms each message after checking it is the next in sequence. It prints one JSON
line at the end: how many arrived, duplicates, gaps, and the rate.

With ``--asyncio`` it is an asyncio service: the node runs on the program's event loop
(``async with Node()``) and ``async for`` over an `AsyncConsumer` receives on that loop;
otherwise a `Consumer` is iterated on the main thread.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from pykka_delivery import AsyncConsumer, Consumer, ConsumerControllerSettings, Delivery
from pykka_delivery.transport import Node, NodeSettings


class Tally:
    """Checks each number against the next expected one."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.expected, self.duplicates, self.gaps = 1, 0, 0
        self.started: float | None = None

    def take(self, delivery: Delivery) -> bool:
        """Count ``delivery``; True once the last number has arrived."""
        number = int.from_bytes(delivery.message[:8], "big")
        if self.started is None:
            self.started = time.perf_counter()
        if number < self.expected:
            self.duplicates += 1
        elif number > self.expected:
            self.gaps += number - self.expected
        self.expected = max(self.expected, number + 1)
        return number >= self.count

    def report(self) -> None:
        seconds = time.perf_counter() - (self.started or time.perf_counter())
        received = self.expected - 1
        summary = {
            "received": received,
            "duplicates": self.duplicates,
            "gaps": self.gaps,
            "seconds": round(seconds, 3),
            "msgs_per_s": round(received / seconds) if seconds else None,
        }
        print(json.dumps(summary), flush=True)


def run(args: argparse.Namespace, settings: ConsumerControllerSettings) -> None:
    with Node(NodeSettings(token=args.token)) as node:
        consumer = Consumer(settings, self_ref_factory=node.expose(args.name))
        consumer.register_to(node.ref(args.producer))
        announce(node, args.name)
        tally = Tally(args.count)
        for delivery in consumer:
            last = tally.take(delivery)
            delivery.confirm()
            if last:
                break
        consumer.close()
        tally.report()


async def run_asyncio(args: argparse.Namespace, settings: ConsumerControllerSettings) -> None:
    async with Node(NodeSettings(token=args.token)) as node:
        consumer = AsyncConsumer(settings, self_ref_factory=node.expose(args.name))
        consumer.register_to(node.ref(args.producer))
        announce(node, args.name)
        tally = Tally(args.count)
        async for delivery in consumer:
            last = tally.take(delivery)
            delivery.confirm()
            if last:
                break
        consumer.close()
        tally.report()


def announce(node: Node, name: str) -> None:
    print(json.dumps({"ready": True, "address": f"{node.address}/{name}"}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--producer", default="127.0.0.1:7001/orders")
    parser.add_argument("--count", type=int, default=100_000, help="stop after this number")
    parser.add_argument("--window", type=int, default=500, help="flow-control window")
    parser.add_argument("--name", default="orders-consumer")
    parser.add_argument("--token", default=None, help="shared secret of the nodes")
    parser.add_argument("--resend-interval", type=float, default=2.0)
    parser.add_argument("--asyncio", action="store_true", help="an asyncio service")
    args = parser.parse_args()
    settings = ConsumerControllerSettings(
        flow_control_window=args.window,
        resend_interval_min=args.resend_interval,
        resend_interval_max=max(args.resend_interval, 30.0),
    )
    if args.asyncio:
        asyncio.run(run_asyncio(args, settings))
    else:
        run(args, settings)


if __name__ == "__main__":
    main()
