"""The `Consumer` handle fed runs (`SequencedRun`) through its endpoint, as a transport
node hands them over (``consumer.ref.tell_many([...])``; the endpoint's ``takes_runs``).

The handle takes deliveries straight from a run at the head of its inbox while the stream
is in its steady state, and falls back to the run's messages one at a time otherwise
(a gap, a duplicate, a retry backoff, a rejection waiting for its redelivery, another
producer registered, stopping). Either way the application must see exactly what it sees
when the same messages arrive one by one.

A `Probe` plays the producer controller (it is the ``producer_controller`` of every message
and run told here), so the consumer's Requests, Resends, Acks and RegisterConsumers land
in it. Timers fire only when the test says so (`ManualTimerService`); the consumer
processes a firing when the application next calls ``receive``. Everything runs on the
test's thread, except where a test says otherwise; every wait is bounded by `WAIT`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from pykka_delivery import (
    AsyncConsumer,
    ClosedError,
    Consumer,
    ConsumerControllerSettings,
    LocalProtocolError,
)
from pykka_delivery.delivery.core.consumer import ConsumerCore
from pykka_delivery.delivery.messages import Delivery
from pykka_delivery.delivery.stores.dead_letters import MemoryDeadLetters
from pykka_delivery.errors import WouldBlock
from pykka_delivery.protocol.messages import (
    Ack,
    Ref,
    RegisterConsumer,
    Request,
    Resend,
    SequencedMessage,
    SequencedRun,
)
from tests.harness import ManualTimerService, Probe

WAIT = 10.0
SETTINGS = ConsumerControllerSettings(
    flow_control_window=20,
    resend_interval_min=60.0,  # retries only when a test fires the timers
    resend_interval_max=90.0,
    max_attempts=2,
    redelivery_backoff=0.5,
    redelivery_backoff_max=0.5,
)
PID = "p-1"


@pytest.fixture
def timers() -> ManualTimerService:
    return ManualTimerService()


@pytest.fixture
def pc() -> Probe:
    return Probe("producer-controller")


@pytest.fixture
def consumer(timers: ManualTimerService) -> Iterator[Consumer]:
    c = Consumer(SETTINGS, timer_service=timers, dead_letters=MemoryDeadLetters())
    yield c
    c.close()


def first(pc: Ref, producer_id: str = PID, prefix: str = "m") -> SequencedMessage:
    """A session's first message (it never travels in a run)."""
    return SequencedMessage(producer_id, 1, f"{prefix}1", True, False, pc)


def run(
    pc: Ref, first_seq_nr: int, last_seq_nr: int, producer_id: str = PID, prefix: str = "m"
) -> SequencedRun:
    messages = [f"{prefix}{n}" for n in range(first_seq_nr, last_seq_nr + 1)]
    return SequencedRun(producer_id, first_seq_nr, messages, pc)


def take(consumer: Consumer, count: int) -> list[Delivery]:
    """Receive and confirm ``count`` deliveries."""
    deliveries = []
    for _ in range(count):
        delivery = consumer.receive(timeout=WAIT)
        deliveries.append(delivery)
        delivery.confirm()
    return deliveries


def seen(deliveries: list[Delivery]) -> list[tuple[Any, int, int]]:
    return [(d.message, d.seq_nr, d.attempt) for d in deliveries]


def nothing_ready(consumer: Consumer) -> None:
    """Nothing is deliverable now (the consumer processes its inbox meanwhile)."""
    with pytest.raises(WouldBlock):
        consumer.receive_nowait()


def in_order(first_seq_nr: int, last_seq_nr: int, prefix: str = "m") -> list[tuple[str, int, int]]:
    return [(f"{prefix}{n}", n, 1) for n in range(first_seq_nr, last_seq_nr + 1)]


# --- the steady state ------------------------------------------------------------------


@pytest.mark.parametrize("as_runs", [True, False], ids=["runs", "messages"])
def test_runs_are_delivered_in_order_and_requested_as_messages_one_by_one_are(
    consumer: Consumer, pc: Probe, as_runs: bool
) -> None:
    runs = [run(pc, 2, 5), run(pc, 6, 6), run(pc, 7, 12)]
    told: list[Any] = [first(pc)]
    for r in runs:
        told += [r] if as_runs else r.expand()

    consumer.ref.tell_many(told)  # type: ignore[attr-defined]

    deliveries = take(consumer, 3)
    delivery = consumer.receive_nowait()
    deliveries.append(delivery)
    delivery.confirm()
    for delivery in consumer:
        deliveries.append(delivery)
        delivery.confirm()
        if delivery.seq_nr == 12:
            break
    assert seen(deliveries) == in_order(1, 12)
    # Request(0, 20) for the first message, Request(1, 20) once it is confirmed, then a
    # new one when half the window is left (after 10).
    assert pc.drain() == [Request(0, 20), Request(1, 20), Request(10, 30)]
    stats = consumer.statistics()
    assert (stats.delivered, stats.confirmed, stats.duplicates, stats.gaps) == (12, 12, 0, 0)
    nothing_ready(consumer)


