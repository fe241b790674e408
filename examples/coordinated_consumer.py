"""A consumer service with replicas: one of them consumes at a time, the others wait.

    pykka-delivery coordinator serve --store coordinator.sqlite --port 7070
    python examples/remote_producer.py --port 7001 --count 100000 \\
        --coordinator 127.0.0.1:7070
    python examples/coordinated_consumer.py --coordinator 127.0.0.1:7070
    python examples/coordinated_consumer.py --coordinator 127.0.0.1:7070  # a 2nd: it waits

The producer announces itself in the coordinator's directory under service ``orders``
(``--service``); each replica follows that service's producers (`DirectoryProducers`), so
the coordinator's address is all it is given. Every replica registers in group "billing"
of stream "orders" (namespace "shop") with the coordinator; the coordinator makes one
active. Stop the active one (Ctrl-C, or SIGTERM) and another takes over from the first
message the stopped one had not confirmed; `pykka-delivery groups` shows who is active,
`pykka-delivery lag` how far behind it is.

It prints JSON lines: ``{"ready": ...}`` once registered, ``{"activated": ...}`` and
``{"deactivated": ...}`` as the coordinator hands the stream over, and at the end
``{"processed": n, "first": f, "last": l}`` (the numbers it confirmed, the first 8 bytes
of each payload, as examples/remote_producer.py sends them).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading

from pykka_delivery.coordinator import (
    ActivationInterval,
    CoordinatedConsumer,
    CoordinatorClient,
    DirectoryProducers,
)
from pykka_delivery.transport import Node


def say(**fields: object) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")  # one write: hooks print from other threads
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--coordinator", default="127.0.0.1:7070", help="its host:port")
    parser.add_argument("--service", default="orders", help="the producers' service key")
    parser.add_argument("--count", type=int, default=0, help="stop after this number (0: never)")
    args = parser.parse_args()

    def activated(interval: ActivationInterval) -> None:  # called when consuming starts
        say(activated=interval.start)

    def deactivated(interval: ActivationInterval) -> None:  # and when it stops
        say(deactivated=interval.end)

    with (
        Node() as node,
        CoordinatorClient(args.coordinator, node=node) as client,
        DirectoryProducers(client, args.service, node) as producers,
    ):
        consumer = CoordinatedConsumer(
            client,
            "shop",  # namespace: one application's groups and streams
            "orders",  # stream: the name the groups of this stream share
            "billing",  # group: the replicas of one service; one is active at a time
            producers.producers,  # every producer announced under the service, as they change
            node=node,  # each activation's consumer is exposed on this node
            on_activated=activated,
            on_deactivated=deactivated,
        )
        # Stopping from another thread: close() ends the loop below (a signal handler
        # hands it to a thread of its own, as the loop's thread may hold the consumer).
        stop = threading.Thread(target=consumer.close)

        def request_stop(*_: object) -> None:
            if stop.ident is None:  # a second signal (Ctrl-C twice): already stopping
                stop.start()

        signal.signal(signal.SIGTERM, request_stop)
        signal.signal(signal.SIGINT, request_stop)
        say(ready=True, group=str(consumer.group), node=node.address)
        numbers = []
        for delivery in consumer:  # waits while another replica is active
            numbers.append(int.from_bytes(delivery.message[:8], "big"))
            delivery.confirm()
            if numbers[-1] == args.count:
                break
        consumer.close()
        say(processed=len(numbers), first=min(numbers, default=0), last=max(numbers, default=0))


if __name__ == "__main__":
    main()
