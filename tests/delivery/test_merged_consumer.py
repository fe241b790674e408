"""`MergedConsumer`: several producers' streams at one ref, one delivery at a time, and
the `ProducerSet` it follows.

Two kinds of producers: real `Producer` handles in this process, and `Probe` refs that
play a producer whose messages the test tells the consumer by hand (so what is in each
inner consumer's inbox, and in which order, is known exactly).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pykka_delivery import MergedConsumer, ProducerSet
from pykka_delivery.delivery.core.settings import (
    ConsumerControllerSettings,
    ProducerControllerSettings,
)
from pykka_delivery.delivery.handles.consumer import Consumer
from pykka_delivery.delivery.handles.producer import Producer
from pykka_delivery.delivery.messages import Delivery
from pykka_delivery.delivery.stores.dedup import DedupStore, MemoryDedupStore, SqliteDedupStore
from pykka_delivery.delivery.timers import TimerService
from pykka_delivery.errors import (
    ClosedError,
    ConsumerFenced,
    DeliveryTimeout,
    LocalProtocolError,
)
from pykka_delivery.protocol.messages import Ack, RegisterConsumer, SequencedMessage
from pykka_delivery.transport.local import LossyRef
from tests.harness import Probe, wait_until

WAIT = 10.0  # bound on every wait expected to succeed
SHORT = 0.05  # a receive that must find nothing (bounded, not a synchronisation)
CONSUMER = ConsumerControllerSettings(resend_interval_min=0.05, resend_interval_max=0.2)
FAST_PRODUCER = ProducerControllerSettings(resend_first_interval=0.05)


@pytest.fixture
def timers() -> Iterator[TimerService]:
    service = TimerService(name="test-merged-timers")
    yield service
    service.shutdown()


@pytest.fixture
def closing() -> Iterator[list[Any]]:
    """Handles a test made, closed after it (in reverse order) even when it fails."""
    made: list[Any] = []
    yield made
    for handle in reversed(made):
        handle.close()


@pytest.fixture
def make_merged(timers: TimerService, closing: list[Any]) -> Callable[..., MergedConsumer]:
    def make(**kwargs: Any) -> MergedConsumer:
        merged = MergedConsumer(CONSUMER, timer_service=timers, **kwargs)
        closing.append(merged)
        return merged

    return make


@pytest.fixture
def make_producer(timers: TimerService, closing: list[Any]) -> Callable[[str], Producer]:
    def make(producer_id: str) -> Producer:
        producer = Producer(producer_id, FAST_PRODUCER, timer_service=timers)
        closing.append(producer)
        return producer

    return make


def send_in_background(producer: Producer, messages: list[Any]) -> threading.Thread:
    """Send from a thread: a producer waits for the consumer's demand."""
    sender = threading.Thread(target=producer.send_many, args=(messages, WAIT), daemon=True)
    sender.start()
    return sender


def consume(merged: MergedConsumer, count: int) -> list[tuple[str, Any]]:
    got = []
    for _ in range(count):
        delivery = merged.receive(timeout=WAIT)
        got.append((delivery.producer_id, delivery.message))
        delivery.confirm()
    return got


def of(got: list[tuple[str, Any]], producer_id: str) -> list[Any]:
    return [message for p, message in got if p == producer_id]


def tell(merged: MergedConsumer, probe: Probe, producer_id: str, seq_nrs: range) -> None:
    """Play producer ``producer_id`` (its controller ``probe``): tell its messages."""
    for seq_nr in seq_nrs:
        message = SequencedMessage(
            producer_id, seq_nr, f"{producer_id}-{seq_nr}", seq_nr == 1, False, probe
        )
        merged.ref.tell(message)


# --- consuming several producers --------------------------------------------------------


