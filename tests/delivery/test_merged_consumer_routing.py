"""The routing rule `FanInConsumer` and `MergedConsumer` share (handles/_routing.py): a
batch is split per producer id, order kept, and a producer's `Fenced` reaches that
producer's consumer."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from pykka_delivery.delivery import FanInConsumer, FanInSettings
from pykka_delivery.delivery.core.settings import ConsumerControllerSettings
from pykka_delivery.delivery.handles._routing import split_by_producer
from pykka_delivery.delivery.handles.consumer import Consumer
from pykka_delivery.delivery.handles.producer import Producer
from pykka_delivery.delivery.messages import Delivery
from pykka_delivery.delivery.timers import TimerService
from pykka_delivery.protocol.messages import Fenced, PeerLinkChanged, SequencedMessage
from tests.harness import Probe, wait_until

WAIT = 10.0
CONSUMER = ConsumerControllerSettings(resend_interval_min=0.05, resend_interval_max=0.2)


@pytest.fixture
def timers() -> Iterator[TimerService]:
    service = TimerService(name="test-routing-timers")
    yield service
    service.shutdown()


def sequenced(producer_id: str, seq_nr: int) -> SequencedMessage:
    return SequencedMessage(producer_id, seq_nr, seq_nr, seq_nr == 1, False, Probe())


def test_a_batch_is_split_per_producer_in_order_with_links_apart() -> None:
    link = PeerLinkChanged("127.0.0.1:1", up=False)
    batch = [sequenced("a", 1), sequenced("b", 1), link, sequenced("a", 2), Fenced(3, "b")]

    batches, links = split_by_producer(batch, "owner")

    assert {p: [type(m).__name__ for m in ms] for p, ms in batches.items()} == {
        "a": ["SequencedMessage", "SequencedMessage"],
        "b": ["SequencedMessage", "Fenced"],
    }
    assert [m.seq_nr for m in batches["a"]] == [1, 2]
    assert links == [link]


def test_a_fenced_alone_of_an_unknown_producer_opens_no_consumer_in_a_fan_in(
    timers: TimerService,
) -> None:
    with FanInConsumer(lambda d: None, timer_service=timers) as fan_in:
        fan_in.ref.tell(Fenced(2, "nobody"))

        assert fan_in.statistics().live_producers == 0


def test_a_fan_in_consumer_learns_from_its_producer_that_it_was_fenced(
    timers: TimerService, caplog: pytest.LogCaptureFixture
) -> None:
    handled: list[Delivery] = []
    producer = Producer("a", timer_service=timers)
    fan_in = FanInConsumer(
        handled.append, FanInSettings(consumer=CONSUMER), timer_service=timers, epoch=1
    )
    newer = Consumer(CONSUMER, timer_service=timers, epoch=2)
    try:
        producer.register_consumer(fan_in.ref)
        producer.send("m", timeout=WAIT)
        wait_until(lambda: handled, "the first message handled", timeout=WAIT)

        with caplog.at_level(logging.ERROR, "pykka_delivery.consumer"):
            newer.register_to(producer.ref)
            wait_until(
                lambda: "stopped" in caplog.text and "shut out" in caplog.text,
                "the fan-in's consumer of 'a' stopped, fenced",
                timeout=WAIT,
            )
    finally:
        newer.close()
        fan_in.close()
        producer.close()
