"""Consumer service: receives a remote producer's messages, in order, exactly once.

    python examples/remote_consumer.py --producer 127.0.0.1:7001/orders --count 100000

It starts a node on 127.0.0.1 (any free port), registers its `Consumer` with the producer
and confirms each message after checking it is the next in sequence. It prints one JSON
line at the end: how many arrived, duplicates, gaps, and the rate.
"""

from __future__ import annotations

import argparse
import json
import time

from pykka_delivery import Consumer, ConsumerControllerSettings
from pykka_delivery.transport import Node, NodeSettings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--producer", default="127.0.0.1:7001/orders")
    parser.add_argument("--count", type=int, default=100_000, help="stop after this number")
    parser.add_argument("--window", type=int, default=500, help="flow-control window")
    parser.add_argument("--name", default="orders-consumer")
    parser.add_argument("--token", default=None, help="shared secret of the nodes")
    parser.add_argument("--resend-interval", type=float, default=2.0)
    args = parser.parse_args()
    settings = ConsumerControllerSettings(
        flow_control_window=args.window,
        resend_interval_min=args.resend_interval,
        resend_interval_max=max(args.resend_interval, 30.0),
    )
    with Node(NodeSettings(token=args.token)) as node:
        consumer = Consumer(settings, self_ref_factory=node.expose(args.name))
        consumer.register_to(node.ref(args.producer))
        print(json.dumps({"ready": True, "address": f"{node.address}/{args.name}"}), flush=True)
        expected, duplicates, gaps = 1, 0, 0
        started = None
        for delivery in consumer:
            number = int.from_bytes(delivery.message[:8], "big")
            if started is None:
                started = time.perf_counter()
            if number < expected:
                duplicates += 1
            elif number > expected:
                gaps += number - expected
            expected = max(expected, number + 1)
            delivery.confirm()
            if number >= args.count:
                break
        seconds = time.perf_counter() - (started or time.perf_counter())
        received = expected - 1
        consumer.close()
        print(
            json.dumps(
                {
                    "received": received,
                    "duplicates": duplicates,
                    "gaps": gaps,
                    "seconds": round(seconds, 3),
                    "msgs_per_s": round(received / seconds) if seconds else None,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
