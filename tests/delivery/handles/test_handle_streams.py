"""Whole streams through the handles, whichever flavour: blocking or asyncio.

Long runs, chunked messages, loss and its recovery, a stream moved to another consumer,
and the actors at the other end. As in test_handle_scenarios.py, each runs over both
flavours through the `flavour` fixture (flavours.py); a second caller (a sender, a
reader) runs on a daemon thread, every wait is bounded by `WAIT`, and no test asserts how
long anything took. pykka actors are stopped after each test (tests/conftest.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pykka
import pytest

from pykka_delivery import (
    ConsumerController,
    ConsumerControllerSettings,
    Delivery,
    DeliveryTimeout,
    LossyRef,
    ProducerController,
    ProducerControllerSettings,
    Ref,
    RequestNext,
)
from pykka_delivery.protocol.messages import Ack, Request, Resend, SequencedMessage
from tests.delivery.handles.flavours import (
    FAST_RETRY,
    LONG,
    WAIT,
    DropOnce,
    Flavour,
    Reader,
    connected,
    in_thread,
    receive_and_confirm,
)

# --- a whole stream ----------------------------------------------------------------


def test_an_in_process_stream_takes_payloads_no_serializer_could_encode(
    flavour: Flavour,
) -> None:
    # Issue 19, defect 1: only a consumer side in another process gets its payloads
    # checked; in-process, any object goes through as it is.
    p, c = connected(flavour)
    anything, lock = object(), threading.Lock()

    p.send(anything, timeout=WAIT)
    first = c.receive(timeout=WAIT)
    first.confirm()
    p.send_many([lock, {"lock": lock}], timeout=WAIT)

    rest = receive_and_confirm(c, 2)
    assert first.message is anything
    assert rest[0] is lock
    assert rest[1]["lock"] is lock
    assert p.statistics().refused_payloads == 0


def test_ten_thousand_messages_arrive_exactly_once_in_order_and_are_all_confirmed(
    flavour: Flavour,
) -> None:
    p, c = connected(flavour, consumer_settings=FAST_RETRY)
    reader = Reader(c, 10_000)

    for i in range(10_000):
        p.send(i, timeout=WAIT)

    assert reader.wait() == list(range(10_000))
    assert [d.seq_nr for d in reader.deliveries] == list(range(1, 10_001))
    p.wait_confirmed(timeout=WAIT)
    assert p.snapshot().unconfirmed == ()
    assert p.snapshot().confirmed_seq_nr == 10_000
    reader.close()


# --- chunking ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "message",
    [
        "héllo, wörld: a string cut into pieces of three bytes",
        bytes(range(256)) * 4,  # 1 KiB: 342 chunks, several windows
        {"order": 17, "lines": [{"sku": "ä-1", "qty": 2}, {"sku": "b", "qty": None}], "ok": True},
    ],
    ids=["str", "bytes", "json-dict"],
)
def test_a_chunked_message_arrives_whole_and_equal_with_the_seq_nr_send_returned(
    flavour: Flavour, message: Any
) -> None:
    p, c = connected(flavour, ProducerControllerSettings(chunk_large_messages=3), FAST_RETRY)
    reader = Reader(c, 2)

    seq_nr = p.send(message, timeout=WAIT)
    p.send("after", timeout=WAIT)

    got = reader.wait()
    assert got == [message, "after"]
    assert type(got[0]) is type(message)
    assert reader.deliveries[0].seq_nr == seq_nr > 3  # it really was cut into pieces
    reader.close()


def test_send_of_a_chunked_first_message_returns_the_seq_nr_its_delivery_carries(
    flavour: Flavour,
) -> None:
    # Regression (handles/producer.py, Producer.send): it returned current_seq_nr - 1, the
    # last chunk sent so far. When the window does not take every chunk at once (here the
    # first message of a session: window 1 until the consumer's first Request), that is
    # not the message's seq_nr; the Delivery carries the last chunk's (10 here).
    p, c = connected(flavour, ProducerControllerSettings(chunk_large_messages=3), FAST_RETRY)
    reader = Reader(c, 1)

    seq_nr = p.send("x" * 30, timeout=WAIT)  # 30 bytes: 10 chunks

    reader.wait()
    assert seq_nr == reader.deliveries[0].seq_nr == 10
    reader.close()


# --- loss and recovery -------------------------------------------------------------


LOSSY_BOUND = 60.0  # the whole lossy run; it takes a few seconds


@pytest.mark.parametrize("seed", [1, 7, 42])
def test_messages_over_a_link_losing_30_percent_both_ways_arrive_exactly_once_in_order(
    flavour: Flavour, seed: int
) -> None:
    # 30 % loss both ways costs a gap every few messages, each recovered by a Resend round
    # trip that is itself often lost, then retried: retries are made quick (5-50 ms). They
    # come from the timer thread, so this also runs the cross-thread wake-ups of both handles.
    count = 500
    faults: dict[str, LossyRef] = {}

    def lossy(name: str, types: tuple[type, ...], salt: int) -> Callable[[Ref], Ref]:
        def factory(ref: Ref) -> Ref:
            faults[name] = LossyRef(ref, drop=0.3, types=types, seed=seed + salt)
            return faults[name]

        return factory

    p = flavour.producer(
        "p-1",
        ProducerControllerSettings(resend_first_interval=0.005),
        self_ref_factory=lossy("to_producer", (Request, Resend, Ack), 1),
    )
    c = flavour.consumer(
        ConsumerControllerSettings(resend_interval_min=0.005, resend_interval_max=0.05),
        self_ref_factory=lossy("to_consumer", (SequencedMessage,), 0),
    )
    c.register_to(p.ref)
    reader = Reader(c, count)
    deadline = time.monotonic() + LOSSY_BOUND

    for i in range(count):
        p.send(i, timeout=max(0.01, deadline - time.monotonic()))

    assert reader.wait() == list(range(count))
    assert [d.seq_nr for d in reader.deliveries] == list(range(1, count + 1))
    p.wait_confirmed(timeout=WAIT)
    assert faults["to_consumer"].dropped > 0
    assert faults["to_producer"].dropped > 0
    reader.close()


def test_an_idle_producer_resends_the_lost_last_message_on_the_consumers_retry(
    flavour: Flavour,
) -> None:
    p = flavour.producer("p-1")
    c = flavour.consumer(FAST_RETRY)
    link = DropOnce(c.ref, seq_nr=10)
    p.register_consumer(link)
    reader = Reader(c, 10)
    p.send(0, timeout=WAIT)
    p.wait_confirmed(timeout=WAIT)  # first confirmed: no later resend of everything
    for i in range(1, 10):
        p.send(i, timeout=WAIT)
    # From here nothing calls the producer: only the consumer's retry can bring the 10th.

    assert reader.wait() == list(range(10))
    assert link.dropped
    assert link.resent_on, "the last message arrived without being resent"
    assert c.statistics().retries >= 1
    reader.close()


# --- moving the stream -------------------------------------------------------------


def test_a_new_consumer_gets_every_unconfirmed_message_and_the_rest_in_order(
    flavour: Flavour,
) -> None:
    p, c1 = connected(flavour)
    total = 200
    sender, outcome = in_thread(lambda: [p.send(i, timeout=LONG) for i in range(total)], "sender")
    c1_confirmed = receive_and_confirm(c1, 29)
    c1.receive(timeout=WAIT)  # message 29: received, not confirmed

    c2 = flavour.consumer(FAST_RETRY)
    reader = Reader(c2, last=total - 1)
    p.register_consumer(c2.ref)

    got = reader.wait()
    sender.join(WAIT)
    assert "error" not in outcome, outcome
    assert c1_confirmed == list(range(29))
    # At least once across the switch: c2 starts at or before the first message c1 did
    # not confirm, and goes on without gaps or duplicates.
    assert got[0] <= 29
    assert got == list(range(got[0], total))
    reader.close()


# --- interoperation with the actors ------------------------------------------------


class Collector(pykka.ThreadingActor):
    """A consumer actor: records each Delivery's message and confirms it."""

    use_daemon_thread = True

    def __init__(self, messages: list[Any], expected: int, done: threading.Event) -> None:
        super().__init__()
        self.messages = messages
        self.expected = expected
        self.done = done

    def on_receive(self, message: Any) -> None:
        if isinstance(message, Delivery):
            self.messages.append(message.message)
            message.confirm()
            if len(self.messages) >= self.expected:
                self.done.set()


