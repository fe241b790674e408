"""ProducerControllerSpec, ported to the pure `ProducerCore`.

The core is driven through `tests.harness`: a `Probe` plays the consumer controller
(registered with `RegisterConsumer`), another `Probe` plays the producer, and timers run on
a `FakeClock`. The consumer side's wire messages (`Request`, `Ack`, `Resend`) are fed by
hand, as the original sends them to the upcast `ProducerControllerImpl`. "After about 1 s"
is ``clock.advance(...)``; ``expectNoMessage`` is advancing the clock by the same amount,
then ``probe.expect_no_message()``.

Original test (ProducerControllerSpec, reference section 7.1) -> test here:

1. resend lost initial SequencedMessage -> test_resends_lost_initial_sequenced_message
2. resend lost SequencedMessage when receiving Resend
   -> test_resend_makes_it_resend_unconfirmed_from_the_given_seq_nr
3. resend last lost SequencedMessage when receiving Request
   -> test_request_via_timeout_resends_all_unconfirmed
4. support registration of new ConsumerController
   -> test_new_consumer_controller_gets_first_unconfirmed_as_first_then_the_rest
5. reply to MessageWithConfirmation -> test_replies_to_message_with_confirmation_once_confirmed
6. allow restart of producer -> test_restarted_producer_gets_request_next_at_once
7. chunk large messages -> test_chunks_large_messages_one_seq_nr_per_chunk
8. [without resends] not resend last lost SequencedMessage when receiving Request
   -> test_without_resends_request_via_timeout_resends_nothing
9. [without resends] reply to MessageWithConfirmation for lost messages
   -> test_without_resends_replies_to_message_with_confirmation

Deliberate divergences from Akka (see the module docstring of producer_core.py), after the
ported tests:

* P1 -> test_window_below_three_delivers_without_stalling (windows 1 and 2)
* P2 -> test_resend_zero_resends_the_head_already_marked_first
* P16 -> test_first_confirmation_of_a_fresh_session_resends_nothing,
  test_first_confirmation_pushes_only_what_was_sent_before_the_new_consumer
* test_sending_without_demand_is_refused_and_leaves_state_unchanged
* test_request_confirming_above_its_up_to_cannot_be_built
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from pykka_delivery.delivery.core.effects import CancelTimer
from pykka_delivery.delivery.core.producer import (
    RESEND_FIRST,
    ProducerCore,
    ProducerPhase,
    ProducerSnapshot,
)
from pykka_delivery.delivery.core.settings import (
    ConsumerControllerSettings,
    ProducerControllerSettings,
)
from pykka_delivery.delivery.messages import (
    ConsumerStart,
    Delivery,
    MessageWithConfirmation,
    ProducerStart,
    RequestNext,
    SendNext,
)
from pykka_delivery.errors import LocalProtocolError
from pykka_delivery.protocol.messages import (
    Ack,
    ChunkedMessage,
    Ref,
    RegisterConsumer,
    Request,
    Resend,
    SequencedMessage,
)
from pykka_delivery.protocol.serialization import STR
from tests.harness import (
    Driver,
    FakeClock,
    Network,
    Probe,
    SelfRef,
    consumer_driver,
    producer_driver,
)

PRODUCER_ID = "p-1"


def seq(
    n: int, pc: Ref, first: bool | None = None, ack: bool = False, msg: Any = None
) -> SequencedMessage:
    """The `SequencedMessage` the original's ``TestConsumer.sequencedMessage`` builds."""
    return SequencedMessage(
        PRODUCER_ID,
        n,
        f"msg-{n}" if msg is None else msg,
        n == 1 if first is None else first,
        ack,
        pc,
    )


@dataclass
class Rig:
    """One producer core with probes as its producer and its consumer controller."""

    clock: FakeClock
    driver: Driver
    pc: SelfRef
    producer: Probe
    cc: Probe

    @property
    def core(self) -> ProducerCore:
        core = self.driver.core
        assert isinstance(core, ProducerCore)
        return core

    def snapshot(self) -> ProducerSnapshot:
        return self.core.snapshot()

    def feed(self, message: object) -> list[Any]:
        return self.driver.feed(message)

    def send_next(self, message: object, producer: Probe | None = None) -> RequestNext:
        """Take the producer's `RequestNext` and send ``message`` through ``send_next_to``."""
        request_next = (producer or self.producer).expect_type(RequestNext)
        request_next.send_next_to.tell(message)
        return request_next

    def ask_next(self, message: object, reply_to: Probe) -> None:
        """Take the producer's `RequestNext` and send ``message`` with confirmation."""
        request_next = self.producer.expect_type(RequestNext)
        request_next.ask_next_to.tell(MessageWithConfirmation(message, reply_to))


