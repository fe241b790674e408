"""One active consumer at a time: a stream handed over twice when its consumer is lost.

Three consumer services subscribe to one group through the coordinator (a
`CoordinatorActor` on a SQLite command log, served over gRPC). The producer announces
itself in the coordinator's directory under service ``orders`` (`announce_producer`) and
each service finds it there (`DirectoryProducers`): the coordinator's address is all any
of them is given. Only the active one consumes the producer's stream. When a third of
the messages is processed, the active service is cut off (its coordinator connection and
its transport node go, as when its process dies); after the coordinator's
``disconnected_timeout`` another service is made active and goes on from the first
message the lost one had not confirmed. A third of the way later the same happens again.

In the end every message was processed, each activation processed a run of consecutive
messages, and no two services were ever active at once. A message the lost service had
processed but not yet confirmed is processed again by the next one (at-least-once across a
crash, as in Akka). Everything runs in this process, on 127.0.0.1. Run with ``make demo``
or ``python examples/sac_demo.py --help``.
"""

from __future__ import annotations

import argparse
import itertools
import tempfile
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pykka

from pykka_delivery import Producer
from pykka_delivery.coordinator import (
    CoordinatedConsumer,
    CoordinatorActor,
    CoordinatorClient,
    CoordinatorServer,
    CoordinatorSettings,
    DirectoryProducers,
    SqliteCommandLog,
    announce_producer,
)
from pykka_delivery.transport import Node

GROUP = ("shop", "orders", "billing")
SERVICE = "orders"  # the directory key the producer is announced under
WAIT = 60.0
WORK = 0.0001  # seconds a service spends on a message, so that each loss lands mid-stream


class Service:
    """A consumer service: its own transport node and coordinator connection."""

    def __init__(self, name: str, coordinator: str) -> None:
        self.name = name
        self.node = Node().start()
        self.client = CoordinatorClient(coordinator, node=self.node.address, owner=name)
        self.producers = DirectoryProducers(self.client, SERVICE, self.node)
        self.consumer = CoordinatedConsumer(
            self.client, *GROUP, self.producers.producers, node=self.node
        )
        self.processed: list[tuple[int, int]] = []  # (activation, message)
        self.thread = threading.Thread(target=self._run, name=f"service-{name}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        for delivery in self.consumer:
            activation = len(self.consumer.intervals()) - 1
            time.sleep(WORK)  # the service's work on the message
            self.processed.append((activation, delivery.message))
            delivery.confirm()

    def lose(self) -> None:
        """Go away as a crashed process does: no goodbye to the coordinator."""
        self.client.close(goodbye=False)
        self.consumer.close(unregister=False)
        self.node.stop()
        self.thread.join(WAIT)

    def stop(self) -> None:
        self.consumer.close()
        self.producers.close()
        self.client.close()
        self.node.stop()
        self.thread.join(WAIT)


def run(count: int, timeout: float) -> bool:
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as folder:
        log = SqliteCommandLog(Path(folder) / "coordinator.sqlite")
        actor = CoordinatorActor.start(log, CoordinatorSettings(disconnected_timeout=timeout))
        server = CoordinatorServer(actor).start()
        producer_node = Node().start()
        producer = Producer("orders", self_ref_factory=producer_node.expose("orders"))
        producer_client = CoordinatorClient(server.address, node=producer_node, owner="producer")
        announce_producer(producer_client, SERVICE, producer_node, "orders")

        def send_all() -> None:
            for number in range(count):
                producer.send(number, timeout=WAIT)

        threading.Thread(target=send_all, name="producer", daemon=True).start()
        services = [Service(name, server.address) for name in ("A", "B", "C")]
        lost: list[str] = []
        try:
            for share in (count // 3, count * 2 // 3):
                wait_for(partial(reached, services, share))
                # The next service may still be taking over from the last one lost.
                wait_for(lambda: any(s.consumer.is_consuming for s in services))
                active = next(s for s in services if s.consumer.is_consuming)
                print(f"  {processed(services):>6} messages processed: losing {active.name}")
                active.lose()
                lost.append(active.name)
            wait_for(lambda: processed(services) >= count)
            producer.wait_confirmed(WAIT)
        finally:
            for service in services:
                if service.name not in lost:
                    service.stop()
            producer.close()
            producer_client.close()
            producer_node.stop()
            server.stop()
            pykka.ActorRegistry.stop_all()
    return report(services, count, time.monotonic() - started)


def processed(services: list[Service]) -> int:
    return len({m for s in services for _, m in s.processed})


def reached(services: list[Service], share: int) -> bool:
    return processed(services) >= share


def wait_for(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the demo made no progress for a minute")
        time.sleep(0.01)


def report(services: list[Service], count: int, seconds: float) -> bool:
    intervals = sorted(
        ((interval, s.name) for s in services for interval in s.consumer.intervals()),
        key=lambda pair: pair[0].start,
    )
    print(f"\n  activations of group {'/'.join(GROUP)} (seconds from the first):")
    origin = intervals[0][0].start
    runs_ok = True
    for s in services:
        for number, interval in enumerate(s.consumer.intervals()):
            messages = [m for a, m in s.processed if a == number]
            if messages:  # an activation may end before its first message
                runs_ok &= messages == list(range(messages[0], messages[0] + len(messages)))
            end = "…" if interval.end is None else f"{interval.end - origin:7.3f}"
            span = f"{messages[0]} to {messages[-1]}" if messages else "none"
            print(
                f"    {s.name}: {interval.start - origin:7.3f} to {end}  "
                f"{len(messages):>6} messages, {span}"
            )
    overlap = any(
        a[0].end is None or a[0].end > b[0].start for a, b in itertools.pairwise(intervals)
    )
    everything = {m for s in services for _, m in s.processed} == set(range(count))
    again = sum(len(s.processed) for s in services) - count
    print(f"\n  every message processed: {everything}")
    print(f"  each activation a run of consecutive messages: {runs_ok}")
    print(f"  two services active at once: {overlap}")
    print(f"  processed again after a loss (unconfirmed when it was lost): {again}")
    print(f"  {seconds:.1f} s in all")
    return everything and runs_ok and not overlap


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=30_000, help="messages to send")
    parser.add_argument(
        "--timeout", type=float, default=1.0, help="the coordinator's disconnected_timeout, s"
    )
    args = parser.parse_args()
    print(f"Single active consumer: {args.count} messages, three consumer services")
    if not run(args.count, args.timeout):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
