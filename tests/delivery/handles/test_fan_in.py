"""`FanInConsumer`: many producers behind one ref, one `Consumer` per producer id.

Not a port of an original test: Akka's ``ShardingConsumerController`` has the same job
(one consumer controller per producer id behind one address), but it is tied to cluster
sharding, which we do not port. These tests run in one process with `Producer` and
`WorkPullingProducer` handles and a `LocalServiceRegistry` of the test's own.

1. Two producers at once: each one's messages handled once, in order.
2. Two work-pulling producers over two fan-ins (two workers): every message once.
3. A producer idle past ``idle_timeout``: its consumer closes; it sends again: nothing
   lost, order kept. Also with pauses around a short ``idle_timeout``, many times.
4. A handler that raises is called again with the same delivery.
5. A shared deduplication store: a producer restarted on its durable queue resends, and
   nothing is handled twice (across an idle close too).
6. ``close``: deregisters the ref, the threads end.
7. Settings validation.
8. ``max_producers``: a new producer id beyond it is refused, then served once a slot
   frees up.
Also: a handler that confirms by itself is not confirmed twice; other message types are
logged and dropped.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from pykka_delivery.delivery import (
    FanInConsumer,
    FanInSettings,
    FanInStats,
)
from pykka_delivery.delivery.core.settings import (
    ConsumerControllerSettings,
    ProducerControllerSettings,
)
from pykka_delivery.delivery.handles.producer import Producer
from pykka_delivery.delivery.handles.work_pulling import WorkPullingProducer
from pykka_delivery.delivery.messages import Delivery
from pykka_delivery.delivery.registry import LocalServiceRegistry
from pykka_delivery.delivery.stores.dedup import MemoryDedupStore
from pykka_delivery.delivery.stores.durable_memory import MemoryDurableQueue
from pykka_delivery.delivery.stores.durable_queue import (
    NO_QUALIFIER,
    DurableProducerState,
    MessageSent,
)
from pykka_delivery.delivery.timers import TimerService
from tests.harness import wait_until

KEY = "rows"
WAIT = 10.0  # bound on every wait expected to succeed
CONSUMER = ConsumerControllerSettings(resend_interval_min=0.05, resend_interval_max=0.2)
FAST_PRODUCER = ProducerControllerSettings(resend_first_interval=0.05)


def settings(**overrides: Any) -> FanInSettings:
    values: dict[str, Any] = {"consumer": CONSUMER, "retry_backoff_min": 0.01}
    values.update(overrides)
    return FanInSettings(**values)


class Handled:
    """The handler: records (producer id, message) pairs; ``fail`` says how many more
    times a message should raise before it succeeds."""

    def __init__(self, fail: dict[Any, int] | None = None) -> None:
        self.items: list[tuple[str, Any]] = []
        self.calls: Counter[Any] = Counter()
        self.fail = dict(fail or {})
        self._changed = threading.Condition()

    def __call__(self, delivery: Delivery) -> None:
        self.calls[delivery.message] += 1
        if self.fail.get(delivery.message, 0) > 0:
            self.fail[delivery.message] -= 1
            msg = f"handler failure on {delivery.message}"
            raise RuntimeError(msg)
        with self._changed:
            self.items.append((delivery.producer_id, delivery.message))
            self._changed.notify_all()

    def of(self, producer_id: str) -> list[Any]:
        with self._changed:
            return [m for p, m in self.items if p == producer_id]

    def wait_for(self, count: int) -> None:
        with self._changed:
            done = self._changed.wait_for(lambda: len(self.items) >= count, WAIT)
        assert done, f"{count} handled expected within {WAIT} s, got {len(self.items)}"


@pytest.fixture
def timers() -> Iterator[TimerService]:
    service = TimerService(name="test-fan-in-timers")
    yield service
    service.shutdown()


@pytest.fixture
def registry() -> LocalServiceRegistry:
    return LocalServiceRegistry()


@pytest.fixture
def closing() -> Iterator[list[Any]]:
    """Handles a test made, closed after it (in reverse order) even when it fails."""
    made: list[Any] = []
    yield made
    for handle in reversed(made):
        handle.close()


def test_two_producers_at_once_each_handled_once_in_order(
    timers: TimerService, closing: list[Any]
) -> None:
    handled = Handled()
    fan_in = FanInConsumer(handled, settings(), timer_service=timers)
    closing.append(fan_in)
    producers = [Producer(pid, timer_service=timers) for pid in ("a", "b")]
    closing.extend(producers)
    for producer in producers:
        producer.register_consumer(fan_in.ref)

    def run(producer: Producer) -> None:
        producer.send_many([f"{producer.producer_id}-{n}" for n in range(2000)], timeout=WAIT)

    threads = [threading.Thread(target=run, args=(p,), daemon=True) for p in producers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    handled.wait_for(4000)
    for producer in producers:
        producer.wait_confirmed(timeout=WAIT)

    assert handled.of("a") == [f"a-{n}" for n in range(2000)]
    assert handled.of("b") == [f"b-{n}" for n in range(2000)]
    stats = fan_in.statistics()
    assert (stats.handled, stats.per_producer, stats.live_producers) == (
        4000,
        {"a": 2000, "b": 2000},
        2,
    )


def test_two_work_pulling_producers_over_two_fan_ins_handle_every_message_once(
    timers: TimerService, registry: LocalServiceRegistry, closing: list[Any]
) -> None:
    """Two workers (fan-ins) under one service key, two producers sending to both: each
    worker serves a session of each producer at once."""
    handled = Handled()
    fan_ins = [
        FanInConsumer(
            handled,
            settings(),
            timer_service=timers,
            service_key=KEY,
            registry=registry,
            name=f"worker-{i}",
        )
        for i in range(2)
    ]
    closing.extend(fan_ins)
    producers = [
        WorkPullingProducer(pid, KEY, registry=registry, timer_service=timers)
        for pid in ("task-1", "task-2")
    ]
    closing.extend(producers)
    wait_until(lambda: all(p.statistics().workers == 2 for p in producers), "both workers seen")

    def run(producer: WorkPullingProducer) -> None:
        producer.send_many([(producer.producer_id, n) for n in range(1000)], timeout=WAIT)

    threads = [threading.Thread(target=run, args=(p,), daemon=True) for p in producers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    for producer in producers:
        producer.wait_confirmed(timeout=WAIT)

    expected = Counter((pid, n) for pid in ("task-1", "task-2") for n in range(1000))
    assert Counter(message for _, message in handled.items) == expected
    # Each fan-in served a session of each producer (producer id "<task>-<worker id>").
    for fan_in in fan_ins:
        per_producer = fan_in.statistics().per_producer
        assert sorted(pid.split("-")[1] for pid in per_producer) == ["1", "2"]


def test_idle_producer_consumer_is_closed_and_its_next_messages_all_arrive_in_order(
    timers: TimerService, closing: list[Any]
) -> None:
    """The consumer of a producer idle past ``idle_timeout`` is closed and forgotten;
    the producer's next message creates a new one, which meets the session midway and
    asks for ``Resend(0)``: every message is handled once, in order."""
    handled = Handled()
    fan_in = FanInConsumer(handled, settings(idle_timeout=0.2), timer_service=timers)
    closing.append(fan_in)
    producer = Producer("a", timer_service=timers)
    closing.append(producer)
    producer.register_consumer(fan_in.ref)

    producer.send_many([f"m-{n}" for n in range(1, 6)], timeout=WAIT)
    handled.wait_for(5)
    wait_until(lambda: fan_in.statistics().idle_closed == 1, "idle consumer closed")
    assert fan_in.statistics().live_producers == 0
    producer.send_many([f"m-{n}" for n in range(6, 11)], timeout=WAIT)
    handled.wait_for(10)
    producer.wait_confirmed(timeout=WAIT)

    assert handled.of("a") == [f"m-{n}" for n in range(1, 11)]
    stats = fan_in.statistics()
    assert (stats.per_producer, stats.idle_closed) == ({"a": 10}, 1)
    assert (producer.snapshot().confirmed_seq_nr, producer.snapshot().unconfirmed) == (10, ())
    assert producer.statistics().resend_requests >= 1  # the new consumer's Resend(0)


def test_producer_pausing_around_a_short_idle_timeout_loses_and_repeats_nothing(
    timers: TimerService, closing: list[Any]
) -> None:
    """Pauses just around ``idle_timeout``: consumers are closed while messages arrive,
    and new ones take over mid-session, many times. Each message is handled once, in
    order (the old consumer's last Ack reaches the producer before a new one asks it to
    resend, so nothing handled comes again)."""
    handled = Handled()
    fan_in = FanInConsumer(handled, settings(idle_timeout=0.01), timer_service=timers)
    closing.append(fan_in)
    producer = Producer("a", timer_service=timers)
    closing.append(producer)
    producer.register_consumer(fan_in.ref)
    pauses = random.Random(7)

    for n in range(200):
        producer.send(n, timeout=WAIT)
        if n % 4 == 0:
            time.sleep(pauses.uniform(0.0, 0.02))
    handled.wait_for(200)
    producer.wait_confirmed(timeout=WAIT)

    assert handled.of("a") == list(range(200))
    assert fan_in.statistics().idle_closed > 1


def test_handler_that_raises_is_called_again_with_the_same_delivery(
    timers: TimerService, closing: list[Any]
) -> None:
    handled = Handled(fail={"m-3": 2})
    fan_in = FanInConsumer(handled, settings(), timer_service=timers)
    closing.append(fan_in)
    producer = Producer("a", timer_service=timers)
    closing.append(producer)
    producer.register_consumer(fan_in.ref)

    producer.send_many([f"m-{n}" for n in range(1, 6)], timeout=WAIT)
    handled.wait_for(5)

    assert handled.of("a") == [f"m-{n}" for n in range(1, 6)]
    assert handled.calls["m-3"] == 3
    stats = fan_in.statistics()
    assert (stats.handled, stats.handler_failures) == (5, 2)


def test_handler_that_confirms_by_itself_is_not_confirmed_twice(
    timers: TimerService, closing: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    items: list[Any] = []

    def handler(delivery: Delivery) -> None:
        items.append(delivery.message)
        delivery.confirm()

    fan_in = FanInConsumer(handler, settings(), timer_service=timers)
    closing.append(fan_in)
    producer = Producer("a", timer_service=timers)
    closing.append(producer)
    producer.register_consumer(fan_in.ref)

    with caplog.at_level(logging.WARNING, logger="pykka_delivery"):
        producer.send_many(list(range(200)), timeout=WAIT)
        producer.wait_confirmed(timeout=WAIT)
        wait_until(lambda: fan_in.statistics().handled == 200, "200 handled")

    assert items == list(range(200))
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def unconfirmed_3_to_5() -> DurableProducerState:
    """A durable queue after a crash: 1..5 sent, only 1..2 stored as confirmed."""
    sent = tuple(MessageSent(n, f"msg-{n}", False, NO_QUALIFIER, 0) for n in (3, 4, 5))
    return DurableProducerState(6, 2, {NO_QUALIFIER: (2, 0)}, sent)


def test_shared_dedup_store_keeps_a_restarted_durable_producer_from_handling_twice(
    timers: TimerService, closing: list[Any]
) -> None:
    """The producer "crashes" after 1..5 were handled, with 3..5 unconfirmed in its durable
    queue; meanwhile its consumer went idle and closed. The restarted producer resends
    3..5 (first marked first) to a new consumer, which loads the position 5 from the
    shared store and confirms them without handling them."""
    store = MemoryDedupStore()
    handled = Handled()
    fan_in = FanInConsumer(
        handled, settings(idle_timeout=0.2), timer_service=timers, dedup_store=store
    )
    closing.append(fan_in)
    first = Producer("p", timer_service=timers)
    first.register_consumer(fan_in.ref)
    first.send_many([f"msg-{n}" for n in range(1, 6)], timeout=WAIT)
    handled.wait_for(5)
    first.close()
    wait_until(lambda: fan_in.statistics().idle_closed == 1, "idle consumer closed")

    second = Producer(
        "p", timer_service=timers, durable_queue=MemoryDurableQueue(unconfirmed_3_to_5())
    )
    closing.append(second)
    second.register_consumer(fan_in.ref)
    second.send_many([f"msg-{n}" for n in range(6, 9)], timeout=WAIT)
    handled.wait_for(8)
    second.wait_confirmed(timeout=WAIT)

    assert handled.of("p") == [f"msg-{n}" for n in range(1, 9)]
    assert fan_in.statistics().per_producer == {"p": 8}
    wait_until(lambda: store.load() == {"p": 8}, "position 8 recorded")


def test_close_deregisters_the_ref_and_ends_the_threads(
    timers: TimerService, registry: LocalServiceRegistry, closing: list[Any]
) -> None:
    handled = Handled()
    fan_in = FanInConsumer(
        handled, settings(), timer_service=timers, service_key=KEY, registry=registry, name="fi-6"
    )
    producer = Producer("a", timer_service=timers)
    closing.append(producer)
    assert registry.listing(KEY) == frozenset({fan_in.ref})
    producer.register_consumer(fan_in.ref)
    producer.send("one", timeout=WAIT)
    handled.wait_for(1)
    assert [t.name for t in threading.enumerate() if t.name.startswith("fi-6-")] == ["fi-6-a"]

    fan_in.close()

    assert registry.listing(KEY) == frozenset()
    assert [t.name for t in threading.enumerate() if t.name.startswith("fi-6-")] == []
    assert fan_in.statistics().live_producers == 0
    fan_in.close()  # again: nothing happens


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("idle_timeout", 0),
        ("idle_timeout", float("nan")),
        ("max_producers", 0),
        ("max_producers", 1.5),
        ("retry_backoff_min", -1),
        ("retry_backoff_max", 0.01),  # below retry_backoff_min (0.1)
        ("close_timeout", -0.5),
        ("close_timeout", True),
    ],
)
def test_settings_validation_errors_name_the_setting(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=rf"FanInSettings\.{field} must be .*got {value!r}"):
        FanInSettings(**{field: value})


def test_settings_consumer_of_the_wrong_type_is_refused() -> None:
    with pytest.raises(TypeError, match=r"FanInSettings\.consumer must be"):
        FanInSettings(consumer=ProducerControllerSettings())  # type: ignore[arg-type]


def test_max_producers_refuses_a_new_producer_id_while_the_first_is_live(
    timers: TimerService, closing: list[Any]
) -> None:
    """The refused producer's first message is dropped (counted), as are its resends,
    until the first producer's consumer goes idle; then it is served."""
    handled = Handled()
    fan_in = FanInConsumer(
        handled, settings(max_producers=1, idle_timeout=1.5), timer_service=timers
    )
    closing.append(fan_in)
    a = Producer("a", timer_service=timers)
    b = Producer("b", FAST_PRODUCER, timer_service=timers)
    closing.extend([a, b])
    a.register_consumer(fan_in.ref)
    a.send("a-1", timeout=WAIT)
    handled.wait_for(1)

    b.register_consumer(fan_in.ref)
    b.send("b-1", timeout=WAIT)  # routed (and refused) on this thread, before it returns

    stats = fan_in.statistics()
    assert (stats.refused, stats.live_producers, handled.of("b")) == (1, 1, [])

    handled.wait_for(2)  # once a's consumer went idle, b's resend is accepted
    assert handled.items == [("a", "a-1"), ("b", "b-1")]
    assert fan_in.statistics().idle_closed >= 1


def test_other_message_types_are_logged_and_dropped(
    timers: TimerService, closing: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    handled = Handled()
    fan_in = FanInConsumer(handled, settings(), timer_service=timers)
    closing.append(fan_in)

    with caplog.at_level(logging.WARNING, logger="pykka_delivery"):
        fan_in.ref.tell("not a protocol message")

    assert any("cannot handle str" in r.getMessage() for r in caplog.records)
    assert fan_in.statistics() == FanInStats(0, {}, 0, 0, 0, 0)