def start(settings: ProducerControllerSettings | None = None) -> Rig:
    """Start the producer and register a consumer-controller probe, as every test does."""
    clock = FakeClock()
    driver, pc, producer = producer_driver(clock, PRODUCER_ID, settings=settings)
    cc = Probe("consumer-controller")
    driver.feed(ProducerStart(producer))
    driver.feed(RegisterConsumer(cc))
    return Rig(clock, driver, pc, producer, cc)


def request_next(current_seq_nr: int, confirmed_seq_nr: int, rig: Rig) -> RequestNext:
    return RequestNext(PRODUCER_ID, current_seq_nr, confirmed_seq_nr, rig.pc, rig.pc)


def send_first_and_open_window(rig: Rig) -> None:
    """msg-1, then the consumer side's ``Request(1, 10)``: the start of most scenarios."""
    rig.send_next("msg-1")
    rig.cc.expect(seq(1, rig.pc))
    rig.feed(Request(1, 10, True, False))


def send_three(rig: Rig) -> None:
    """msg-1 to msg-3 sent, the window open up to 10, nothing confirmed but msg-1."""
    send_first_and_open_window(rig)
    rig.send_next("msg-2")
    rig.send_next("msg-3")
    rig.cc.drain()


# --- ProducerControllerSpec ------------------------------------------------------------


def test_resends_lost_initial_sequenced_message() -> None:
    rig = start()

    rig.send_next("msg-1")

    rig.cc.expect(seq(1, rig.pc))
    # Neither a Request nor a loss of the first message shows: it goes again after 1 s.
    rig.clock.advance(1.0)
    rig.cc.expect(seq(1, rig.pc))

    effects = rig.feed(Request(1, 10, True, False))

    assert CancelTimer(RESEND_FIRST) in effects
    rig.clock.advance(1.1)
    rig.cc.expect_no_message()
    assert rig.snapshot().unconfirmed == ()


def test_resend_makes_it_resend_unconfirmed_from_the_given_seq_nr() -> None:
    rig = start()
    send_first_and_open_window(rig)
    for n in (2, 3, 4):
        rig.send_next(f"msg-{n}")
        rig.cc.expect(seq(n, rig.pc))

    # 3 was lost: when 4 arrived the consumer controller saw the gap.
    rig.feed(Resend(3))

    rig.cc.expect(seq(3, rig.pc))
    rig.cc.expect(seq(4, rig.pc))
    rig.cc.expect_no_message()
    assert rig.snapshot().unconfirmed == (2, 3, 4)
    rig.send_next("msg-5")
    rig.cc.expect(seq(5, rig.pc))


def test_request_via_timeout_resends_all_unconfirmed() -> None:
    rig = start()
    send_first_and_open_window(rig)
    for n in (2, 3, 4):
        rig.send_next(f"msg-{n}")
        rig.cc.expect(seq(n, rig.pc))

    # 3 and 4 were lost and nothing follows them, so no gap ever shows: the consumer
    # controller's retry timer sends the Request again, marked via_timeout.
    rig.feed(Request(2, 10, True, True))

    rig.cc.expect(seq(3, rig.pc))
    rig.cc.expect(seq(4, rig.pc))
    rig.cc.expect_no_message()
    assert rig.snapshot().unconfirmed == (3, 4)
    rig.send_next("msg-5")
    rig.cc.expect(seq(5, rig.pc))


def test_new_consumer_controller_gets_first_unconfirmed_as_first_then_the_rest() -> None:
    rig = start()
    send_three(rig)
    cc2 = Probe("consumer-controller-2")

    rig.feed(RegisterConsumer(cc2))

    # Only the oldest unconfirmed goes, marked first; then the resend-first timer repeats it.
    cc2.expect(seq(2, rig.pc, first=True))
    assert rig.snapshot().first_seq_nr == 2
    rig.clock.advance(0.1)
    cc2.expect_no_message()
    rig.clock.advance(0.9)
    cc2.expect(seq(2, rig.pc, first=True))
    # The new consumer controller confirms its first message: the rest of the backlog follows.
    rig.feed(Request(2, 10, True, False))
    cc2.expect(seq(3, rig.pc))
    rig.send_next("msg-4")
    cc2.expect(seq(4, rig.pc))
    cc2.expect_no_message()
    rig.cc.expect_no_message()