@pytest.mark.parametrize("count", [2, 3])
def test_every_producers_messages_are_delivered_once_each_in_order(
    count: int, make_merged: Callable[..., MergedConsumer], make_producer: Callable[[str], Producer]
) -> None:
    producers = [make_producer(f"orders@web-{i}") for i in range(count)]
    merged = make_merged()
    merged.register_to(ProducerSet({p.producer_id: p.ref for p in producers}))
    senders = [send_in_background(p, list(range(60))) for p in producers]

    got = consume(merged, 60 * count)

    for producer in producers:
        assert of(got, producer.producer_id) == list(range(60))
    for sender in senders:
        sender.join(WAIT)
    merged.close()
    for producer in producers:
        producer.wait_confirmed(timeout=WAIT)


def test_producers_with_deliveries_ready_take_turns(
    make_merged: Callable[..., MergedConsumer],
) -> None:
    busy, quiet = Probe("busy"), Probe("quiet")
    merged = make_merged()
    merged.register_to(ProducerSet({"busy": busy, "quiet": quiet}))
    tell(merged, busy, "busy", range(1, 21))
    tell(merged, quiet, "quiet", range(1, 4))

    got = [producer_id for producer_id, _ in consume(merged, 23)]

    assert got[:6] in (["busy", "quiet"] * 3, ["quiet", "busy"] * 3)
    assert got[6:] == ["busy"] * 17


def test_a_second_receive_before_the_confirmation_is_refused_whoever_has_messages(
    make_merged: Callable[..., MergedConsumer],
) -> None:
    one, two = Probe("one"), Probe("two")
    merged = make_merged()
    merged.register_to(ProducerSet({"one": one, "two": two}))
    tell(merged, one, "one", range(1, 3))
    tell(merged, two, "two", range(1, 3))
    held = merged.receive(timeout=WAIT)

    with pytest.raises(LocalProtocolError, match="not confirmed yet"):
        merged.receive(timeout=SHORT)

    held.confirm()
    assert merged.receive(timeout=WAIT).producer_id != held.producer_id


def test_a_message_of_a_producer_not_in_the_set_is_dropped_and_counted(
    make_merged: Callable[..., MergedConsumer],
) -> None:
    known, stranger = Probe("known"), Probe("stranger")
    merged = make_merged()
    merged.register_to(ProducerSet({"known": known}))

    tell(merged, stranger, "stranger", range(1, 4))

    with pytest.raises(DeliveryTimeout):
        merged.receive(timeout=SHORT)
    assert merged.statistics().dropped == 3


# --- following the set --------------------------------------------------------------------


def test_a_producer_added_while_receive_waits_is_consumed(
    make_merged: Callable[..., MergedConsumer], make_producer: Callable[[str], Producer]
) -> None:
    first, second = make_producer("first"), make_producer("second")
    producers = ProducerSet({"first": first.ref})
    merged = make_merged()
    merged.register_to(producers)
    received: list[Delivery] = []
    receiver = threading.Thread(target=lambda: received.append(merged.receive(timeout=WAIT)))
    receiver.start()

    producers.set({"first": first.ref, "second": second.ref})
    sender = send_in_background(second, ["hello"])
    receiver.join(WAIT)

    assert [(d.producer_id, d.message) for d in received] == [("second", "hello")]
    received[0].confirm()
    sender.join(WAIT)


def test_a_removed_producer_gets_its_ack_once_the_consumer_applies_the_change(
    make_merged: Callable[..., MergedConsumer], make_producer: Callable[[str], Producer]
) -> None:
    staying, leaving = make_producer("staying"), make_producer("leaving")
    producers = ProducerSet({"staying": staying.ref, "leaving": leaving.ref})
    merged = make_merged()
    merged.register_to(producers)
    senders = [send_in_background(p, [1, 2, 3]) for p in (staying, leaving)]
    consume(merged, 6)
    for sender in senders:
        sender.join(WAIT)
    with pytest.raises(DeliveryTimeout):  # confirmed, but not told yet (half a window)
        leaving.wait_confirmed(timeout=SHORT)

    producers.set({"staying": staying.ref})
    with pytest.raises(DeliveryTimeout):
        merged.receive(timeout=SHORT)  # applies the change

    leaving.wait_confirmed(timeout=WAIT)
    assert [s.producer_id for s in merged.snapshots()] == ["staying"]


