"""DurableProducerControllerSpec, ported: the producer controller with a durable queue.

First on the pure `ProducerCore` (tests/harness.py: probes, a fake clock), with a
`StoringDriver` that carries out the store effects on a `MemoryDurableQueue` in order, so
each test asserts on the effects and on the queue's state. Then the key scenarios through
the shells with a `MemoryDurableQueue`: the `ProducerController` actor, the `Producer`
handle and the `AsyncProducer`. Timestamps come from a fixed clock (`TS`), as the
original's ``TestTimestamp``.

Original test (DurableProducerControllerSpec, reference section 7.3) -> test here:

1. load initial state and resend unconfirmed
   -> test_load_initial_state_and_resend_unconfirmed
2. store confirmations -> test_store_confirmations
3. reply to MessageWithConfirmation after storage
   -> test_reply_to_message_with_confirmation_after_storage
4. store chunked messages -> test_store_chunked_messages
5. load initial state but don't resend partially stored chunked messages
   -> test_load_initial_state_but_dont_resend_partially_stored_chunked_messages
6. resume correctly after restart with empty unconfirmed buffer
   -> test_resume_correctly_after_restart_with_empty_unconfirmed_buffer

Where we differ: P3 (docs/decisions.md) -> test_first_unconfirmed_is_resent_by_the_timer_
after_a_reload. The queue is called synchronously, so "retries" are the shell's
(`DurableQueueCalls`), tested through each shell.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from pykka_delivery.delivery.actors.consumer_controller import ConsumerController
from pykka_delivery.delivery.actors.producer_controller import ProducerController
from pykka_delivery.delivery.core.effects import (
    Effect,
    Send,
    StartTimer,
    StoreMessageConfirmed,
    StoreMessageSent,
    StoreMessagesSent,
)
from pykka_delivery.delivery.core.producer import RESEND_FIRST, ProducerCore
from pykka_delivery.delivery.core.settings import (
    ConsumerControllerSettings,
    ProducerControllerSettings,
)
from pykka_delivery.delivery.handles.async_producer import AsyncProducer
from pykka_delivery.delivery.handles.consumer import Consumer
from pykka_delivery.delivery.handles.producer import Producer
from pykka_delivery.delivery.messages import (
    CONFIRMED,
    ConsumerStart,
    Delivery,
    MessageWithConfirmation,
    ProducerStart,
    RegisterToProducerController,
    RequestNext,
    SendNext,
)
from pykka_delivery.delivery.stores.calls import DurableQueueCalls
from pykka_delivery.delivery.stores.durable_memory import MemoryDurableQueue
from pykka_delivery.delivery.stores.durable_queue import (
    NO_QUALIFIER,
    DurableProducerState,
    DurableQueueError,
    MessageSent,
)
from pykka_delivery.delivery.timers import TimerService
from pykka_delivery.errors import ClosedError, DeliveryTimeout
from pykka_delivery.protocol.messages import (
    Ack,
    ChunkedMessage,
    Ref,
    RegisterConsumer,
    Request,
    SequencedMessage,
)
from pykka_delivery.protocol.serialization import STR
from tests.actor_kit import BlockingProbe, Recorder, TestConsumer
from tests.harness import Driver, FakeClock, Network, Probe, SelfRef, consumer_driver

PRODUCER_ID = "p-1"
TS = 1_700_000_000_000  # every stored timestamp (the original's TestTimestamp)
WAIT = 10.0  # bound on every wait that is expected to succeed
CHUNKED = ProducerControllerSettings(chunk_large_messages=1)
# Retries without real waiting, so a test of the last attempt stays fast.
QUICK_RETRIES = ProducerControllerSettings(
    durable_queue_retry_attempts=3, durable_queue_retry_backoff=0.0
)


def fixed_clock() -> int:
    return TS


def sent(n: int, msg: Any = None, ack: bool = False) -> MessageSent:
    """The `MessageSent` of ``msg-<n>`` (the original's ``MessageSent(n, Job("msg-n"))``)."""
    return MessageSent(n, f"msg-{n}" if msg is None else msg, ack, NO_QUALIFIER, TS)


def seq(
    n: int, pc: Ref, first: bool = False, ack: bool = False, msg: Any = None
) -> SequencedMessage:
    return SequencedMessage(PRODUCER_ID, n, f"msg-{n}" if msg is None else msg, first, ack, pc)


def state(
    current: int, confirmed: int, *unconfirmed: MessageSent, at: int = TS
) -> DurableProducerState:
    """``DurableProducerState(current, confirmed, {"" -> (confirmed, at)}, unconfirmed)``; no
    confirmation record when ``confirmed`` is 0, as in the original's ``Map.empty``."""
    records = {NO_QUALIFIER: (confirmed, at)} if confirmed else {}
    return DurableProducerState(current, confirmed, records, unconfirmed)


def chunk(data: bytes, first: bool, last: bool) -> ChunkedMessage:
    return ChunkedMessage(data, first, last, STR, "")


# --- the pure core, with the queue applied in effect order ----------------------------


class StoringDriver(Driver):
    """A harness `Driver` that also carries out the store effects on ``queue``, in order
    with the sends (a send after a store happens after it)."""

    def __init__(self, core: ProducerCore, clock: FakeClock, queue: MemoryDurableQueue) -> None:
        super().__init__(core, clock)
        self.queue = queue

    def apply(self, effects: Any) -> list[Effect]:
        done = list(effects)
        for effect in done:
            if isinstance(effect, StoreMessageSent):
                self.queue.store_message_sent(effect.sent)
            elif isinstance(effect, StoreMessagesSent):
                self.queue.store_messages_sent(effect.sents)
            elif isinstance(effect, StoreMessageConfirmed):
                self.queue.store_message_confirmed(
                    effect.seq_nr, effect.qualifier, effect.timestamp_millis
                )
            else:
                super().apply([effect])
                continue
            self.effects_log.append(effect)
        return done


class Rig:
    """A durable producer core started on ``queue``'s state, with probes as its producer
    and its consumer controller (``Start`` and ``RegisterConsumer`` already fed)."""

    def __init__(
        self,
        queue: MemoryDurableQueue,
        settings: ProducerControllerSettings | None = None,
        *,
        announce_demand: bool = True,
    ) -> None:
        self.queue = queue
        self.clock = FakeClock()
        self.pc = SelfRef(f"pc-{PRODUCER_ID}")
        send_next_to = SelfRef("send-next")
        self.core = ProducerCore(
            PRODUCER_ID,
            self.pc,
            send_next_to,
            settings,
            announce_demand=announce_demand,
            durable_state=queue.load_state(),
            clock_millis=fixed_clock,
        )
        self.driver = StoringDriver(self.core, self.clock, queue)
        self.pc.target = self.driver.feed
        send_next_to.target = lambda m: self.driver.feed(SendNext(m))
        self.producer = Probe("producer")
        self.cc = Probe("consumer-controller")
        self.feed(ProducerStart(self.producer))
        self.feed(RegisterConsumer(self.cc))

    def feed(self, message: object) -> list[Effect]:
        return self.driver.feed(message)

    def send_next(self, message: object) -> RequestNext:
        request_next = self.producer.expect_type(RequestNext)
        request_next.send_next_to.tell(message)
        return request_next

    def ask_next(self, message: object, reply_to: Probe) -> None:
        request_next = self.producer.expect_type(RequestNext)
        request_next.ask_next_to.tell(MessageWithConfirmation(message, reply_to))


def test_load_initial_state_and_resend_unconfirmed() -> None:
    """DurableProducerControllerSpec: load initial state and resend unconfirmed."""
    queue = MemoryDurableQueue(state(5, 2, sent(3), sent(4)))

    rig = Rig(queue)

    # No RequestNext to the producer: it has unconfirmed messages to begin with.
    rig.producer.expect_no_message()
    rig.cc.expect(seq(3, rig.pc, first=True))
    rig.cc.expect_no_message()
    rig.feed(Request(3, 13, True, False))
    rig.cc.expect(seq(4, rig.pc))
    request_next = rig.send_next("msg-5")
    assert (request_next.current_seq_nr, request_next.confirmed_seq_nr) == (5, 3)
    rig.cc.expect(seq(5, rig.pc))
    assert queue.state == state(6, 3, sent(4), sent(5))


def test_store_confirmations() -> None:
    """DurableProducerControllerSpec: store confirmations."""
    queue = MemoryDurableQueue()
    rig = Rig(queue)

    rig.send_next("msg-1")

    rig.cc.expect(seq(1, rig.pc, first=True))
    assert queue.state == state(2, 0, sent(1))
    rig.feed(Request(1, 10, True, False))
    assert queue.state == state(2, 1)
    reply_to = Probe("reply-to")
    for n in (2, 3, 4):
        rig.ask_next(f"msg-{n}", reply_to)
        rig.cc.expect(seq(n, rig.pc, ack=True))
    rig.feed(Ack(3))
    assert queue.state == state(5, 3, sent(4, ack=True))


def test_reply_to_message_with_confirmation_after_storage() -> None:
    """DurableProducerControllerSpec: reply to MessageWithConfirmation after storage (the
    reply comes before any confirmation from the consumer side, right after the store)."""
    rig = Rig(MemoryDurableQueue())
    reply_to = Probe("reply-to")

    rig.ask_next("msg-1", reply_to)

    reply_to.expect(1)
    rig.cc.expect(seq(1, rig.pc, first=True, ack=True))
    log = rig.driver.effects_log
    stored = log.index(StoreMessageSent(sent(1, ack=True)))
    assert (
        stored < log.index(Send(reply_to, 1)) < log.index(Send(rig.cc, seq(1, rig.pc, True, True)))
    )
    rig.feed(Request(1, 10, True, False))
    rig.ask_next("msg-2", reply_to)
    reply_to.expect(2)
    reply_to.expect_no_message()  # confirmed later: no second reply


def test_store_chunked_messages() -> None:
    """DurableProducerControllerSpec: store chunked messages (each chunk stored before it
    is sent)."""
    queue = MemoryDurableQueue()
    rig = Rig(queue, CHUNKED)

    rig.send_next("abc")

    first = rig.cc.expect_type(SequencedMessage)
    assert (first.seq_nr, first.is_first_chunk, first.is_last_chunk) == (1, True, False)
    assert queue.state.current_seq_nr == 2
    assert [type(m.message) for m in queue.state.unconfirmed] == [ChunkedMessage]
    rig.feed(Request(0, 10, True, False))
    rig.cc.expect_type(SequencedMessage)
    third = rig.cc.expect_type(SequencedMessage)
    assert (third.seq_nr, third.is_first_chunk, third.is_last_chunk) == (3, False, True)
    assert queue.state.current_seq_nr == 4
    assert [m.message.data for m in queue.state.unconfirmed] == [b"a", b"b", b"c"]
    stores = [e.sent.seq_nr for e in rig.driver.effects_log if isinstance(e, StoreMessageSent)]
    sends = [
        e.message.seq_nr
        for e in rig.driver.effects_log
        if isinstance(e, Send) and isinstance(e.message, SequencedMessage)
    ]
    assert stores == sends == [1, 2, 3]


def test_load_initial_state_but_dont_resend_partially_stored_chunked_messages() -> None:
    """DurableProducerControllerSpec: load initial state but don't resend partially stored
    chunked messages (4 and 5 lack their last chunk: 4 is used again)."""
    queue = MemoryDurableQueue(
        state(
            5,
            2,
            sent(3, chunk(b"abc", True, True)),
            sent(4, chunk(b"d", True, False)),
            sent(5, chunk(b"e", False, False)),
        )
    )
    rig = Rig(queue, CHUNKED)

    third = rig.cc.expect_type(SequencedMessage)
    assert (third.seq_nr, third.is_first_chunk, third.is_last_chunk) == (3, True, True)
    rig.feed(Request(0, 10, True, False))
    rig.cc.expect_no_message()
    rig.send_next("g")
    fourth = rig.cc.expect_type(SequencedMessage)
    assert (fourth.seq_nr, fourth.is_first_chunk, fourth.is_last_chunk) == (4, True, True)
    assert [m.seq_nr for m in queue.state.unconfirmed] == [3, 4]


def test_resume_correctly_after_restart_with_empty_unconfirmed_buffer() -> None:
    """DurableProducerControllerSpec: resume correctly after restart with empty unconfirmed
    buffer (the Pekko fix #2760: demand up to the loaded current seq_nr, not 1)."""
    rig = Rig(MemoryDurableQueue(state(5, 4)))

    request_next = rig.send_next("msg-5")

    assert request_next.current_seq_nr == 5
    rig.cc.expect(seq(5, rig.pc, first=True))


# --- the core: beyond the original -------------------------------------------------------


def test_a_message_is_stored_before_it_is_sent() -> None:
    rig = Rig(MemoryDurableQueue())
    rig.send_next("msg-1")
    rig.feed(Request(1, 10, True, False))
    rig.producer.expect_type(RequestNext)

    effects = rig.core.on_msg("msg-2")

    assert effects == [
        StoreMessageSent(sent(2)),
        Send(rig.cc, seq(2, rig.pc)),
        Send(rig.producer, RequestNext(PRODUCER_ID, 3, 1, rig.core.send_next_to, rig.pc)),
    ]


def test_first_message_of_a_durable_session_is_stored_then_its_timer_started_then_sent() -> None:
    rig = Rig(MemoryDurableQueue())
    rig.producer.expect_type(RequestNext)

    effects = rig.core.on_msg("msg-1")

    assert effects[:3] == [
        StoreMessageSent(sent(1)),
        StartTimer(RESEND_FIRST, 1.0),
        Send(rig.cc, seq(1, rig.pc, first=True)),
    ]


def test_a_confirmation_is_stored_only_when_the_confirmed_seq_nr_rises() -> None:
    rig = Rig(MemoryDurableQueue())
    rig.send_next("msg-1")
    rig.feed(Request(0, 10, True, False))
    for n in (2, 3):
        rig.send_next(f"msg-{n}")

    stored = [
        [e for e in rig.feed(message) if isinstance(e, StoreMessageConfirmed)]
        for message in (Request(2, 12, True, False), Ack(2), Ack(1), Ack(3))
    ]

    assert stored == [
        [StoreMessageConfirmed(2, NO_QUALIFIER, TS)],
        [],
        [],
        [StoreMessageConfirmed(3, NO_QUALIFIER, TS)],
    ]


def test_first_unconfirmed_is_resent_by_the_timer_after_a_reload() -> None:
    """P3 (docs/decisions.md): Akka resends the first unconfirmed message once after a
    reload, without a timer, so losing that one message stalls the session (the consumer
    side's retries go to the old controller). We start the resend-first timer."""
    rig = Rig(MemoryDurableQueue(state(5, 2, sent(3), sent(4))))
    rig.cc.expect(seq(3, rig.pc, first=True))  # lost on its way

    rig.clock.advance(1.0)

    rig.cc.expect(seq(3, rig.pc, first=True))
    rig.feed(Request(3, 13, True, False))
    rig.cc.expect(seq(4, rig.pc))
    rig.clock.advance(2.0)
    rig.cc.expect_no_message()


def test_the_core_drops_partially_stored_chunks_of_a_state_it_is_given() -> None:
    """A queue must clean partial chunks on load; the core does it again, so a queue that
    forgot cannot make it resend half a message."""
    raw = state(5, 2, sent(3, chunk(b"abc", True, True)), sent(4, chunk(b"d", True, False)))

    core = ProducerCore(
        PRODUCER_ID, Probe(), Probe(), CHUNKED, durable_state=raw, clock_millis=fixed_clock
    )

    assert (core.snapshot().unconfirmed, core.current_seq_nr) == ((3,), 4)


def test_a_batch_stores_ahead_of_demand_and_sends_the_rest_as_demand_comes() -> None:
    """``durable_store_ahead`` (default 1 000): the whole batch is stored in one write, the
    window's share is sent now, the rest on the next Request without another write; only
    then does the producer have demand again, and only then is everything confirmed."""
    queue = MemoryDurableQueue()
    rig = Rig(queue, announce_demand=False)
    rig.driver.apply(rig.core.on_msg("msg-1"))
    rig.feed(Request(1, 10, True, False))
    rig.cc.drain()

    effects = rig.driver.apply(rig.core.on_msg_batch(iter([f"msg-{n}" for n in range(2, 13)])))

    assert effects[0] == StoreMessagesSent(tuple(sent(n) for n in range(2, 13)))
    assert effects[1:] == [Send(rig.cc, seq(n, rig.pc)) for n in range(2, 11)]
    assert queue.state == state(13, 1, *(sent(n) for n in range(2, 13)))
    assert (rig.core.last_seq_nr, rig.core.has_demand) == (12, False)
    rig.feed(Request(10, 20, True, False))
    assert not rig.core.all_confirmed  # 11 and 12 were sent just now
    assert rig.core.has_demand
    assert rig.core.statistics().stored == 12  # no second write for 11 and 12
    rig.feed(Ack(12))
    assert rig.core.all_confirmed


def test_a_durable_state_without_a_clock_is_refused() -> None:
    with pytest.raises(ValueError, match="clock_millis"):
        ProducerCore(PRODUCER_ID, Probe(), Probe(), durable_state=DurableProducerState())


def test_a_batch_is_stored_with_one_store_then_sent_in_order() -> None:
    queue = MemoryDurableQueue()
    rig = Rig(queue, ProducerControllerSettings(durable_store_ahead=0), announce_demand=False)
    rig.driver.apply(rig.core.on_msg("msg-1"))
    rig.feed(Request(1, 10, True, False))
    rig.cc.drain()
    messages = iter([f"msg-{n}" for n in range(2, 13)])

    effects = rig.driver.apply(rig.core.on_msg_batch(messages))

    assert effects[0] == StoreMessagesSent(tuple(sent(n) for n in range(2, 11)))
    assert effects[1:] == [Send(rig.cc, seq(n, rig.pc)) for n in range(2, 11)]
    assert list(messages) == ["msg-11", "msg-12"]  # beyond the window: not taken
    assert queue.state == state(11, 1, *(sent(n) for n in range(2, 11)))
    assert rig.core.statistics().stored == 10
    assert not rig.core.has_demand


def test_a_restarted_core_on_the_same_queue_delivers_unconfirmed_again_with_original_seq_nrs() -> (
    None
):
    """Messages stored but never confirmed (the first consumer side vanished) go to a
    new consumer controller from a new core on the same queue, with their original
    seq_nrs, then numbering continues."""
    queue = MemoryDurableQueue()
    first = Rig(queue)
    first.send_next("msg-1")
    first.feed(Request(0, 10, True, False))
    for n in (2, 3):
        first.send_next(f"msg-{n}")
    network = Network()
    consumer, cc_ref = consumer_driver(FakeClock())
    cc_ref.target = network.link(consumer.feed).tell
    app = Probe("consumer")
    consumer.feed(ConsumerStart(app))

    second = Rig(queue)  # registered to a probe first: then moved to the consumer
    second.pc.target = network.link(second.driver.feed).tell
    second.feed(RegisterConsumer(cc_ref))
    got = []
    for _ in range(3):
        network.run()
        delivery = app.expect_type(Delivery)
        got.append((delivery.message, delivery.seq_nr))
        consumer.feed(CONFIRMED)
    network.run()
    second.send_next("msg-4")
    network.run()
    delivery = app.expect_type(Delivery)

    assert [*got, (delivery.message, delivery.seq_nr)] == [
        ("msg-1", 1),
        ("msg-2", 2),
        ("msg-3", 3),
        ("msg-4", 4),
    ]


# --- the retry helper --------------------------------------------------------------------


class FlakyCall:
    """Fails ``failures`` times with ``error``, then returns "ok"."""

    def __init__(self, failures: int, error: Exception) -> None:
        self.failures = failures
        self.error = error
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return "ok"


def calls_with(queue: MemoryDurableQueue, **settings: Any) -> tuple[DurableQueueCalls, list[float]]:
    waits: list[float] = []
    calls = DurableQueueCalls(
        queue, ProducerControllerSettings(**settings), "Producer 'p-1'", sleep=waits.append
    )
    return calls, waits


def test_retries_wait_twice_as_long_each_time_up_to_the_maximum() -> None:
    failing = {"n": 0}

    def fail_five(op: str, arg: object) -> bool:
        failing["n"] += 1
        return failing["n"] <= 5

    queue = MemoryDurableQueue(fail_when=fail_five)
    calls, waits = calls_with(
        queue, durable_queue_retry_backoff=0.01, durable_queue_retry_backoff_max=0.05
    )

    calls.store(StoreMessageSent(sent(1)))

    assert waits == [0.01, 0.02, 0.04, 0.05, 0.05]
    assert queue.state.current_seq_nr == 2
    assert calls.retries == 5


def test_the_last_failed_attempt_raises_an_error_naming_the_call_the_queue_and_the_fix() -> None:
    queue = MemoryDurableQueue(fail_when=lambda op, arg: True)
    calls, waits = calls_with(queue, durable_queue_retry_attempts=4)

    with pytest.raises(DurableQueueError) as raised:
        calls.store(StoreMessageSent(sent(1)))

    text = str(raised.value)
    assert "store_message_sent (seq_nr 1)" in text
    assert "after 4 attempt(s)" in text
    assert "same producer id" in text
    assert queue.calls["store_message_sent"] == 4
    assert len(waits) == 3


def test_an_error_that_is_not_a_durable_queue_error_is_not_retried() -> None:
    calls, waits = calls_with(MemoryDurableQueue())
    broken = FlakyCall(1, OSError("disk on fire"))

    with pytest.raises(DurableQueueError, match="disk on fire"):
        calls._call("load_state", broken)

    assert (broken.calls, waits) == (1, [])


def test_something_that_is_not_a_durable_queue_is_refused_naming_the_protocol() -> None:
    with pytest.raises(TypeError, match="DurableProducerQueue"):
        DurableQueueCalls(object(), ProducerControllerSettings(), "Producer 'p-1'")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("durable_queue_retry_attempts", 0),
        ("durable_queue_retry_backoff", -1.0),
        ("durable_queue_retry_backoff_max", 0.001),
    ],
)
def test_retry_settings_out_of_range_are_refused_naming_the_setting(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=field):
        ProducerControllerSettings(**{field: value})


