"""Producer service: sends numbered messages reliably to a consumer in another process.

    python examples/remote_producer.py --port 7001 --count 100000

It starts a node on 127.0.0.1:PORT and exposes its `Producer` as ``orders``. Start the
consumer service (examples/remote_consumer.py) against ``127.0.0.1:PORT/orders``, in any
order: the producer waits for demand. It prints one JSON line when every message is
confirmed.
"""

from __future__ import annotations

import argparse
import json
import time

from pykka_delivery import Producer
from pykka_delivery.transport import Node, NodeSettings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=7001)
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--name", default="orders", help="what the producer is exposed as")
    parser.add_argument("--payload-bytes", type=int, default=100)
    parser.add_argument("--token", default=None, help="shared secret of the nodes")
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    payload = b"x" * args.payload_bytes
    with Node(NodeSettings(port=args.port, token=args.token)) as node:
        producer = Producer(args.name, self_ref_factory=node.expose(args.name))
        print(json.dumps({"ready": True, "address": f"{node.address}/{args.name}"}), flush=True)
        started = None
        for number in range(1, args.count + 1):
            producer.send(number.to_bytes(8, "big") + payload[8:], timeout=args.timeout)
            if started is None:
                started = time.perf_counter()  # from the first accepted message
        producer.wait_confirmed(timeout=args.timeout)
        seconds = time.perf_counter() - (started or time.perf_counter())
        stats = producer.statistics()
        print(
            json.dumps(
                {
                    "sent": args.count,
                    "seconds": round(seconds, 3),
                    "msgs_per_s": round(args.count / seconds) if seconds else None,
                    "resent": stats.resent,
                }
            ),
            flush=True,
        )
        producer.close()


if __name__ == "__main__":
    main()
