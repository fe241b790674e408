"""Producer service: sends numbered messages reliably to a consumer in another process.

    python examples/remote_producer.py --port 7001 --count 100000
    python examples/remote_producer.py --port 7001 --count 100000 --asyncio

It starts a node on 127.0.0.1:PORT and exposes its producer as ``orders``. Start the
consumer service (examples/remote_consumer.py) against ``127.0.0.1:PORT/orders``, in any
order: the producer waits for demand. It prints one JSON line when every message is
confirmed. With ``--coordinator host:port`` it also announces itself there under service
``--service`` (default ``orders``), where examples/coordinated_consumer.py finds it.

With ``--asyncio`` it is an asyncio service: the node runs on the program's event loop
(``async with Node()``) and an `AsyncProducer` sends on that loop, with no thread between
them; otherwise a `Producer` sends from the main thread to a node with a loop thread of
its own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from pykka_delivery import AsyncProducer, Producer
from pykka_delivery.coordinator import CoordinatorClient, announce_producer
from pykka_delivery.transport import Node, NodeSettings


def run(args: argparse.Namespace, payload: bytes) -> None:
    with Node(NodeSettings(port=args.port, token=args.token)) as node:
        producer = Producer(args.name, self_ref_factory=node.expose(args.name))
        client = directory(args, node)
        announce(node, args.name)
        started = None
        for number in range(1, args.count + 1):
            producer.send(number.to_bytes(8, "big") + payload[8:], timeout=args.timeout)
            if started is None:
                started = time.perf_counter()  # from the first accepted message
        producer.wait_confirmed(timeout=args.timeout)
        report(args.count, started, producer.statistics().resent)
        producer.close()
        if client is not None:
            client.close()


async def run_asyncio(args: argparse.Namespace, payload: bytes) -> None:
    async with Node(NodeSettings(port=args.port, token=args.token)) as node:
        producer = AsyncProducer(args.name, self_ref_factory=node.expose(args.name))
        client = await asyncio.to_thread(directory, args, node)  # blocking calls
        announce(node, args.name)
        started = None
        for number in range(1, args.count + 1):
            await producer.send(number.to_bytes(8, "big") + payload[8:], timeout=args.timeout)
            if started is None:
                started = time.perf_counter()
        await producer.wait_confirmed(timeout=args.timeout)
        report(args.count, started, producer.statistics().resent)
        producer.close()
        if client is not None:
            await asyncio.to_thread(client.close)


def directory(args: argparse.Namespace, node: Node) -> CoordinatorClient | None:
    """With ``--coordinator``: a client that announces the producer under ``--service``
    (the entry lives as long as the client)."""
    if not args.coordinator:
        return None
    client = CoordinatorClient(args.coordinator, node=node)
    announce_producer(client, args.service, node, args.name)
    return client


def announce(node: Node, name: str) -> None:
    print(json.dumps({"ready": True, "address": f"{node.address}/{name}"}), flush=True)


def report(count: int, started: float | None, resent: int) -> None:
    seconds = time.perf_counter() - (started or time.perf_counter())
    rate = round(count / seconds) if seconds else None
    summary = {"sent": count, "seconds": round(seconds, 3), "msgs_per_s": rate, "resent": resent}
    print(json.dumps(summary), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=7001)
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--name", default="orders", help="what the producer is exposed as")
    parser.add_argument("--payload-bytes", type=int, default=100)
    parser.add_argument("--token", default=None, help="shared secret of the nodes")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--asyncio", action="store_true", help="an asyncio service")
    parser.add_argument("--coordinator", default=None, help="announce it there (host:port)")
    parser.add_argument("--service", default="orders", help="the service key to announce under")
    args = parser.parse_args()
    payload = b"x" * args.payload_bytes
    if args.asyncio:
        asyncio.run(run_asyncio(args, payload))
    else:
        run(args, payload)


if __name__ == "__main__":
    main()