def test_replies_to_message_with_confirmation_once_confirmed() -> None:
    rig = start()
    replies = Probe("reply-to")

    rig.ask_next("msg-1", replies)
    rig.cc.expect(seq(1, rig.pc, ack=True))
    rig.feed(Request(1, 10, True, False))
    replies.expect(1)

    rig.ask_next("msg-2", replies)
    rig.cc.expect(seq(2, rig.pc, ack=True))
    rig.feed(Ack(2))
    replies.expect(2)

    rig.ask_next("msg-3", replies)
    rig.ask_next("msg-4", replies)
    rig.cc.expect(seq(3, rig.pc, ack=True))
    rig.cc.expect(seq(4, rig.pc, ack=True))
    # Ack(3) was lost; Ack(4) answers both, in seq_nr order.
    rig.feed(Ack(4))
    replies.expect(3)
    replies.expect(4)

    rig.ask_next("msg-5", replies)
    rig.cc.expect(seq(5, rig.pc, ack=True))
    # Ack(5) was lost; a later Request confirms it.
    rig.feed(Request(5, 15, True, False))
    replies.expect(5)
    replies.expect_no_message()
    assert rig.snapshot().pending_replies == ()


def test_restarted_producer_gets_request_next_at_once() -> None:
    rig = start()
    send_first_and_open_window(rig)
    rig.send_next("msg-2")
    rig.cc.expect(seq(2, rig.pc))
    assert rig.producer.expect_type(RequestNext).current_seq_nr == 3
    producer2 = Probe("producer-2")

    rig.feed(ProducerStart(producer2))

    # The new producer has the permission the old one held: the same seq_nr 3.
    producer2.expect(request_next(3, 1, rig)).send_next_to.tell("msg-3")
    rig.producer.expect_no_message()
    rig.cc.expect(seq(3, rig.pc))
    rig.send_next("msg-4", producer2)
    rig.cc.expect(seq(4, rig.pc))


def test_chunks_large_messages_one_seq_nr_per_chunk() -> None:
    rig = start(ProducerControllerSettings(chunk_large_messages=1))

    # "abc" serializes to 3 bytes: 3 chunks of 1 byte, each with its own seq_nr. Only the
    # first fits the initial window of 1.
    rig.send_next("abc")

    rig.cc.expect(seq(1, rig.pc, msg=ChunkedMessage(b"a", True, False, STR, "")))
    rig.cc.expect_no_message()
    assert rig.snapshot().remaining_chunks == (2, 3)
    rig.producer.expect_no_message()

    rig.feed(Request(0, 10, True, False))

    rig.cc.expect(seq(2, rig.pc, msg=ChunkedMessage(b"b", False, False, STR, "")))
    rig.cc.expect(seq(3, rig.pc, msg=ChunkedMessage(b"c", False, True, STR, "")))
    rig.send_next("d")
    rig.cc.expect(seq(4, rig.pc, msg=ChunkedMessage(b"d", True, True, STR, "")))
    assert rig.snapshot().current_seq_nr == 5


def test_without_resends_request_via_timeout_resends_nothing() -> None:
    rig = start()
    rig.send_next("msg-1")
    rig.cc.expect(seq(1, rig.pc))
    rig.feed(Request(1, 10, False, False))
    for n in (2, 3, 4):
        rig.send_next(f"msg-{n}")
        rig.cc.expect(seq(n, rig.pc))

    # 3 and 4 were lost, but the consumer side said it does not support resends.
    rig.feed(Request(2, 10, False, True))

    rig.clock.advance(0.1)
    rig.cc.expect_no_message()
    snapshot = rig.snapshot()
    assert (snapshot.support_resend, snapshot.unconfirmed) == (False, ())
    rig.send_next("msg-5")
    rig.cc.expect(seq(5, rig.pc))


def test_without_resends_replies_to_message_with_confirmation() -> None:
    rig = start()
    replies = Probe("reply-to")

    rig.ask_next("msg-1", replies)
    rig.cc.expect(seq(1, rig.pc, ack=True))
    rig.feed(Request(1, 10, False, False))
    replies.expect(1)

    rig.ask_next("msg-2", replies)
    rig.cc.expect(seq(2, rig.pc, ack=True))
    rig.feed(Ack(2))
    replies.expect(2)

    rig.ask_next("msg-3", replies)
    rig.ask_next("msg-4", replies)
    rig.cc.expect(seq(3, rig.pc, ack=True))
    rig.cc.expect(seq(4, rig.pc, ack=True))
    rig.feed(Ack(4))
    replies.expect(3)
    replies.expect(4)

    rig.ask_next("msg-5", replies)
    rig.cc.expect(seq(5, rig.pc, ack=True))
    rig.feed(Request(5, 15, False, False))
    replies.expect(5)
    replies.expect_no_message()
    # Nothing is kept for resending, yet every reply came.
    assert rig.snapshot().unconfirmed == ()


# --- deliberate divergences from Akka ----------------------------------------------------


