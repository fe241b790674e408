"""`CoordinatedConsumer` over a `ProducerSet`: each activation consumes every producer of
the set through one `MergedConsumer`, against a real `CoordinatorServer`, with the
producers on a transport node of their own."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pykka_delivery import ProducerSet
from pykka_delivery.coordinator import CoordinatedConsumer, CoordinatorClient, GroupId
from pykka_delivery.delivery.core.settings import (
    ConsumerControllerSettings,
    ProducerControllerSettings,
)
from pykka_delivery.delivery.handles.producer import Producer
from pykka_delivery.delivery.stores.dedup import MemoryDedupStore, SqliteDedupStore
from pykka_delivery.delivery.stores.dedup_base import DedupStoreError
from pykka_delivery.errors import ClosedError
from pykka_delivery.transport.node import Node
from tests.coordinator.servers import Clients
from tests.harness import wait_until

WAIT = 10.0
COUNT = 300
GROUP = GroupId("test", "orders-1", "billing")
CONSUMER = ConsumerControllerSettings(
    flow_control_window=20, resend_interval_min=0.05, resend_interval_max=0.2
)


class Producers:
    """Producers exposed on the producer node under their ids, and the `ProducerSet` a
    consumer on the other node follows; each sends 0..count-1 from a thread."""

    def __init__(self, nodes: tuple[Node, Node]) -> None:
        self.producer_node, self.consumer_node = nodes
        self.set = ProducerSet()
        self.made: dict[str, Producer] = {}
        self.senders: list[threading.Thread] = []

    def add(self, producer_id: str, count: int = COUNT) -> Producer:
        producer = Producer(
            producer_id,
            ProducerControllerSettings(resend_first_interval=0.05),
            self_ref_factory=self.producer_node.expose(producer_id),
        )
        self.made[producer_id] = producer
        address = self.producer_node.address
        self.set.set({p: self.consumer_node.ref(f"{address}/{p}") for p in self.made})
        sender = threading.Thread(
            target=producer.send_many, args=(list(range(count)), WAIT * 3), daemon=True
        )
        sender.start()
        self.senders.append(sender)
        return producer

    def close(self) -> None:
        for sender in self.senders:
            sender.join(WAIT)
        for producer in self.made.values():
            producer.close()


@pytest.fixture
def producers(nodes: tuple[Node, Node]) -> Iterator[Producers]:
    made = Producers(nodes)
    yield made
    made.close()


def coordinated(
    client: CoordinatorClient, producers: Producers, **kwargs: Any
) -> CoordinatedConsumer:
    return CoordinatedConsumer(
        client,
        GROUP.namespace,
        GROUP.stream,
        GROUP.name,
        producers.set,
        partition_index=1,
        settings=CONSUMER,
        node=producers.consumer_node,
        **kwargs,
    )


class Ledger:
    """What every consumer processed: ``(consumer, producer id, message)``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.entries: list[tuple[str, str, int]] = []

    def run(
        self, name: str, consumer: CoordinatedConsumer, stop_after: int = 0
    ) -> threading.Thread:
        """Consume on a thread; with ``stop_after``, close after that many deliveries."""

        def consume() -> None:
            with contextlib.suppress(ClosedError):
                for done, delivery in enumerate(consumer, start=1):
                    with self.lock:
                        self.entries.append((name, delivery.producer_id, delivery.message))
                    delivery.confirm()
                    if done == stop_after:
                        consumer.close()

        thread = threading.Thread(target=consume, daemon=True)
        thread.start()
        return thread

    def of(self, producer_id: str) -> list[int]:
        with self.lock:
            return [m for _, p, m in self.entries if p == producer_id]

    def by(self, name: str) -> int:
        with self.lock:
            return sum(1 for n, _, _ in self.entries if n == name)


