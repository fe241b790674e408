"""A producer service of the pipeline demo: one of the producers of the stream of clicks.

It runs a transport node and a named `PartitionedProducer` (``--name``, e.g. ``web``) of
stream ``--stream`` followed by consumer group ``spark`` (the Spark query's source). The
producer registers in the coordinator's stream catalog (``--coordinator``; the first
producer creates the stream there with ``--partitions`` partitions), where the query
finds it: no one needs this service's address. It prints ``READY <address>``, then sends
``--count`` click events keyed by user: ``{"user", "page", "ts"}`` with event times
spread over ``--minutes`` minutes, from a seeded generator (the same run sends the same
clicks), at ``--rate`` clicks per second. ``send`` waits while the query's window is full
or while no query consumes, so nothing piles up. It prints ``SENT <n>`` as it goes and,
when the query confirmed every click (each is in its durable log then), writes the clicks
per (user, minute) it sent to ``--expected`` (JSON) and prints ``DONE``; then it waits
for SIGTERM, and leaves the catalog. Its producers report their positions to the
coordinator about once a second: ``pykka-delivery lag`` shows how far the query is
behind.

Run by examples/pipeline/run.py; alone:
``python click_producer.py --coordinator 127.0.0.1:7000 --name web``.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import threading
import time
from collections import Counter
from pathlib import Path

from pykka_delivery.coordinator import CoordinatorClient
from pykka_delivery.partitions import PartitionedProducer
from pykka_delivery.transport import Node

START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z: event times are deterministic
USERS = 300


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--coordinator", required=True, help="host:port of the coordinator")
    parser.add_argument("--name", required=True, help="this producer's name in the catalog")
    parser.add_argument("--stream", default="clicks")
    parser.add_argument("--partitions", type=int, default=4, help="if it creates the stream")
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--minutes", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rate", type=float, default=2000.0, help="clicks per second")
    parser.add_argument("--expected", type=Path, default=None)
    args = parser.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    rng = random.Random(args.seed)
    expected: Counter[str] = Counter()
    with (
        Node() as node,
        CoordinatorClient(args.coordinator, node=node.address, owner=args.name) as client,
        PartitionedProducer.from_coordinator(
            client,
            args.stream,
            ["spark"],
            name=args.name,
            node=node,
            create_with=args.partitions,
        ) as producer,
    ):
        print(f"READY {node.address}", flush=True)
        began = time.monotonic()
        for n in range(1, args.count + 1):
            ahead = n / args.rate - (time.monotonic() - began)
            if ahead > 0.005:
                time.sleep(ahead)
            user = f"user-{rng.randrange(USERS):03d}"
            ts = START_MS + rng.randrange(args.minutes * 60_000)
            click = {"user": user, "page": f"/item/{rng.randrange(50)}", "ts": ts}
            producer.send(click, key=user, timeout=600)
            expected[f"{user}|{ts // 60_000 * 60}"] += 1
            if n % 1000 == 0:
                print(f"SENT {n}", flush=True)
        producer.wait_confirmed(timeout=600)
        if args.expected is not None:
            args.expected.write_text(json.dumps(expected))
        print(f"SENT {args.count}", flush=True)
        print("DONE", flush=True)
        stop.wait()


if __name__ == "__main__":
    main()