def deliver_over_a_fifo(window: int, count: int) -> tuple[list[tuple[int, object]], ProducerCore]:
    """A producer core and a consumer core talking through an in-memory FIFO link, the
    clock never moving: the producer sends whenever it may, the consumer confirms when
    nothing else is to do. Returns what was delivered, and the producer core."""
    clock = FakeClock()
    network = Network()
    producer_side, pc, producer = producer_driver(clock, PRODUCER_ID)
    consumer_side, cc = consumer_driver(
        clock, settings=ConsumerControllerSettings(flow_control_window=window)
    )
    pc.target = network.link(producer_side.feed).tell
    cc.target = network.link(consumer_side.feed).tell
    consumer = Probe("consumer")
    producer_side.feed(ProducerStart(producer))
    producer_side.feed(RegisterConsumer(cc))
    consumer_side.feed(ConsumerStart(consumer))
    delivered: list[tuple[int, object]] = []
    next_n = 1

    while True:
        network.run()
        if producer.messages and next_n <= count:
            producer.expect_type(RequestNext).send_next_to.tell(f"msg-{next_n}")
            next_n += 1
        elif consumer.messages:
            delivery = consumer.expect_type(Delivery)
            delivered.append((delivery.seq_nr, delivery.message))
            delivery.confirm()
        else:
            break

    assert clock.now == 0.0
    core = producer_side.core
    assert isinstance(core, ProducerCore)
    return delivered, core


@pytest.mark.parametrize("window", [1, 2])
def test_window_below_three_delivers_without_stalling(window: int) -> None:
    # P1: Akka grants a RequestNext only when a Request reaches *beyond* current_seq_nr, and
    # its consumer side never asks far enough ahead with windows 1 and 2: the flow stalls.
    # Here 10 messages go through with no timer firing.
    delivered, core = deliver_over_a_fifo(window, 10)

    assert delivered == [(n, f"msg-{n}") for n in range(1, 11)]
    snapshot = core.snapshot()
    assert (snapshot.confirmed_seq_nr, snapshot.unconfirmed) == (10, ())


def test_first_confirmation_of_a_fresh_session_resends_nothing() -> None:
    # P16: Akka resends everything unconfirmed when the consumer controller confirms its
    # first message. In a fresh session everything after the first message went to that
    # consumer controller already, behind the first: its first window went twice.
    delivered, core = deliver_over_a_fifo(10, 30)

    assert delivered == [(n, f"msg-{n}") for n in range(1, 31)]
    # The producer had sent 2..10 before msg-1 was confirmed.
    assert core.statistics().sent == 30
    assert core.statistics().resent == 0


def test_first_confirmation_pushes_only_what_was_sent_before_the_new_consumer() -> None:
    # P16: the backlog pushed after a new consumer controller's first confirmation is what
    # was sent before it registered; what went to it afterwards is not sent twice.
    rig = start()
    send_three(rig)
    cc2 = Probe("consumer-controller-2")
    rig.feed(RegisterConsumer(cc2))
    cc2.expect(seq(2, rig.pc, first=True))
    rig.send_next("msg-4")  # the window the old consumer controller opened allows it
    cc2.expect(seq(4, rig.pc))

    rig.feed(Request(2, 10, True, False))

    cc2.expect(seq(3, rig.pc))
    cc2.expect_no_message()
    assert rig.snapshot().unconfirmed == (3, 4)
    # A retry on silence still resends everything unconfirmed.
    rig.feed(Request(2, 10, True, True))
    cc2.expect(seq(3, rig.pc))
    cc2.expect(seq(4, rig.pc))
    cc2.expect_no_message()


def test_resend_zero_resends_the_head_already_marked_first() -> None:
    # P2: Akka resends first and marks the head first afterwards, so a fresh consumer
    # controller, which accepts only a first message, needs a second round.
    rig = start()
    send_three(rig)

    rig.feed(Resend(0))

    rig.cc.expect(seq(2, rig.pc, first=True))
    rig.cc.expect(seq(3, rig.pc, first=False))
    rig.cc.expect_no_message()


def test_sending_without_demand_is_refused_and_leaves_state_unchanged() -> None:
    rig = start()
    rig.send_next("msg-1")  # the initial window holds only seq_nr 1
    rig.cc.drain()
    before = rig.snapshot()

    with pytest.raises(LocalProtocolError, match="no demand"):
        rig.feed(SendNext("msg-2"))

    assert rig.snapshot() == before
    assert before.phase is ProducerPhase.ACTIVE
    rig.cc.expect_no_message()
    assert rig.core.statistics().rejected == 1


def test_request_confirming_above_its_up_to_cannot_be_built() -> None:
    with pytest.raises(ValueError, match="confirmed_seq_nr 5 is above request_up_to_seq_nr 4"):
        Request(5, 4)