def test_receiving_again_before_confirming_a_runs_message_is_refused_and_takes_nothing(
    consumer: Consumer, pc: Probe
) -> None:
    consumer.ref.tell_many([first(pc), run(pc, 2, 4)])  # type: ignore[attr-defined]
    take(consumer, 1)
    second = consumer.receive(timeout=WAIT)

    with pytest.raises(LocalProtocolError, match="seq_nr 2 is not confirmed yet"):
        consumer.receive(timeout=WAIT)

    second.confirm()
    assert seen(take(consumer, 2)) == in_order(3, 4)


def test_a_reader_on_its_own_thread_gets_runs_told_from_another_thread_in_order(
    consumer: Consumer, pc: Probe
) -> None:
    got: list[Delivery] = []
    done = threading.Event()

    def read() -> None:
        for delivery in consumer:
            got.append(delivery)
            delivery.confirm()
            if delivery.seq_nr == 200:
                break
        done.set()

    reader = threading.Thread(target=read, name="reader", daemon=True)
    reader.start()
    consumer.ref.tell(first(pc))
    for start in range(2, 201, 7):
        consumer.ref.tell_many([run(pc, start, min(start + 6, 200))])  # type: ignore[attr-defined]

    assert done.wait(WAIT), f"only {len(got)} arrived"
    reader.join(WAIT)
    assert seen(got) == in_order(1, 200)


# --- leaving the steady state ----------------------------------------------------------


def test_a_gap_between_runs_asks_for_a_resend_and_the_resent_run_fills_it(
    consumer: Consumer, pc: Probe
) -> None:
    consumer.ref.tell_many([first(pc), run(pc, 2, 3), run(pc, 5, 6)])  # type: ignore[attr-defined]

    assert seen(take(consumer, 3)) == in_order(1, 3)
    nothing_ready(consumer)  # 5 and 6 are dropped: 4 is missing
    assert pc.drain() == [Request(0, 20), Request(1, 20), Resend(4)]
    consumer.ref.tell_many([run(pc, 4, 6)])  # type: ignore[attr-defined]

    assert seen(take(consumer, 3)) == in_order(4, 6)
    assert consumer.statistics().gaps == 1


def test_a_duplicate_run_is_not_delivered_again(consumer: Consumer, pc: Probe) -> None:
    consumer.ref.tell_many([first(pc), run(pc, 2, 4)])  # type: ignore[attr-defined]
    take(consumer, 4)

    consumer.ref.tell_many([run(pc, 2, 4), run(pc, 3, 6)])  # type: ignore[attr-defined]

    assert seen(take(consumer, 2)) == in_order(5, 6)
    nothing_ready(consumer)
    stats = consumer.statistics()
    assert (stats.duplicates, stats.delivered) == (3 + 2, 6)


def test_retry_timer_firings_between_runs_retry_only_on_silence(
    consumer: Consumer, pc: Probe, timers: ManualTimerService
) -> None:
    """P6 (consumer_core.py): a retry tick after messages arrived (also messages taken
    from a run) retries nothing; after a silent interval the Request is repeated, and
    the next run, arriving while the retry is backed off, is delivered all the same."""
    consumer.ref.tell_many([first(pc), run(pc, 2, 4)])  # type: ignore[attr-defined]
    take(consumer, 4)
    pc.drain()

    timers.fire_all()  # the firing waits in the inbox, ahead of the next run
    consumer.ref.tell_many([run(pc, 5, 6)])  # type: ignore[attr-defined]
    assert seen(take(consumer, 2)) == in_order(5, 6)
    timers.fire_all()
    nothing_ready(consumer)  # takes the firing in: 5 and 6 arrived in that interval

    pc.expect_no_message()
    timers.fire_all()
    nothing_ready(consumer)  # silence: retry, and back off
    pc.expect(Request(6, 20, True, True))
    consumer.ref.tell_many([run(pc, 7, 9)])  # type: ignore[attr-defined]

    assert seen(take(consumer, 3)) == in_order(7, 9)
    assert consumer.statistics().retries == 1
    assert consumer.snapshot().retry_interval == SETTINGS.resend_interval_min  # reset
    pc.expect_no_message()