class Source(pykka.ThreadingActor):
    """A producer actor: sends 0, 1, 2, ... one per RequestNext, ``total`` in all."""

    use_daemon_thread = True

    def __init__(self, total: int) -> None:
        super().__init__()
        self.total = total
        self.next = 0

    def on_receive(self, message: Any) -> None:
        if isinstance(message, RequestNext) and self.next < self.total:
            message.send_next_to.tell(self.next)
            self.next += 1


def test_a_producer_handle_delivers_to_a_consumer_controller_actor(flavour: Flavour) -> None:
    p = flavour.producer("p-1")
    messages: list[Any] = []
    done = threading.Event()
    collector = Collector.start(messages, 1000, done)
    cc = ConsumerController.start(FAST_RETRY, timer_service=flavour.timers)
    cc.tell(ConsumerController.Start(collector))
    cc.tell(ConsumerController.RegisterToProducerController(p.ref))

    for i in range(1000):
        p.send(i, timeout=WAIT)

    assert done.wait(WAIT)
    p.wait_confirmed(timeout=WAIT)
    assert messages == list(range(1000))


def test_a_producer_controller_actor_delivers_to_a_consumer_handle(flavour: Flavour) -> None:
    pc = ProducerController.start("p-1", timer_service=flavour.timers)
    pc.tell(ProducerController.Start(Source.start(1000)))
    c = flavour.consumer(FAST_RETRY)
    c.register_to(pc)

    deliveries = []
    for _ in range(1000):
        delivery = c.receive(timeout=WAIT)
        deliveries.append(delivery)
        delivery.confirm()

    assert [d.message for d in deliveries] == list(range(1000))
    assert [d.seq_nr for d in deliveries] == list(range(1, 1001))
    with pytest.raises(DeliveryTimeout):
        c.receive(timeout=0.2)  # and nothing more