def test_a_removed_producer_with_its_delivery_in_flight_is_closed_only_after_the_confirm(
    make_merged: Callable[..., MergedConsumer],
) -> None:
    staying, leaving = Probe("staying"), Probe("leaving")
    producers = ProducerSet({"staying": staying, "leaving": leaving})
    merged = make_merged()
    merged.register_to(producers)
    tell(merged, leaving, "leaving", range(1, 2))
    held = merged.receive(timeout=WAIT)

    producers.set({"staying": staying})

    assert sorted(s.producer_id for s in merged.snapshots()) == ["leaving", "staying"]
    assert not any(type(m) is Ack for m in leaving.messages)
    held.confirm()
    with pytest.raises(DeliveryTimeout):
        merged.receive(timeout=SHORT)
    assert [s.producer_id for s in merged.snapshots()] == ["staying"]
    assert [m.confirmed_seq_nr for m in leaving.messages if type(m) is Ack] == [1]


def test_a_producer_whose_ref_changed_is_registered_to_again(
    make_merged: Callable[..., MergedConsumer],
) -> None:
    old, new = Probe("old"), Probe("new")
    producers = ProducerSet({"orders": old})
    merged = make_merged()
    merged.register_to(producers)

    producers.set({"orders": new})
    with pytest.raises(DeliveryTimeout):
        merged.receive(timeout=SHORT)

    assert any(type(m) is RegisterConsumer for m in new.messages)


# --- deduplication, fencing, losses, closing -----------------------------------------------


@pytest.fixture(params=["memory", "sqlite"])
def open_store(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[[], DedupStore]]:
    """Opens the store a (restarted) consumer uses; an SQLite one closes the one before
    (one writer per consumer id), a memory one is the same store each time."""
    opened: list[DedupStore] = []
    shared = MemoryDedupStore()

    def open_store() -> DedupStore:
        if request.param == "memory":
            return shared
        for store in opened:
            store.close()
        opened.append(SqliteDedupStore(tmp_path / "d.db", "c"))
        return opened[-1]

    yield open_store
    for store in opened:
        store.close()


def test_a_restarted_merged_consumer_skips_what_was_confirmed_per_producer(
    make_merged: Callable[..., MergedConsumer], open_store: Callable[[], DedupStore]
) -> None:
    a, b = Probe("a"), Probe("b")
    before = make_merged(dedup_store=open_store())
    before.register_to(ProducerSet({"a": a, "b": b}))
    tell(before, a, "a", range(1, 3))
    tell(before, b, "b", range(1, 2))
    consume(before, 3)
    before.close()

    after = make_merged(dedup_store=open_store())
    after.register_to(ProducerSet({"a": a, "b": b}))
    tell(after, a, "a", range(1, 4))  # the producers resend from their first unconfirmed
    tell(after, b, "b", range(1, 3))
    got = consume(after, 2)

    assert sorted(got) == [("a", "a-3"), ("b", "b-2")]
    with pytest.raises(DeliveryTimeout):
        after.receive(timeout=SHORT)
    after.close()  # before its store


def test_a_newer_activation_of_one_producer_fences_the_whole_merged_consumer(
    make_merged: Callable[..., MergedConsumer],
    make_producer: Callable[[str], Producer],
    closing: list[Any],
) -> None:
    a, b = make_producer("a"), make_producer("b")
    merged = make_merged(epoch=1)
    merged.register_to(ProducerSet({"a": a.ref, "b": b.ref}))
    newer = Consumer(CONSUMER, epoch=2)
    closing.append(newer)

    newer.register_to(a.ref)

    with pytest.raises(ConsumerFenced):
        merged.receive(timeout=WAIT)
    with pytest.raises(ConsumerFenced):
        merged.receive(timeout=SHORT)
    assert merged.snapshots() == []