def test_a_rejected_message_of_a_run_comes_again_before_the_rest_of_the_run(
    consumer: Consumer, pc: Probe, timers: ManualTimerService
) -> None:
    consumer.ref.tell_many([first(pc), run(pc, 2, 5)])  # type: ignore[attr-defined]
    take(consumer, 2)
    rejected = consumer.receive(timeout=WAIT)
    assert (rejected.message, rejected.attempt) == ("m3", 1)

    rejected.reject("flaky")

    nothing_ready(consumer)  # 4 and 5 wait: the rejected one comes again first
    timers.fire_all()  # its redelivery is due
    again = consumer.receive(timeout=WAIT)
    assert (again.message, again.seq_nr, again.attempt) == ("m3", 3, 2)
    again.confirm()
    assert seen(take(consumer, 2)) == in_order(4, 5)
    assert consumer.statistics().rejected == 1
    assert pc.drain() == [Request(0, 20), Request(1, 20)]


def test_a_message_of_a_run_rejected_max_attempts_times_is_dead_lettered_and_the_run_goes_on(
    timers: ManualTimerService, pc: Probe
) -> None:
    letters = MemoryDeadLetters()
    consumer = Consumer(SETTINGS, timer_service=timers, dead_letters=letters)
    consumer.ref.tell_many([first(pc), run(pc, 2, 5)])  # type: ignore[attr-defined]
    take(consumer, 2)

    consumer.receive(timeout=WAIT).reject("bad")
    timers.fire_all()
    consumer.receive(timeout=WAIT).reject(ValueError("still bad"))

    assert seen(take(consumer, 2)) == in_order(4, 5)
    [letter] = letters.letters
    assert (letter.producer_id, letter.seq_nr, letter.message) == (PID, 3, "m3")
    assert (letter.reason, letter.attempts) == ("ValueError: still bad", 2)
    stats = consumer.statistics()
    assert (stats.rejected, stats.dead_lettered, stats.confirmed) == (2, 1, 5)
    consumer.close()


@pytest.mark.parametrize("outstanding", [True, False], ids=["delivery-out", "all-confirmed"])
def test_deliver_then_stop_with_a_partly_taken_run_delivers_the_rest_then_ends(
    consumer: Consumer, pc: Probe, outstanding: bool
) -> None:
    consumer.ref.tell_many([first(pc), run(pc, 2, 5)])  # type: ignore[attr-defined]
    take(consumer, 1)
    second = consumer.receive(timeout=WAIT)  # the run at the head has given 2
    if not outstanding:
        second.confirm()

    consumer.deliver_then_stop()
    if outstanding:
        second.confirm()

    rest = []
    for delivery in consumer:
        rest.append(delivery)
        delivery.confirm()
    assert seen(rest) == in_order(3, 5)
    with pytest.raises(ClosedError, match="deliver_then_stop"):
        consumer.receive(timeout=WAIT)
    assert pc.drain() == [Request(0, 20), Request(1, 20), Ack(5)]


def test_registering_to_another_producer_in_the_middle_of_a_run_drops_the_rest_of_it(
    consumer: Consumer, pc: Probe
) -> None:
    other = Probe("other-producer-controller")
    consumer.ref.tell_many([first(pc), run(pc, 2, 5)])  # type: ignore[attr-defined]
    take(consumer, 1)
    second = consumer.receive(timeout=WAIT)

    consumer.register_to(other)
    second.confirm()

    nothing_ready(consumer)  # 3..5 of the old producer: dropped while registering
    assert consumer.statistics().dropped == 3
    other.expect(RegisterConsumer(consumer.ref))
    consumer.ref.tell_many(  # type: ignore[attr-defined]
        [first(other, "p-2", "b"), run(other, 2, 3, "p-2", "b")]
    )
    from_other = take(consumer, 3)
    assert seen(from_other) == in_order(1, 3, "b")
    assert {d.producer_id for d in from_other} == {"p-2"}
    assert pc.drain() == [Request(0, 20), Request(1, 20)]
    assert other.drain() == [Request(0, 20), Request(1, 20)]


def test_close_in_the_middle_of_a_run_acks_what_was_confirmed_and_ends_everything(
    consumer: Consumer, pc: Probe
) -> None:
    consumer.ref.tell_many([first(pc), run(pc, 2, 5)])  # type: ignore[attr-defined]
    take(consumer, 2)
    third = consumer.receive(timeout=WAIT)

    consumer.close()

    assert pc.drain() == [Request(0, 20), Request(1, 20), Ack(2)]  # 3..5 stay unconfirmed
    with pytest.raises(ClosedError):
        third.confirm()
    with pytest.raises(ClosedError):
        consumer.receive(timeout=WAIT)
    assert list(consumer) == []
    consumer.ref.tell_many([run(pc, 6, 7)])  # type: ignore[attr-defined] # ignored
    assert consumer.statistics().confirmed == 2
    pc.expect_no_message()