# --- the ProducerController actor --------------------------------------------------------


class CountingQueue(MemoryDurableQueue):
    """Counts `flush` and `close`, which the memory queue does not count."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.flushes = 0
        self.closes = 0

    def flush(self) -> None:
        self.flushes += 1

    def close(self) -> None:
        self.closes += 1
        super().close()


def start_actor(
    queue: MemoryDurableQueue, settings: ProducerControllerSettings | None = None
) -> tuple[Any, BlockingProbe, BlockingProbe]:
    pc = ProducerController.start(
        PRODUCER_ID, settings, durable_queue=queue, clock_millis=fixed_clock
    )
    producer, cc = BlockingProbe("producer"), BlockingProbe("consumer-controller")
    pc.tell(ProducerStart(producer))
    pc.tell(RegisterConsumer(cc))
    return pc, producer, cc


def take(cc: BlockingProbe) -> tuple[int, Any, bool]:
    message = cc.expect_type(SequencedMessage)
    return message.seq_nr, message.message, message.first


def test_actor_reloads_resends_unconfirmed_and_continues_numbering() -> None:
    """DurableProducerControllerSpec: load initial state and resend unconfirmed, through
    the actor."""
    queue = MemoryDurableQueue(state(5, 2, sent(3), sent(4)))
    pc, producer, cc = start_actor(queue)

    assert take(cc) == (3, "msg-3", True)
    pc.tell(Request(3, 13, True, False))
    assert take(cc) == (4, "msg-4", False)
    request_next = producer.expect_type(RequestNext)
    assert request_next.current_seq_nr == 5
    request_next.send_next_to.tell("msg-5")
    assert take(cc) == (5, "msg-5", False)
    assert queue.state == state(6, 3, sent(4), sent(5))


def test_actor_restarted_on_the_same_queue_delivers_stored_unconfirmed_messages_again() -> None:
    """A controller that stored msg-1..3 stops before any was confirmed; a new one with the
    same producer id on the same queue delivers them to a consumer with their original
    seq_nrs, then msg-4 as seq_nr 4."""
    queue = MemoryDurableQueue()
    first, producer, cc = start_actor(queue)
    producer.expect_type(RequestNext).send_next_to.tell("msg-1")
    cc.expect_type(SequencedMessage)
    first.tell(Request(0, 10, True, False))
    for n in (2, 3):
        producer.expect_type(RequestNext).send_next_to.tell(f"msg-{n}")
        cc.expect_type(SequencedMessage)
    first.stop()
    recorder = Recorder()
    consumer_controller = ConsumerController.start()
    TestConsumer.start(consumer_controller, recorder, name="consumer", end_seq_nr=4)

    second = ProducerController.start(PRODUCER_ID, durable_queue=queue, clock_millis=fixed_clock)
    producer2 = BlockingProbe("producer-2")
    second.tell(ProducerStart(producer2))
    consumer_controller.tell(RegisterToProducerController(second))
    producer2.expect_type(RequestNext).send_next_to.tell("msg-4")

    recorder.wait_collected("consumer", timeout=WAIT)
    assert recorder.deliveries("consumer") == [(f"msg-{n}", n) for n in (1, 2, 3, 4)]
    recorder.assert_no_violations()


def test_actor_retries_a_failing_store_and_goes_on() -> None:
    failures = iter([True, True])
    queue = MemoryDurableQueue(
        fail_when=lambda op, arg: op == "store_message_sent" and next(failures, False)
    )
    pc, producer, cc = start_actor(queue, QUICK_RETRIES)

    producer.expect_type(RequestNext).send_next_to.tell("msg-1")

    assert take(cc) == (1, "msg-1", True)
    assert queue.failures["store_message_sent"] == 2
    assert queue.state == state(2, 0, sent(1))
    assert pc.is_alive()


def test_actor_stops_with_an_error_naming_the_fix_after_the_last_attempt(
    caplog: pytest.LogCaptureFixture,
) -> None:
    queue = CountingQueue(fail_when=lambda op, arg: op == "store_message_sent")
    pc, producer, cc = start_actor(queue, QUICK_RETRIES)

    with caplog.at_level(logging.ERROR, logger="pykka_delivery.durable"):
        producer.expect_type(RequestNext).send_next_to.tell("msg-1")
        assert pc.actor_stopped.wait(WAIT)

    assert queue.calls["store_message_sent"] == 3
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("giving up" in e and "same producer id" in e for e in errors), errors
    with pytest.raises(AssertionError, match="no message"):
        cc.receive(timeout=0.05)  # msg-1 was not stored, so it was not sent
    assert queue.state == DurableProducerState()
    assert queue.closes == 0


def test_actor_start_raises_when_loading_fails_every_attempt() -> None:
    queue = MemoryDurableQueue(fail_when=lambda op, arg: op == "load_state")

    with pytest.raises(DurableQueueError, match="load_state"):
        ProducerController.start(
            PRODUCER_ID, QUICK_RETRIES, durable_queue=queue, clock_millis=fixed_clock
        )

    assert queue.calls["load_state"] == 3


def test_actor_does_not_resend_partially_stored_chunked_messages_after_a_reload() -> None:
    queue = MemoryDurableQueue(
        state(
            5,
            2,
            sent(3, chunk(b"abc", True, True)),
            sent(4, chunk(b"d", True, False)),
            sent(5, chunk(b"e", False, False)),
        )
    )
    pc, producer, cc = start_actor(queue, CHUNKED)

    assert take(cc) == (3, chunk(b"abc", True, True), True)
    pc.tell(Request(3, 13, True, False))
    producer.expect_type(RequestNext).send_next_to.tell("g")

    assert take(cc)[:2] == (4, chunk(b"g", True, True))
    assert [m.seq_nr for m in queue.state.unconfirmed] == [4]


def test_actor_flushes_the_queue_on_stop_and_leaves_closing_it_to_its_owner() -> None:
    queue = CountingQueue()
    pc, _, _ = start_actor(queue)

    pc.stop(timeout=WAIT)

    assert (queue.flushes, queue.closes) == (1, 0)


# --- the Producer handle -----------------------------------------------------------------


@pytest.fixture
def timers() -> Iterator[TimerService]:
    service = TimerService(name="test-durable-producer-timers")
    yield service
    service.shutdown()


def receive_all(consumer: Consumer, count: int) -> list[tuple[Any, int]]:
    got = []
    for _ in range(count):
        delivery = consumer.receive(timeout=WAIT)
        got.append((delivery.message, delivery.seq_nr))
        delivery.confirm()
    return got


def test_producer_reloads_resends_unconfirmed_and_continues_numbering(
    timers: TimerService,
) -> None:
    queue = MemoryDurableQueue(state(5, 2, sent(3), sent(4)))
    producer = Producer(
        PRODUCER_ID, timer_service=timers, durable_queue=queue, clock_millis=fixed_clock
    )
    consumer = Consumer(timer_service=timers)

    producer.register_consumer(consumer.ref)

    assert receive_all(consumer, 2) == [("msg-3", 3), ("msg-4", 4)]
    assert producer.send("msg-5", timeout=WAIT) == 5
    assert receive_all(consumer, 1) == [("msg-5", 5)]
    # Confirming msg-3, the first of the session, sent Request(3, ...) at once: stored.
    assert queue.state == state(6, 3, sent(4), sent(5))


def send_three_unconfirmed(queue: MemoryDurableQueue, timers: TimerService) -> Producer:
    """A producer that sends msg-1..3 to a consumer side that never confirms."""
    producer = Producer(PRODUCER_ID, QUICK_RETRIES, timer_service=timers, durable_queue=queue)
    producer.register_consumer(BlockingProbe("silent consumer"))
    assert producer.send("msg-1", timeout=WAIT) == 1
    producer.ref.tell(Request(0, 10, True, False))
    assert [producer.send(f"msg-{n}", timeout=WAIT) for n in (2, 3)] == [2, 3]
    return producer


def test_producer_restarted_on_the_same_queue_delivers_stored_unconfirmed_messages_again(
    timers: TimerService,
) -> None:
    queue = MemoryDurableQueue()
    send_three_unconfirmed(queue, timers).close()
    consumer = Consumer(timer_service=timers)

    producer = Producer(
        PRODUCER_ID, timer_service=timers, durable_queue=queue, clock_millis=fixed_clock
    )
    producer.register_consumer(consumer.ref)

    assert receive_all(consumer, 3) == [("msg-1", 1), ("msg-2", 2), ("msg-3", 3)]
    assert producer.send("msg-4", timeout=WAIT) == 4
    assert receive_all(consumer, 1) == [("msg-4", 4)]


def test_producer_retries_a_failing_store_and_goes_on(timers: TimerService) -> None:
    failures = iter([True, True])
    queue = MemoryDurableQueue(
        fail_when=lambda op, arg: op == "store_message_sent" and next(failures, False)
    )
    producer = Producer(
        PRODUCER_ID,
        QUICK_RETRIES,
        timer_service=timers,
        durable_queue=queue,
        clock_millis=fixed_clock,
    )
    producer.register_consumer(BlockingProbe("consumer"))

    assert producer.send("msg-1", timeout=WAIT) == 1

    assert queue.failures["store_message_sent"] == 2
    assert queue.state == state(2, 0, sent(1))


def test_producer_raises_and_closes_itself_after_the_last_attempt_and_a_new_one_reloads(
    timers: TimerService,
) -> None:
    queue = MemoryDurableQueue(
        fail_when=lambda op, arg: op == "store_message_sent" and arg.seq_nr == 2  # type: ignore[attr-defined]
    )
    producer = Producer(
        PRODUCER_ID,
        QUICK_RETRIES,
        timer_service=timers,
        durable_queue=queue,
        clock_millis=fixed_clock,
    )
    cc = BlockingProbe("consumer")
    producer.register_consumer(cc)
    producer.send("msg-1", timeout=WAIT)
    producer.ref.tell(Request(0, 10, True, False))

    with pytest.raises(DurableQueueError, match="giving up"):
        producer.send("msg-2", timeout=WAIT)

    with pytest.raises(DurableQueueError, match="is closed: its durable queue failed"):
        producer.send("msg-2", timeout=WAIT)
    assert take(cc) == (1, "msg-1", True)
    with pytest.raises(AssertionError, match="no message"):
        cc.receive(timeout=0.05)  # msg-2 was not stored, so it was not sent
    again = Producer(
        PRODUCER_ID,
        timer_service=timers,
        durable_queue=MemoryDurableQueue(queue.state),
        clock_millis=fixed_clock,
    )
    assert (again.snapshot().unconfirmed, again.snapshot().current_seq_nr) == ((1,), 2)


def test_a_store_failing_on_a_thread_of_the_consumer_side_closes_the_producer(
    timers: TimerService,
) -> None:
    """The consumer's Request opens the window for the rest of a chunked message: its
    chunks are stored by the thread that brings the Request. A failure there must not
    reach that thread; the producer closes and its next call raises."""
    queue = MemoryDurableQueue(
        fail_when=lambda op, arg: op == "store_message_sent" and arg.seq_nr == 2  # type: ignore[attr-defined]
    )
    settings = ProducerControllerSettings(
        chunk_large_messages=1, durable_queue_retry_attempts=2, durable_queue_retry_backoff=0.0
    )
    producer = Producer(
        PRODUCER_ID, settings, timer_service=timers, durable_queue=queue, clock_millis=fixed_clock
    )
    producer.register_consumer(BlockingProbe("consumer"))
    producer.send("abc", timeout=WAIT)

    producer.ref.tell(Request(0, 10, True, False))  # as the consumer side's thread would

    with pytest.raises(DurableQueueError, match="is closed"):
        producer.send("next", timeout=WAIT)
    assert [m.seq_nr for m in queue.state.unconfirmed] == [1]


def test_producer_loading_failing_every_attempt_raises(timers: TimerService) -> None:
    queue = MemoryDurableQueue(fail_when=lambda op, arg: op == "load_state")

    with pytest.raises(DurableQueueError, match="load_state"):
        Producer(
            PRODUCER_ID,
            QUICK_RETRIES,
            timer_service=timers,
            durable_queue=queue,
            clock_millis=fixed_clock,
        )


def test_send_many_stores_what_the_window_allows_with_one_store_call(
    timers: TimerService,
) -> None:
    queue = MemoryDurableQueue()
    producer = Producer(
        PRODUCER_ID, timer_service=timers, durable_queue=queue, clock_millis=fixed_clock
    )
    cc = BlockingProbe("consumer")
    producer.register_consumer(cc)
    assert producer.send_many(["msg-1"], timeout=WAIT) == [1]
    producer.ref.tell(Request(1, 11, True, False))

    seq_nrs = producer.send_many([f"msg-{n}" for n in range(2, 12)], timeout=WAIT)

    assert seq_nrs == list(range(2, 12))
    assert queue.calls["store_messages_sent"] == 2
    assert queue.calls["store_message_sent"] == 0
    assert queue.state == state(12, 1, *(sent(n) for n in range(2, 12)))
    assert [take(cc)[:2] for _ in range(11)] == [(n, f"msg-{n}") for n in range(1, 12)]


def test_send_many_timing_out_says_how_many_were_sent(timers: TimerService) -> None:
    queue = MemoryDurableQueue()
    producer = Producer(
        PRODUCER_ID,
        ProducerControllerSettings(durable_store_ahead=0),
        timer_service=timers,
        durable_queue=queue,
        clock_millis=fixed_clock,
    )
    producer.register_consumer(BlockingProbe("consumer"))
    producer.send("msg-1", timeout=WAIT)
    producer.ref.tell(Request(1, 3, True, False))

    with pytest.raises(DeliveryTimeout, match="first 2 of 4 messages were sent"):
        producer.send_many(["msg-2", "msg-3", "msg-4", "msg-5"], timeout=0.05)

    assert [m.message for m in queue.state.unconfirmed] == ["msg-2", "msg-3"]


def test_send_many_returns_once_all_are_stored_and_sends_the_rest_as_demand_comes(
    timers: TimerService,
) -> None:
    """With ``durable_store_ahead`` (default), a call beyond the demand returns once every
    message is stored: they are in the stream, sent when the consumer asks for them."""
    queue = MemoryDurableQueue()
    producer = Producer(
        PRODUCER_ID, timer_service=timers, durable_queue=queue, clock_millis=fixed_clock
    )
    cc = BlockingProbe("consumer")
    producer.register_consumer(cc)
    producer.send("msg-1", timeout=WAIT)
    producer.ref.tell(Request(1, 3, True, False))

    assert producer.send_many(["msg-2", "msg-3", "msg-4", "msg-5"], timeout=WAIT) == [2, 3, 4, 5]

    assert [m.message for m in queue.state.unconfirmed] == ["msg-2", "msg-3", "msg-4", "msg-5"]
    assert queue.calls["store_messages_sent"] == 1
    assert [take(cc)[:2] for _ in range(3)] == [(1, "msg-1"), (2, "msg-2"), (3, "msg-3")]
    producer.ref.tell(Request(3, 6, True, False))
    assert [take(cc)[:2] for _ in range(2)] == [(4, "msg-4"), (5, "msg-5")]
    producer.ref.tell(Ack(5))
    producer.wait_confirmed(timeout=WAIT)


def test_send_many_delivers_every_message_in_order_to_a_consumer(timers: TimerService) -> None:
    queue = MemoryDurableQueue()
    producer = Producer(
        PRODUCER_ID, timer_service=timers, durable_queue=queue, clock_millis=fixed_clock
    )
    consumer = Consumer(ConsumerControllerSettings(flow_control_window=20), timer_service=timers)
    producer.register_consumer(consumer.ref)
    got: list[tuple[Any, int]] = []
    reader = threading.Thread(target=lambda: got.extend(receive_all(consumer, 200)), daemon=True)
    reader.start()

    seq_nrs = producer.send_many([f"m{n}" for n in range(1, 201)], timeout=WAIT)

    reader.join(WAIT)
    assert seq_nrs == list(range(1, 201))
    assert got == [(f"m{n}", n) for n in range(1, 201)]
    assert queue.calls["store_messages_sent"] < 200  # windows, not messages


def test_send_and_confirm_with_a_durable_queue_returns_once_stored(timers: TimerService) -> None:
    """As Akka: with a durable queue the confirmation reply means "stored"."""
    queue = MemoryDurableQueue()
    producer = Producer(
        PRODUCER_ID, timer_service=timers, durable_queue=queue, clock_millis=fixed_clock
    )
    producer.register_consumer(BlockingProbe("consumer that never confirms"))

    assert producer.send_and_confirm("msg-1", timeout=WAIT) == 1

    assert queue.state == state(2, 0, sent(1, ack=True))


def test_producer_close_flushes_the_queue_and_leaves_closing_it_to_its_owner(
    timers: TimerService,
) -> None:
    queue = CountingQueue()
    producer = Producer(
        PRODUCER_ID, timer_service=timers, durable_queue=queue, clock_millis=fixed_clock
    )

    producer.close()

    assert (queue.flushes, queue.closes) == (1, 0)
    with pytest.raises(ClosedError):
        producer.send("late", timeout=WAIT)


# --- the AsyncProducer -------------------------------------------------------------------


async def test_async_producer_reloads_resends_and_sends_a_window_with_one_store(
    timers: TimerService,
) -> None:
    queue = MemoryDurableQueue(state(5, 2, sent(3), sent(4)))
    producer = AsyncProducer(
        PRODUCER_ID, timer_service=timers, durable_queue=queue, clock_millis=fixed_clock
    )
    cc = Probe("consumer")

    producer.register_consumer(cc)
    cc.expect(seq(3, producer.ref, first=True))
    producer.ref.tell(Request(3, 13, True, False))
    cc.expect(seq(4, producer.ref))
    async with asyncio.timeout(WAIT):
        seq_nrs = await producer.send_many(["msg-5", "msg-6", "msg-7"])

    assert seq_nrs == [5, 6, 7]
    assert [cc.receive().seq_nr for _ in range(3)] == [5, 6, 7]
    assert queue.calls["store_messages_sent"] == 1
    assert queue.state == state(8, 3, sent(4), sent(5), sent(6), sent(7))


async def test_async_producer_raises_and_closes_itself_after_the_last_attempt(
    timers: TimerService,
) -> None:
    queue = CountingQueue(fail_when=lambda op, arg: op == "store_message_sent")
    producer = AsyncProducer(PRODUCER_ID, QUICK_RETRIES, timer_service=timers, durable_queue=queue)
    producer.register_consumer(Probe("consumer"))

    async with asyncio.timeout(WAIT):
        with pytest.raises(DurableQueueError, match="giving up"):
            await producer.send("msg-1")
        with pytest.raises(DurableQueueError, match="is closed"):
            await producer.send("msg-1")
    producer.close()
    assert queue.calls["store_message_sent"] == 3
    assert queue.flushes == 0  # failed: nothing trustworthy to flush


class FlushFails(MemoryDurableQueue):
    """A memory queue whose `flush` always fails (buffered confirmations could not be
    written)."""

    def flush(self) -> None:
        raise DurableQueueError("disk full")


def test_a_queue_that_cannot_flush_on_close_is_logged_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = ProducerControllerSettings(durable_queue_retry_attempts=2)
    producer = Producer("p-1", settings, durable_queue=FlushFails())
    with caplog.at_level(logging.ERROR, "pykka_delivery"):
        producer.close()  # does not raise
    assert "flush on durable queue" in caplog.text
    assert "disk full" in caplog.text
    assert "sent again on restart" in caplog.text