def test_a_hand_over_keeps_each_producers_order_with_no_duplicates(
    clients: Clients, producers: Producers, tmp_path: Path
) -> None:
    def store() -> SqliteDedupStore:
        return SqliteDedupStore(tmp_path / "dedup.db", "billing")

    a, b = producers.add("orders-1@web-a"), producers.add("orders-1@web-b")
    ledger = Ledger()
    first = coordinated(clients(), producers, dedup_store=store)
    second = coordinated(clients(), producers, dedup_store=store)  # waits for its turn
    second_thread = ledger.run("second", second)
    first_thread = ledger.run("first", first, stop_after=100)  # then hands the group over
    wait_until(
        lambda: len(ledger.of(a.producer_id)) == COUNT and len(ledger.of(b.producer_id)) == COUNT,
        "every message processed",
    )

    a.wait_confirmed(timeout=WAIT)
    b.wait_confirmed(timeout=WAIT)
    for consumer, thread in ((first, first_thread), (second, second_thread)):
        consumer.close()
        thread.join(WAIT)
    assert ledger.of(a.producer_id) == list(range(COUNT))
    assert ledger.of(b.producer_id) == list(range(COUNT))
    assert ledger.by("first") == 100
    intervals = sorted((i for c in (first, second) for i in c.intervals()), key=lambda i: i.start)
    for before, after in itertools.pairwise(intervals):
        assert before.end is not None and before.end <= after.start


def test_a_producer_added_mid_stream_is_consumed_in_the_same_activation(
    clients: Clients, producers: Producers
) -> None:
    a = producers.add("orders-1@web-a", count=50)
    ledger = Ledger()
    consumer = coordinated(clients(), producers)
    thread = ledger.run("only", consumer)
    wait_until(lambda: len(ledger.of(a.producer_id)) == 50, "the first producer consumed")

    b = producers.add("orders-1@web-b", count=50)
    wait_until(lambda: len(ledger.of(b.producer_id)) == 50, "the added producer consumed")

    assert ledger.of(b.producer_id) == list(range(50))
    assert len(consumer.intervals()) == 1
    consumer.close()
    thread.join(WAIT)


def test_positions_report_one_row_per_producer(clients: Clients, producers: Producers) -> None:
    a = producers.add("orders-1@web-a", count=3)
    b = producers.add("orders-1@web-b", count=3)
    consumer = coordinated(clients(), producers)
    held = []
    for _ in range(6):
        delivery = consumer.receive(timeout=WAIT)
        held.append(delivery)
        delivery.confirm()

    positions = consumer._positions()

    assert sorted((p.producer_id, p.received, p.confirmed) for p in positions) == [
        (a.producer_id, 3, 3),
        (b.producer_id, 3, 3),
    ]
    consumer.close()


class GivesUpOnce:
    """A dedup store per activation, starting from the last one's positions; recording
    ``seq_nr`` fails every attempt in the first, so that consumer gives up and stops."""

    def __init__(self, seq_nr: int) -> None:
        self.seq_nr = seq_nr
        self.opened: list[MemoryDedupStore] = []

    def __call__(self) -> MemoryDedupStore:
        failing = not self.opened
        positions = dict(self.opened[-1].positions) if self.opened else {}

        def fail_when(op: str, arg: object) -> bool:
            return failing and op == "record" and isinstance(arg, tuple) and arg[1] == self.seq_nr

        store = MemoryDedupStore(positions, fail_when=fail_when)
        self.opened.append(store)
        return store


@pytest.mark.parametrize("merged", [True, False], ids=["producer set", "one producer"])
def test_a_consumer_whose_store_gives_up_is_replaced_and_continues_from_the_unconfirmed(
    clients: Clients, producers: Producers, merged: bool
) -> None:
    """The store failing every attempt to record a confirmation stops the activation's
    consumer: `confirm` raises, and the next `receive` starts a new consumer (a new store)
    while the subscription is still active, which gets the message again; not a
    `LocalProtocolError` (the delivery stuck "in flight") nor a spin on the stopped one."""
    producers.add("p1", 40)
    source = producers.set if merged else producers.set.current()["p1"]
    stores = GivesUpOnce(seq_nr=5)
    consumer = CoordinatedConsumer(
        clients(),
        GROUP.namespace,
        GROUP.stream,
        GROUP.name,
        source,
        partition_index=1,
        settings=dataclasses.replace(CONSUMER, dedup_store_backoff=0.001),
        node=producers.consumer_node,
        dedup_store=stores,
    )
    seen: list[int] = []
    failures = 0
    try:
        while len(set(seen)) < 40:
            delivery = consumer.receive(WAIT)
            try:
                delivery.confirm()
            except DedupStoreError:
                failures += 1
                continue
            seen.append(delivery.message)
    finally:
        consumer.close()
    assert failures == 1
    assert seen == list(range(40))  # 4 again after the new consumer: none lost or doubled
    assert len(stores.opened) == 2
    assert len(consumer.intervals()) == 2
