"""Fencing epochs at the handles (issue 21): two consumers of one producer, epochs 1 and
2. Once the epoch-2 one registered, the epoch-1 one is shut out: its calls raise
`ConsumerFenced` and nothing sent after the take-over reaches it. Both flavours, on local
refs and across two gRPC nodes; and the deduplication store's ``fence`` hook.

The older consumer is paused (it calls nothing) while the newer one registers, so what
each processed is known without a race: what the older one confirmed but had not told
the producer yet is delivered again to the newer one, as with any hand-over (the
deduplication store is what refuses its late writes).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from pykka_delivery import Consumer, ConsumerControllerSettings, Producer
from pykka_delivery.delivery.stores.dedup import MemoryDedupStore
from pykka_delivery.errors import ConsumerFenced
from pykka_delivery.protocol.messages import Ack, Request
from pykka_delivery.transport import Node
from tests.delivery.handles.flavours import NO_RETRY, WAIT, Flavour, receive_and_confirm
from tests.harness import wait_until

FAST = ConsumerControllerSettings(
    flow_control_window=20, resend_interval_min=0.05, resend_interval_max=0.2
)


def take_over(flavour: Flavour) -> tuple[Any, Any, Any, list[Any]]:
    """A producer, an epoch-1 consumer that processed m0 and m1, then an epoch-2 consumer
    registered. Returns (producer, old, new, what the old one processed)."""
    producer = flavour.producer("p-1")
    old = flavour.consumer(NO_RETRY, epoch=1)
    old.register_to(producer.ref)
    old_processed = []
    for n in range(2):  # the consumer side processes its inbox only when called
        producer.send(f"m{n}", timeout=WAIT)
        old_processed += receive_and_confirm(old, 1)
    new = flavour.consumer(NO_RETRY, epoch=2)
    new.register_to(producer.ref)
    flavour.settle()
    return producer, old, new, old_processed


def test_the_older_consumer_gets_consumer_fenced_once_a_newer_one_registered(
    flavour: Flavour,
) -> None:
    _, old, _, _ = take_over(flavour)

    with pytest.raises(ConsumerFenced) as raised:
        old.receive(timeout=WAIT)

    assert (raised.value.epoch, raised.value.newer_epoch) == (1, 2)


def test_a_fenced_consumer_keeps_raising_consumer_fenced(flavour: Flavour) -> None:
    _, old, _, _ = take_over(flavour)
    with pytest.raises(ConsumerFenced):
        old.receive(timeout=WAIT)

    with pytest.raises(ConsumerFenced):
        old.receive(timeout=WAIT)
    with pytest.raises(ConsumerFenced):
        next(iter(old))


def test_no_message_sent_after_the_take_over_is_processed_by_the_older_consumer(
    flavour: Flavour,
) -> None:
    producer, old, new, old_processed = take_over(flavour)

    new_processed = receive_and_confirm(new, 1)  # m1 again: its confirmation was not told
    for n in range(2, 6):
        producer.send(f"m{n}", timeout=WAIT)
        new_processed += receive_and_confirm(new, 1)
    with pytest.raises(ConsumerFenced):
        old.receive(timeout=WAIT)

    assert old_processed == ["m0", "m1"]
    assert new_processed == ["m1", "m2", "m3", "m4", "m5"]


def test_the_producer_ignores_and_counts_late_confirmations_of_the_older_consumer(
    flavour: Flavour,
) -> None:
    producer, _, _, _ = take_over(flavour)

    producer.ref.tell(Request(2, 40, True, False, 1))  # late, from the older consumer
    producer.ref.tell(Ack(2, 1))
    flavour.settle()

    assert producer.statistics().fenced == 2
    assert producer.snapshot().confirmed_seq_nr == 1  # what the newer one confirmed: none


def test_a_consumer_of_a_lower_epoch_than_the_producer_serves_is_refused(
    flavour: Flavour,
) -> None:
    producer = flavour.producer("p-1")
    current = flavour.consumer(NO_RETRY, epoch=5)
    current.register_to(producer.ref)
    producer.send("m0", timeout=WAIT)
    assert receive_and_confirm(current, 1) == ["m0"]

    stale = flavour.consumer(NO_RETRY, epoch=4)
    stale.register_to(producer.ref)
    with pytest.raises(ConsumerFenced) as raised:
        stale.receive(timeout=WAIT)
    producer.send("m1", timeout=WAIT)

    assert (raised.value.epoch, raised.value.newer_epoch) == (4, 5)
    assert receive_and_confirm(current, 1) == ["m1"]


@pytest.mark.parametrize(
    ("epoch", "error"), [(-1, ValueError), ("1", TypeError), (True, TypeError)]
)
def test_a_consumer_refuses_an_epoch_that_is_not_an_int_from_zero(
    flavour: Flavour, epoch: Any, error: type[Exception]
) -> None:
    with pytest.raises(error, match="epoch must be"):
        flavour.consumer(NO_RETRY, epoch=epoch)


# --- the deduplication store's fence hook -------------------------------------------------


class FencingStore(MemoryDedupStore):
    """A memory store that records the calls the consumer makes in order."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.order: list[str] = []

    def fence(self, epoch: int) -> None:
        self.order.append(f"fence {epoch}")
        super().fence(epoch)

    def load(self) -> dict[str, int]:
        self.order.append("load")
        return super().load()


