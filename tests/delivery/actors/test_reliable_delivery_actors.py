"""ReliableDeliverySpec, end to end on real pykka actors.

Real `ProducerController` and `ConsumerController` actors, wired as in Akka, with the test
actors of tests/actor_kit.py (`TestProducer`, `TestProducerWithAsk`, `TestConsumer`)
playing producer and consumer. Window 20. Every test also runs chunked
(ReliableDeliveryChunkedSpec, ``chunk_large_messages=1``: ``msg-n`` travels as one chunk
per character, and a `Delivery`'s seq_nr is its last chunk's).

Original test (ReliableDeliverySpec, reference section 7.5) -> test here:

1. illustrate point-to-point usage
   -> test_point_to_point_delivers_every_message_once_in_order
2. illustrate point-to-point usage with ask
   -> test_producer_asking_for_confirmation_is_told_each_confirmed_seq_nr
3. work with slow producer and fast consumer
   -> test_every_message_is_delivered_once_in_order_at_any_speed[slow-producer-fast-consumer]
4. work with fast producer and slow consumer
   -> test_every_message_is_delivered_once_in_order_at_any_speed[fast-producer-slow-consumer]
5. work with fast producer and fast consumer
   -> test_every_message_is_delivered_once_in_order_at_any_speed[fast-producer-fast-consumer]
6. allow replacement of destination
   -> test_new_consumer_controller_continues_the_sequence_after_the_stopped_one
7. allow replacement of producer
   -> test_new_producer_controller_with_the_same_producer_id_starts_again_at_seq_nr_1

Where we differ from the original: in test 6 the second consumer goes on to seq_nr 84
(the original's ends at its first delivery, which is already past 42), so the new
session's flow control is exercised too; delays are 1-3 ms instead of 10-30 ms (the scenario,
not the delay, matters) and bounded waits are 10 s instead of 5 s; the original only waits
for ``Collected``, we also check every processed message and its seq_nr.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pykka_delivery.delivery.actors.consumer_controller import ConsumerController
from pykka_delivery.delivery.actors.producer_controller import ProducerController
from pykka_delivery.delivery.core.settings import (
    ConsumerControllerSettings,
    ProducerControllerSettings,
)
from pykka_delivery.delivery.messages import Delivery, RegisterToProducerController, RequestNext
from pykka_delivery.protocol.messages import RegisterConsumer, SequencedMessage
from tests.actor_kit import (
    BlockingProbe,
    Recorder,
    TapRef,
    TestConsumer,
    TestProducer,
    TestProducerWithAsk,
    last_chunk_seq_nrs,
    messages_until,
)

CHUNKING = pytest.mark.parametrize("chunk", [0, 1], ids=["plain", "chunked"])
WINDOW = 20
END_SEQ_NR = 42
SECOND_END_SEQ_NR = 2 * END_SEQ_NR  # where the second consumer of test 6 ends
CONSUMER_DELAY = 0.001  # the original's defaultConsumerDelay is 10 ms
PRODUCER_DELAY = 0.002  # the original's defaultProducerDelay is 20 ms


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    recorder = Recorder()
    yield recorder
    recorder.assert_no_violations()


def consumer_settings(resend_interval_min: float = 2.0) -> ConsumerControllerSettings:
    return ConsumerControllerSettings(
        flow_control_window=WINDOW, resend_interval_min=resend_interval_min
    )


def producer_settings(chunk: int) -> ProducerControllerSettings:
    return ProducerControllerSettings(chunk_large_messages=chunk)


def start_pair(
    recorder: Recorder,
    chunk: int,
    *,
    producer_delay: float = PRODUCER_DELAY,
    consumer_delay: float = CONSUMER_DELAY,
    with_ask: bool = False,
) -> None:
    """Pekko's wiring: a consumer controller with a `TestConsumer` ending at seq_nr 42, a
    producer controller with a test producer, then ``RegisterToProducerController``."""
    cc = ConsumerController.start(consumer_settings())
    TestConsumer.start(cc, recorder, name="consumer", end_seq_nr=END_SEQ_NR, delay=consumer_delay)
    pc = ProducerController.start("p-1", producer_settings(chunk))
    producer = TestProducerWithAsk if with_ask else TestProducer
    producer.start(pc, recorder, name="producer", delay=producer_delay)
    cc.tell(RegisterToProducerController(pc))


@CHUNKING
def test_point_to_point_delivers_every_message_once_in_order(
    chunk: int, recorder: Recorder
) -> None:
    expected = messages_until(END_SEQ_NR, chunk)

    start_pair(recorder, chunk)
    collected = recorder.wait_collected("consumer")

    assert recorder.deliveries("consumer") == expected
    assert collected.message_count == len(expected)
    assert collected.producer_ids == {"p-1"}


@CHUNKING
def test_producer_asking_for_confirmation_is_told_each_confirmed_seq_nr(
    chunk: int, recorder: Recorder
) -> None:
    # Unchunked the replies are 1..42; chunked, each reply is the seq_nr of the message's
    # last chunk (msg-1 is chunks 1-5, so its reply is 5).
    expected = messages_until(END_SEQ_NR, chunk)

    start_pair(recorder, chunk, with_ask=True)
    collected = recorder.wait_collected("consumer")
    replies = recorder.wait_replies("producer", collected.message_count)

    assert replies == [seq_nr for _, seq_nr in expected]
    if not chunk:
        assert replies == list(range(1, END_SEQ_NR + 1))


@CHUNKING
@pytest.mark.parametrize(
    ("producer_delay", "consumer_delay"),
    [(0.003, 0.0), (0.0, 0.003), (0.0, 0.0)],
    ids=[
        "slow-producer-fast-consumer",
        "fast-producer-slow-consumer",
        "fast-producer-fast-consumer",
    ],
)
def test_every_message_is_delivered_once_in_order_at_any_speed(
    chunk: int, producer_delay: float, consumer_delay: float, recorder: Recorder
) -> None:
    start_pair(recorder, chunk, producer_delay=producer_delay, consumer_delay=consumer_delay)
    recorder.wait_collected("consumer")

    assert recorder.deliveries("consumer") == messages_until(END_SEQ_NR, chunk)


@CHUNKING
def test_new_consumer_controller_continues_the_sequence_after_the_stopped_one(
    chunk: int, recorder: Recorder
) -> None:
    # A low retry interval: the stopped consumer may be noticed on the retry tick.
    cc1 = ConsumerController.start(consumer_settings(resend_interval_min=0.05))
    TestConsumer.start(
        cc1, recorder, name="consumer-1", end_seq_nr=END_SEQ_NR, delay=CONSUMER_DELAY
    )
    pc = ProducerController.start("p-1", producer_settings(chunk))
    TestProducer.start(pc, recorder, name="producer", delay=PRODUCER_DELAY)
    cc1.tell(RegisterToProducerController(pc))
    recorder.wait_collected("consumer-1")
    assert cc1.actor_stopped.wait(10), "consumer controller 1 did not stop after its consumer"
    processed_1 = recorder.deliveries("consumer-1")

    cc2 = ConsumerController.start(
        consumer_settings(),
        self_ref_factory=lambda ref: TapRef(ref, types=(SequencedMessage,)),
    )
    tap: TapRef = cc2.proxy().self_ref.get()
    TestConsumer.start(
        cc2, recorder, name="consumer-2", end_seq_nr=SECOND_END_SEQ_NR, delay=CONSUMER_DELAY
    )
    cc2.tell(RegisterToProducerController(pc))
    recorder.wait_collected("consumer-2")

    # The producer controller goes on from its first unconfirmed message, marked first,
    # and nothing is lost. That is right after consumer 1's last message, since its
    # controller acknowledges what was confirmed when it stops (Akka's redelivers from its
    # last Request) -- except when a retry tick notices the stopped consumer before its
    # last Confirmed is processed: then that message comes again.
    plan = messages_until(SECOND_END_SEQ_NR, chunk)
    assert processed_1 == plan[: len(processed_1)]
    processed_2 = recorder.deliveries("consumer-2")
    assert processed_2[0] in plan, f"consumer 2 started with {processed_2[0]}, never sent"
    resumed_at = plan.index(processed_2[0])
    assert 0 < resumed_at <= len(processed_1), (processed_1[-1], processed_2[0])
    assert processed_2 == plan[resumed_at:]
    first = tap.seen[0]
    assert (first.seq_nr, first.first) == (plan[resumed_at - 1][1] + 1, True), first


def send_and_confirm(
    producer: BlockingProbe, consumer: BlockingProbe, payloads: tuple[str, ...]
) -> list[tuple[str, str, int]]:
    """Play producer and consumer by hand: send each payload on its `RequestNext`, confirm
    its `Delivery`; returns ``(message, producer_id, seq_nr)`` of each delivery."""
    got = []
    for payload in payloads:
        producer.expect_type(RequestNext).send_next_to.tell(payload)
        delivery = consumer.expect_type(Delivery)
        got.append((delivery.message, delivery.producer_id, delivery.seq_nr))
        delivery.confirm()
    return got


@CHUNKING
def test_new_producer_controller_with_the_same_producer_id_starts_again_at_seq_nr_1(
    chunk: int,
) -> None:
    consumer = BlockingProbe("consumer")
    cc = ConsumerController.start(consumer_settings())
    cc.tell(ConsumerController.Start(consumer))
    pc1 = ProducerController.start("p-1", producer_settings(chunk))
    producer1 = BlockingProbe("producer-1")
    pc1.tell(ProducerController.Start(producer1))
    pc1.tell(RegisterConsumer(cc))
    # One seq_nr per message; chunked, one per character of "msg-n": 1, 2 or 5, 10.
    first, second = last_chunk_seq_nrs(["msg-1", "msg-2"], chunk)
    first_session = send_and_confirm(producer1, consumer, ("msg-1", "msg-2"))
    assert first_session == [("msg-1", "p-1", first), ("msg-2", "p-1", second)]

    pc1.stop(block=True, timeout=10)
    pc2 = ProducerController.start("p-1", producer_settings(chunk))
    producer2 = BlockingProbe("producer-2")
    pc2.tell(ProducerController.Start(producer2))
    pc2.tell(RegisterConsumer(cc))
    second_session = send_and_confirm(producer2, consumer, ("msg-3", "msg-4"))

    # Numbered from 1 again: a new session with the new controller.
    assert second_session == [("msg-3", "p-1", first), ("msg-4", "p-1", second)]
