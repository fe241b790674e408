"""The stuck-message check of a producer controller (seed 002's stuck-message sweeper).

Messages sent more than ``stuck_after`` seconds ago and still unconfirmed are counted at
each check (every ``stuck_after / 4``): a warning when some become stuck, the ``stuck``
gauge and ``stuck_reports`` counter in the statistics. Nothing is recorded per message.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest

from pykka_delivery import Consumer, Producer
from pykka_delivery.delivery.core.producer import STUCK_CHECK, ProducerCore
from pykka_delivery.delivery.core.settings import (
    ConsumerControllerSettings,
    ProducerControllerSettings,
)
from pykka_delivery.delivery.messages import ProducerStart
from pykka_delivery.delivery.timers import TimerService
from pykka_delivery.protocol.messages import RegisterConsumer, Request
from tests.harness import Driver, FakeClock, Probe, producer_driver

SETTINGS = ProducerControllerSettings(stuck_after=4.0)


def start(settings: ProducerControllerSettings = SETTINGS) -> tuple[Driver, FakeClock, Probe]:
    clock = FakeClock()
    driver, _, producer = producer_driver(
        clock, settings=settings, clock_millis=lambda: int(clock.now * 1000)
    )
    consumer = Probe("consumer")
    driver.feed(ProducerStart(producer))
    driver.feed(RegisterConsumer(consumer))
    driver.feed(Request(0, 100, True, False))
    return driver, clock, producer


def send(driver: Driver, *messages: str) -> None:
    core = driver.core
    assert isinstance(core, ProducerCore)
    for message in messages:
        driver.apply(core.on_msg(message))


def stats(driver: Driver) -> tuple[int, int]:
    core = driver.core
    assert isinstance(core, ProducerCore)
    s = core.statistics()
    return s.stuck, s.stuck_reports


def test_unconfirmed_messages_older_than_stuck_after_are_reported_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    driver, clock, _ = start()
    send(driver, "a", "b", "c")

    clock.advance(3.0)
    assert stats(driver) == (0, 0), "not yet stuck_after old"
    with caplog.at_level(logging.WARNING, "pykka_delivery.producer"):
        clock.advance(2.0)
    assert stats(driver) == (3, 1)
    assert "3 messages sent more than 4.0 s ago are not confirmed" in caplog.text
    assert "the oldest is seq_nr 1" in caplog.text

    caplog.clear()
    with caplog.at_level(logging.WARNING, "pykka_delivery.producer"):
        clock.advance(3.0)
    assert stats(driver) == (3, 1), "still stuck: reported once"
    assert caplog.text == ""

    driver.feed(Request(3, 100, True, False))
    clock.advance(1.0)
    assert stats(driver) == (0, 1)


def test_only_messages_sent_before_the_limit_count() -> None:
    driver, clock, _ = start()
    send(driver, "old-1", "old-2")
    clock.advance(3.0)
    send(driver, "new-1", "new-2", "new-3")

    clock.advance(2.0)  # t = 5: only the first two are 4 s old
    assert stats(driver) == (2, 1)
    driver.feed(Request(1, 100, True, False))
    clock.advance(1.0)
    assert stats(driver)[0] == 1
    clock.advance(2.0)  # t = 8: the new ones are old too
    assert stats(driver)[0] == 4


def test_a_producer_that_sends_nothing_is_never_stuck() -> None:
    driver, clock, _ = start()
    clock.advance(60.0)
    assert stats(driver) == (0, 0)


def test_stuck_after_zero_turns_the_check_off() -> None:
    clock = FakeClock()
    driver, _, producer = producer_driver(
        clock,
        settings=ProducerControllerSettings(stuck_after=0),
        clock_millis=lambda: int(clock.now * 1000),
    )
    driver.feed(ProducerStart(producer))
    effects = driver.feed(RegisterConsumer(Probe("consumer")))
    assert all(getattr(e, "key", None) != STUCK_CHECK for e in effects)


def test_stuck_after_is_checked() -> None:
    with pytest.raises(ValueError, match="stuck_after must be from 0"):
        ProducerControllerSettings(stuck_after=-1)


@pytest.fixture
def timers() -> Iterator[TimerService]:
    service = TimerService(name="test-stuck-timers")
    yield service
    service.shutdown()


def test_a_producer_handle_reports_what_a_silent_consumer_leaves_unconfirmed(
    timers: TimerService,
) -> None:
    producer = Producer("p-1", ProducerControllerSettings(stuck_after=0.2), timer_service=timers)
    consumer = Consumer(ConsumerControllerSettings(flow_control_window=10), timer_service=timers)
    consumer.register_to(producer.ref)
    producer.send("m", timeout=5)
    consumer.receive(timeout=5)  # received, never confirmed

    deadline = time.monotonic() + 10
    while producer.statistics().stuck == 0:
        assert time.monotonic() < deadline, "never reported stuck"
        time.sleep(0.02)
    assert producer.statistics().stuck_reports == 1
    consumer.close()
    producer.close()