class NoFenceStore:
    """A user's own store, written before fencing: load, record, flush, close only."""

    def load(self) -> dict[str, int]:
        return {}

    def record(self, producer_id: str, seq_nr: int) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_a_consumer_fences_its_store_before_it_loads_positions(flavour: Flavour) -> None:
    store = FencingStore()

    flavour.consumer(NO_RETRY, dedup_store=store, epoch=3)

    assert store.order == ["fence 3", "load"]


def test_a_consumer_of_epoch_zero_does_not_fence_its_store(flavour: Flavour) -> None:
    store = FencingStore()

    flavour.consumer(NO_RETRY, dedup_store=store)

    assert store.order == ["load"]


def test_a_store_holding_a_newer_epoch_fails_the_consumers_construction(
    flavour: Flavour,
) -> None:
    store = MemoryDedupStore(epoch=7)

    with pytest.raises(ConsumerFenced):
        flavour.consumer(NO_RETRY, dedup_store=store, epoch=6)


def test_a_store_without_fence_is_used_as_it_is(flavour: Flavour) -> None:
    producer = flavour.producer("p-1")
    consumer = flavour.consumer(NO_RETRY, dedup_store=NoFenceStore(), epoch=3)
    consumer.register_to(producer.ref)
    producer.send("m0", timeout=WAIT)

    assert receive_and_confirm(consumer, 1) == ["m0"]


class RefusingStore(NoFenceStore):
    """A store fenced out by a newer activation meanwhile: every flush is refused."""

    def flush(self) -> None:
        msg = "store: consumer id fenced at epoch 9 by a newer activation"
        raise ConsumerFenced(msg, 3, 9)


def test_a_write_the_store_refuses_as_fenced_fences_the_consumer(flavour: Flavour) -> None:
    producer = flavour.producer("p-1")
    consumer = flavour.consumer(NO_RETRY, dedup_store=RefusingStore(), epoch=3)
    consumer.register_to(producer.ref)
    producer.send("m0", timeout=WAIT)
    delivery = consumer.receive(timeout=WAIT)

    with pytest.raises(ConsumerFenced):
        delivery.confirm()  # the first confirmation is told at once: flushed first

    with pytest.raises(ConsumerFenced) as raised:
        consumer.receive(timeout=WAIT)
    assert raised.value.newer_epoch == 9
    assert producer.snapshot().confirmed_seq_nr == 0


# --- across gRPC nodes ------------------------------------------------------------------


@pytest.fixture
def nodes() -> Iterator[tuple[Node, Node]]:
    a, b = Node().start(), Node().start()
    try:
        yield a, b
    finally:
        a.stop()
        b.stop()


def test_across_nodes_the_older_consumer_is_fenced_and_the_newer_gets_the_rest(
    nodes: tuple[Node, Node],
) -> None:
    a, b = nodes
    producer = Producer("orders", self_ref_factory=a.expose("orders"))
    old = Consumer(FAST, self_ref_factory=b.expose("c1"), epoch=1)
    new = Consumer(FAST, self_ref_factory=b.expose("c2"), epoch=2)
    try:
        old.register_to(b.ref(f"{a.address}/orders"))
        old_processed: list[Any] = []
        for n in range(3):
            producer.send(f"m{n}", timeout=WAIT)
            old_processed += receive_and_confirm(old, 1)

        new.register_to(b.ref(f"{a.address}/orders"))
        wait_until(lambda: producer.snapshot().epoch == 2, timeout=WAIT)
        for n in range(3, 6):
            producer.send(f"m{n}", timeout=WAIT)
        with pytest.raises(ConsumerFenced):
            old.receive(timeout=WAIT)
        new_processed: list[Any] = []
        while "m5" not in new_processed:
            new_processed += receive_and_confirm(new, 1)

        assert old_processed == ["m0", "m1", "m2"]
        assert new_processed[-3:] == ["m3", "m4", "m5"]
        assert set(new_processed[:-3]) <= {"m1", "m2"}  # what old had not told yet
    finally:
        old.close()
        new.close()
        producer.close()
