"""Rejected deliveries: redelivery with backoff, then the dead letters (pure core).

The consumer rejects a `Delivery` (`Rejected`, what ``delivery.reject(reason)`` sends)
instead of confirming it. The core delivers the same message again after
``redelivery_backoff`` (doubling up to ``redelivery_backoff_max``), nothing else
meanwhile; after ``max_attempts`` deliveries it emits `WriteDeadLetter` and moves on as
after a confirmation. Driven with tests.harness: a fake clock, probes as producer
controller and consumer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Iterator
from pathlib import Path

import pykka
import pytest

from pykka_delivery import AsyncConsumer, AsyncProducer, Consumer, Producer
from pykka_delivery.delivery.actors.consumer_controller import ConsumerController
from pykka_delivery.delivery.core.consumer import REDELIVER
from pykka_delivery.delivery.core.effects import (
    CancelTimer,
    RecordConfirmed,
    Send,
    StartTimer,
    WriteDeadLetter,
)
from pykka_delivery.delivery.core.settings import ConsumerControllerSettings
from pykka_delivery.delivery.messages import (
    CONFIRMED,
    ConsumerStart,
    Delivery,
    RegisterToProducerController,
    Rejected,
)
from pykka_delivery.delivery.stores.dead_letters import (
    DeadLetterError,
    MemoryDeadLetters,
    SqliteDeadLetters,
)
from pykka_delivery.delivery.timers import TimerService
from pykka_delivery.errors import ClosedError, LocalProtocolError
from pykka_delivery.protocol.messages import Request
from tests.delivery.core.test_consumer_core import PRODUCER_ID, Rig, open_session, seq, start
from tests.harness import FakeClock, Probe, consumer_driver

SETTINGS = ConsumerControllerSettings(
    flow_control_window=20,
    resend_interval_min=1.0,
    max_attempts=3,
    redelivery_backoff=0.1,
    redelivery_backoff_max=0.15,
)


def delivery(rig: Rig, n: int, attempt: int) -> Delivery:
    return Delivery(f"msg-{n}", rig.cc, PRODUCER_ID, n, attempt)


def test_a_rejected_delivery_comes_again_after_the_backoff_then_goes_to_the_dead_letters() -> None:
    rig = start(SETTINGS)
    open_session(rig)
    rig.send(2, 3)
    rig.consumer.expect(delivery(rig, 2, 1))

    assert rig.feed(Rejected("db down")) == [StartTimer(REDELIVER, 0.1)]
    rig.clock.advance(0.05)
    rig.consumer.expect_no_message()
    rig.clock.advance(0.05)
    rig.consumer.expect(delivery(rig, 2, 2))

    assert rig.feed(Rejected("db down")) == [StartTimer(REDELIVER, 0.15)], "doubled, capped"
    rig.clock.advance(0.15)
    rig.consumer.expect(delivery(rig, 2, 3))

    effects = rig.feed(Rejected("still down"))
    assert effects[0] == WriteDeadLetter(PRODUCER_ID, 2, "msg-2", "still down", 3)
    rig.consumer.expect(delivery(rig, 3, 1))  # the stream moved on, in order
    rig.feed(CONFIRMED)
    stats = rig.core.statistics()
    assert (stats.rejected, stats.dead_lettered, stats.confirmed, stats.delivered) == (3, 1, 3, 5)
    assert rig.core.snapshot().confirmed_seq_nr == 3
    rig.clock.advance(1.0)
    rig.consumer.expect_no_message()


def test_a_redelivered_message_can_be_confirmed() -> None:
    rig = start(SETTINGS)
    open_session(rig)
    rig.send(2)
    rig.consumer.expect(delivery(rig, 2, 1))
    rig.feed(Rejected("flaky"))
    rig.clock.advance(0.1)
    rig.consumer.expect(delivery(rig, 2, 2))

    rig.feed(CONFIRMED)

    rig.send(3)
    rig.consumer.expect(delivery(rig, 3, 1))  # the next message starts at attempt 1
    assert rig.core.statistics().dead_lettered == 0


def test_an_answer_while_the_redelivery_waits_is_refused() -> None:
    rig = start(SETTINGS)
    open_session(rig)
    rig.send(2)
    rig.consumer.expect(delivery(rig, 2, 1))
    rig.feed(Rejected("x"))

    for answer in (CONFIRMED, Rejected("y")):
        with pytest.raises(LocalProtocolError, match="the rejected delivery comes again first"):
            rig.feed(answer)
    rig.clock.advance(0.1)
    rig.consumer.expect(delivery(rig, 2, 2))


def test_a_rejection_without_a_delivery_is_refused() -> None:
    rig = start(SETTINGS)
    with pytest.raises(LocalProtocolError, match="Rejected received with no delivery"):
        rig.feed(Rejected("x"))


def test_max_attempts_one_dead_letters_at_the_first_rejection_and_requests_on() -> None:
    settings = ConsumerControllerSettings(flow_control_window=2, max_attempts=1)
    rig = start(settings)
    rig.send(1)
    rig.consumer.expect(delivery(rig, 1, 1))
    rig.pc.expect(Request(0, 2, True, False))

    effects = rig.feed(Rejected("poison"))

    assert effects[0] == WriteDeadLetter(PRODUCER_ID, 1, "msg-1", "poison", 1)
    assert Send(rig.pc, Request(1, 2, True, False)) in effects, "confirmed to the producer"


def test_messages_arriving_during_the_backoff_wait_their_turn() -> None:
    rig = start(SETTINGS)
    open_session(rig)
    rig.send(2)
    rig.consumer.expect(delivery(rig, 2, 1))
    rig.feed(Rejected("x"))
    rig.send(3, 4)
    rig.consumer.expect_no_message()
    rig.clock.advance(0.1)
    rig.consumer.expect(delivery(rig, 2, 2))
    rig.feed(CONFIRMED)
    rig.consumer.expect(delivery(rig, 3, 1))
    rig.feed(CONFIRMED)
    rig.consumer.expect(delivery(rig, 4, 1))


def test_a_new_consumer_gets_the_rejected_delivery_at_once() -> None:
    rig = start(SETTINGS)
    open_session(rig)
    rig.send(2)
    rig.consumer.expect(delivery(rig, 2, 1))
    rig.feed(Rejected("x"))
    other = Probe("other")

    effects = rig.feed(ConsumerStart(other))

    assert effects[0] == CancelTimer(REDELIVER)
    other.expect(delivery(rig, 2, 1))
    rig.clock.advance(1.0)
    other.expect_no_message()
    rig.consumer.expect_no_message()


def test_with_deduplication_a_dead_letter_is_recorded_as_confirmed() -> None:
    clock = FakeClock()
    driver, _ = consumer_driver(clock, settings=SETTINGS, dedup_positions={})
    consumer, pc = Probe("consumer"), Probe("pc")
    driver.feed(ConsumerStart(consumer))
    driver.feed(seq(1, pc))
    for attempt in (1, 2):
        assert consumer.receive().attempt == attempt
        driver.feed(Rejected("x"))
        clock.advance(0.15)
    assert consumer.receive().attempt == 3

    effects = driver.feed(Rejected("x"))

    assert effects[:2] == [
        WriteDeadLetter(PRODUCER_ID, 1, "msg-1", "x", 3),
        RecordConfirmed(PRODUCER_ID, 1),
    ]


# --- the shells ---------------------------------------------------------------------------


@pytest.fixture
def timers() -> Iterator[TimerService]:
    service = TimerService(name="test-rejections-timers")
    yield service
    service.shutdown()


FAST = ConsumerControllerSettings(
    flow_control_window=2,  # a Request per confirmation: the producer hears of each at once
    max_attempts=3,
    redelivery_backoff=0.01,
    redelivery_backoff_max=0.02,
    resend_interval_min=0.5,
)
WAIT = 10.0


def run_stream(consumer: Consumer, producer: Producer, rejects: dict[int, int]) -> list[tuple]:
    """Send 1..5; the consumer rejects message n ``rejects[n]`` times, then confirms it
    (or not at all if it is dead-lettered first). Returns what the consumer saw."""
    sender = threading.Thread(
        target=lambda: [producer.send(n, timeout=WAIT) for n in range(1, 6)], daemon=True
    )
    sender.start()  # the consumer's first Request comes from its receive(), on this thread
    seen = []
    remaining = dict(rejects)
    while not seen or seen[-1][0] != 5 or remaining.get(5, 0) > 0:
        delivery = consumer.receive(timeout=WAIT)
        seen.append((delivery.message, delivery.attempt))
        if remaining.get(delivery.message, 0) > 0:
            remaining[delivery.message] -= 1
            delivery.reject(ValueError(f"bad {delivery.message}"))
        else:
            delivery.confirm()
        if delivery.message == 5 and not remaining.get(5):
            break
    sender.join(WAIT)
    return seen


def test_consumer_handle_redelivers_then_dead_letters_and_the_producer_sees_all_confirmed(
    timers: TimerService,
) -> None:
    letters = MemoryDeadLetters()
    producer = Producer("p-1", timer_service=timers)
    consumer = Consumer(FAST, timer_service=timers, dead_letters=letters)
    consumer.register_to(producer.ref)

    seen = run_stream(consumer, producer, {2: 5, 4: 1})

    assert seen == [(1, 1), (2, 1), (2, 2), (2, 3), (3, 1), (4, 1), (4, 2), (5, 1)]
    [letter] = letters.letters
    assert (letter.producer_id, letter.seq_nr, letter.message) == ("p-1", 2, 2)
    assert (letter.reason, letter.attempts) == ("ValueError: bad 2", 3)
    producer.wait_confirmed(timeout=WAIT)
    stats = consumer.statistics()
    assert (stats.rejected, stats.dead_lettered) == (4, 1)
    consumer.close()
    producer.close()


def test_consumer_handle_writes_dead_letters_to_an_sqlite_file_given_by_path(
    timers: TimerService, tmp_path: Path
) -> None:
    settings = dataclasses.replace(FAST, max_attempts=1)
    producer = Producer("p-1", timer_service=timers)
    consumer = Consumer(settings, timer_service=timers, dead_letters=tmp_path / "dead.db")
    consumer.register_to(producer.ref)

    run_stream(consumer, producer, {3: 1})
    consumer.close()

    with SqliteDeadLetters(tmp_path / "dead.db") as letters:
        [stored] = letters.letters()
    assert (stored.letter.seq_nr, stored.letter.message, stored.letter.attempts) == (3, 3, 1)
    producer.close()


def test_reject_without_a_destination_is_refused_and_the_delivery_can_still_be_confirmed(
    timers: TimerService,
) -> None:
    producer = Producer("p-1", timer_service=timers)
    consumer = Consumer(FAST, timer_service=timers)
    consumer.register_to(producer.ref)
    producer.send("m", timeout=WAIT)
    delivery = consumer.receive(timeout=WAIT)

    with pytest.raises(LocalProtocolError, match="dead_letters="):
        delivery.reject("no")

    delivery.confirm()
    producer.wait_confirmed(timeout=WAIT)
    consumer.close()
    producer.close()


def test_a_failing_destination_closes_the_consumer_and_leaves_the_message_unconfirmed(
    timers: TimerService,
) -> None:
    settings = dataclasses.replace(FAST, max_attempts=1)
    producer = Producer("p-1", timer_service=timers)
    consumer = Consumer(
        settings, timer_service=timers, dead_letters=MemoryDeadLetters(fail_when=lambda _: True)
    )
    consumer.register_to(producer.ref)
    producer.send("m", timeout=WAIT)
    delivery = consumer.receive(timeout=WAIT)

    with pytest.raises(DeadLetterError, match="injected failure"):
        delivery.reject("no")

    with pytest.raises(ClosedError, match="dead letter could not be written"):
        consumer.receive(timeout=WAIT)
    assert producer.snapshot().unconfirmed == (1,)
    producer.close()


class Rejecter(pykka.ThreadingActor):
    """A consumer actor that rejects every delivery of message "poison" and confirms the
    rest, recording (message, attempt)."""

    def __init__(self, seen: list[tuple], done: threading.Event, last: object) -> None:
        super().__init__()
        self.seen, self.done, self.last = seen, done, last

    def on_receive(self, message: object) -> None:
        if isinstance(message, Delivery):
            self.seen.append((message.message, message.attempt))
            if message.message == "poison":
                message.reject("cannot")
            else:
                message.confirm()
            if message.message == self.last:
                self.done.set()


def test_consumer_controller_actor_redelivers_then_dead_letters(timers: TimerService) -> None:
    letters = MemoryDeadLetters()
    seen: list[tuple] = []
    done = threading.Event()
    producer = Producer("p-1", timer_service=timers)
    cc = ConsumerController.start(FAST, timer_service=timers, dead_letters=letters)
    cc.tell(ConsumerStart(Rejecter.start(seen, done, "after")))
    cc.tell(RegisterToProducerController(producer.ref))

    for message in ("before", "poison", "after"):
        producer.send(message, timeout=WAIT)

    assert done.wait(WAIT)
    assert seen == [("before", 1), ("poison", 1), ("poison", 2), ("poison", 3), ("after", 1)]
    assert [(dl.message, dl.attempts, dl.reason) for dl in letters.letters] == [
        ("poison", 3, "cannot")
    ]
    producer.wait_confirmed(timeout=WAIT)
    producer.close()


def test_consumer_controller_actor_without_a_destination_refuses_rejections(
    timers: TimerService,
) -> None:
    seen: list[tuple] = []
    done = threading.Event()
    producer = Producer("p-1", timer_service=timers)
    cc = ConsumerController.start(FAST, timer_service=timers)
    cc.tell(ConsumerStart(Rejecter.start(seen, done, "poison")))
    cc.tell(RegisterToProducerController(producer.ref))
    producer.send("poison", timeout=WAIT)

    assert done.wait(WAIT)
    assert cc.proxy().rejected.get(timeout=WAIT) == 1
    assert seen == [("poison", 1)], "not delivered again: the rejection was refused"
    producer.close()


async def test_async_consumer_redelivers_then_dead_letters(timers: TimerService) -> None:
    letters = MemoryDeadLetters()
    producer = AsyncProducer("p-1", timer_service=timers)
    consumer = AsyncConsumer(FAST, timer_service=timers, dead_letters=letters)
    consumer.register_to(producer.ref)

    async def send_all() -> None:
        for message in ("poison", "fine"):
            await producer.send(message, timeout=WAIT)

    sender = asyncio.create_task(send_all())  # demand comes from the consumer's receive()
    seen = []
    async for delivery in consumer:
        seen.append((delivery.message, delivery.attempt))
        if delivery.message == "poison":
            # from a worker thread, as a blocking handler would
            await asyncio.to_thread(delivery.reject, "cannot")
        else:
            delivery.confirm()
            break

    await sender
    assert seen == [("poison", 1), ("poison", 2), ("poison", 3), ("fine", 1)]
    assert [(dl.message, dl.attempts) for dl in letters.letters] == [("poison", 3)]
    await producer.wait_confirmed(timeout=WAIT)
    consumer.close()
    producer.close()