def test_a_store_fenced_at_a_newer_epoch_refuses_the_merged_consumer() -> None:
    store = MemoryDedupStore()
    store.fence(3)

    with pytest.raises(ConsumerFenced):
        MergedConsumer(dedup_store=store, epoch=2)


def test_through_a_lossy_link_every_message_arrives_in_order_per_producer(
    make_merged: Callable[..., MergedConsumer], make_producer: Callable[[str], Producer]
) -> None:
    producers = [make_producer(name) for name in ("a", "b", "c")]
    merged = make_merged(
        self_ref_factory=lambda e: LossyRef(e, drop=0.2, types=(SequencedMessage,), seed=7)
    )
    merged.register_to(ProducerSet({p.producer_id: p.ref for p in producers}))
    senders = [send_in_background(p, list(range(100))) for p in producers]

    got = consume(merged, 300)

    for producer in producers:
        assert of(got, producer.producer_id) == list(range(100))
    assert merged.statistics().gaps > 0
    for sender in senders:
        sender.join(WAIT)


def test_the_inner_consumers_timers_run_while_receive_waits(
    make_merged: Callable[..., MergedConsumer],
) -> None:
    silent = Probe("silent")
    merged = make_merged()
    merged.register_to(ProducerSet({"silent": silent}))
    receiver = threading.Thread(target=_receive_until_closed, args=(merged,))
    receiver.start()

    # The registration is repeated by a retry timer until the producer answers.
    wait_until(
        lambda: sum(type(m) is RegisterConsumer for m in list(silent.messages)) >= 3,
        "the registration repeated while receive waits",
        timeout=WAIT / 2,
    )
    merged.close()
    receiver.join(WAIT)


def _receive_until_closed(merged: MergedConsumer) -> None:
    with contextlib.suppress(ClosedError, DeliveryTimeout):
        merged.receive(timeout=WAIT)


def test_close_while_another_thread_waits_in_receive_raises_closed_error_there(
    make_merged: Callable[..., MergedConsumer],
) -> None:
    merged = make_merged()
    merged.register_to(ProducerSet({"silent": Probe("silent")}))
    raised: list[BaseException] = []

    def wait() -> None:
        try:
            merged.receive(timeout=WAIT)
        except BaseException as error:
            raised.append(error)

    receiver = threading.Thread(target=wait)
    receiver.start()
    merged.close()
    receiver.join(WAIT)

    assert [type(e) for e in raised] == [ClosedError]


def test_closing_acks_what_each_producer_had_confirmed(
    make_merged: Callable[..., MergedConsumer],
) -> None:
    a, b = Probe("a"), Probe("b")
    merged = make_merged()
    merged.register_to(ProducerSet({"a": a, "b": b}))
    tell(merged, a, "a", range(1, 3))
    tell(merged, b, "b", range(1, 2))
    consume(merged, 3)

    merged.close()
    merged.close()

    assert [m.confirmed_seq_nr for m in a.messages if type(m) is Ack] == [2]
    assert [m.confirmed_seq_nr for m in b.messages if type(m) is Ack] == [1]


# --- ProducerSet ------------------------------------------------------------------------------


def test_a_producer_set_tells_its_listeners_of_changes_only() -> None:
    calls: list[str] = []
    producers = ProducerSet()
    producers.add_listener(lambda: calls.append("changed"))
    ref = Probe("p")

    assert producers.set({"p": ref}) is True
    assert producers.set({"p": ref}) is False
    assert calls == ["changed"]
    assert producers.current() == {"p": ref}


def test_a_producer_set_refuses_an_empty_id_and_a_ref_without_tell() -> None:
    with pytest.raises(ValueError, match="empty"):
        ProducerSet({"": Probe()})
    with pytest.raises(TypeError, match="no tell"):
        ProducerSet({"p": object()})  # type: ignore[dict-item]