# --- the AsyncConsumer over runs ---------------------------------------------------------


@pytest.fixture
async def async_consumer(timers: ManualTimerService) -> AsyncIterator[AsyncConsumer]:
    c = AsyncConsumer(SETTINGS, timer_service=timers, dead_letters=MemoryDeadLetters())
    yield c
    c.close()


@pytest.mark.parametrize("as_runs", [True, False], ids=["runs", "messages"])
async def test_async_iteration_over_runs_delivers_and_requests_as_over_messages(
    async_consumer: AsyncConsumer, pc: Probe, as_runs: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from_runs = count_deliveries_from_runs(monkeypatch)
    receives = []
    receive = AsyncConsumer.receive

    def counted(consumer: AsyncConsumer, timeout: float | None = None) -> Any:
        receives.append(timeout)
        return receive(consumer, timeout)

    monkeypatch.setattr(AsyncConsumer, "receive", counted)
    told: list[Any] = [first(pc)]
    for r in [run(pc, 2, 5), run(pc, 6, 6), run(pc, 7, 12)]:
        told += [r] if as_runs else r.expand()

    async_consumer.ref.tell_many(told)  # type: ignore[attr-defined]

    deliveries = []
    async for delivery in async_consumer:
        deliveries.append(delivery)
        delivery.confirm()
        if delivery.seq_nr == 12:
            break
    assert seen(deliveries) == in_order(1, 12)
    assert pc.drain() == [Request(0, 20), Request(1, 20), Request(10, 30)]
    assert from_runs == (list(range(2, 13)) if as_runs else [])
    # Deliveries are taken in __anext__ itself, from runs and single messages alike:
    # `receive` only after a Request was told (for the loop's turn: after 1 and after 10).
    assert len(receives) == 2


async def test_async_iteration_redelivers_a_rejected_message_of_a_run_before_the_rest(
    async_consumer: AsyncConsumer, pc: Probe, timers: ManualTimerService
) -> None:
    async_consumer.ref.tell_many([first(pc), run(pc, 2, 5)])  # type: ignore[attr-defined]
    iterator = aiter(async_consumer)
    for _ in range(2):
        (await anext(iterator)).confirm()
    rejected = await anext(iterator)

    rejected.reject("flaky")

    with pytest.raises(WouldBlock):  # 4 and 5 wait: the rejected one comes again first
        async_consumer.receive_nowait()
    timers.fire_all()
    got = []
    for _ in range(3):
        delivery = await anext(iterator)
        got.append((delivery.message, delivery.seq_nr, delivery.attempt))
        delivery.confirm()
    assert got == [("m3", 3, 2), ("m4", 4, 1), ("m5", 5, 1)]


async def test_a_delivery_confirmed_on_a_thread_cannot_be_confirmed_again_on_the_loop(
    async_consumer: AsyncConsumer, pc: Probe
) -> None:
    """The loop's own confirm path is a shortcut: it still refuses a delivery a worker
    thread confirmed already, before the loop took that confirmation in."""
    async_consumer.ref.tell_many([first(pc), run(pc, 2, 3)])  # type: ignore[attr-defined]
    iterator = aiter(async_consumer)
    (await anext(iterator)).confirm()
    delivery = await anext(iterator)
    worker = threading.Thread(target=delivery.confirm)
    worker.start()
    worker.join(WAIT)  # the loop is blocked meanwhile: the confirmation waits for it

    with pytest.raises(LocalProtocolError, match="confirm each delivery once"):
        delivery.confirm()

    await asyncio.sleep(0)  # the loop takes the worker's confirmation in
    last = await anext(iterator)
    assert (last.seq_nr, async_consumer.statistics().confirmed) == (3, 2)
    last.confirm()
    assert async_consumer.statistics().confirmed == 3


def count_deliveries_from_runs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The seq_nrs delivered straight from runs (`ConsumerCore.next_delivery` of a
    `SequencedRun`), from now on."""
    from_runs: list[int] = []
    next_delivery = ConsumerCore.next_delivery

    def counted(
        core: ConsumerCore, head: SequencedMessage | SequencedRun, run: bool = False
    ) -> Delivery | None:
        delivery = next_delivery(core, head, run)
        if delivery is not None and run:
            from_runs.append(delivery.seq_nr)
        return delivery

    monkeypatch.setattr(ConsumerCore, "next_delivery", counted)
    return from_runs
