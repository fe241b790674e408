"""Fencing epochs on the client side: a `CoordinatedConsumer` keeps the epoch of its
activation, answers a step-down naming its epoch, and stops without answering when a
newer activation fenced it out; over a real service the epochs travel on the wire."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any, cast

import pytest

from pykka_delivery.coordinator import (
    CoordinatedConsumer,
    CoordinatorClient,
    SendConsumerUpdate,
)
from pykka_delivery.coordinator._activation import ConfirmTo
from pykka_delivery.delivery.handles.consumer import Consumer
from pykka_delivery.delivery.handles.producer import Producer
from pykka_delivery.delivery.messages import Delivery
from pykka_delivery.delivery.stores.dedup import MemoryDedupStore
from pykka_delivery.errors import ConsumerFenced, DeliveryTimeout
from tests.coordinator.servers import Clients, served
from tests.coordinator.test_service import GROUP, GROUP_FIELDS, _FakeClient, _NoProducer
from tests.harness import wait_until

SHORT = 0.05  # a receive that must find nothing (bounded, not a synchronisation)
WAIT = 10.0


def active(epoch: int) -> SendConsumerUpdate:
    return SendConsumerUpdate("fake", 1, GROUP, active=True, epoch=epoch)


def step_down(epoch: int) -> SendConsumerUpdate:
    return SendConsumerUpdate("fake", 1, GROUP, active=False, epoch=epoch)


@pytest.fixture
def fake() -> Iterator[tuple[_FakeClient, CoordinatedConsumer]]:
    client = _FakeClient()
    consumer = CoordinatedConsumer(
        cast(CoordinatorClient, client), *GROUP_FIELDS, _NoProducer(), subscription_id=1
    )
    yield client, consumer
    consumer.close(unregister=False)


def start_consuming(consumer: CoordinatedConsumer) -> None:
    """Let ``consumer`` open its `Consumer` (nothing arrives from the fake producer)."""
    with pytest.raises(DeliveryTimeout):
        consumer.receive(timeout=SHORT)
    assert consumer.is_consuming


def test_the_epoch_of_an_activation_is_kept_and_recorded_in_its_interval(
    fake: tuple[_FakeClient, CoordinatedConsumer],
) -> None:
    client, consumer = fake
    assert consumer.epoch == 0
    assert client.on_update is not None

    client.on_update(active(7))
    assert consumer.epoch == 7
    start_consuming(consumer)

    assert consumer.epoch == 7
    assert [i.epoch for i in consumer.intervals()] == [7]


def test_the_answer_to_a_step_down_names_the_epoch_it_ends(
    fake: tuple[_FakeClient, CoordinatedConsumer],
) -> None:
    client, consumer = fake
    assert client.on_update is not None
    client.on_update(active(4))
    start_consuming(consumer)

    client.on_update(step_down(4))

    assert client.answered_epochs == [4]
    assert consumer.epoch == 0


def test_the_answer_to_a_step_down_while_not_consuming_names_its_epoch(
    fake: tuple[_FakeClient, CoordinatedConsumer],
) -> None:
    client, _ = fake
    assert client.on_update is not None

    client.on_update(step_down(3))

    assert client.answered_epochs == [3]


def test_a_step_down_answered_after_the_delivery_in_flight_names_its_epoch() -> None:
    producer = Producer("orders")
    client = _FakeClient()
    consumer = CoordinatedConsumer(
        cast(CoordinatorClient, client), *GROUP_FIELDS, producer.ref, subscription_id=1
    )
    try:
        assert client.on_update is not None
        client.on_update(active(5))
        sender = threading.Thread(target=producer.send, args=("m",), kwargs={"timeout": WAIT})
        sender.start()  # it waits for the consumer's demand
        held = consumer.receive(timeout=WAIT)
        sender.join(WAIT)

        client.on_update(step_down(5))
        assert client.answers == []  # owed until the delivery in flight is confirmed
        held.confirm()

        assert client.answered_epochs == [5]
    finally:
        consumer.close(unregister=False)
        producer.close()


def test_a_fenced_activation_stops_without_answering_and_receive_waits_for_the_next(
    fake: tuple[_FakeClient, CoordinatedConsumer],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    client, consumer = fake
    assert client.on_update is not None
    client.on_update(active(1))
    real_receive = Consumer.receive

    def fenced(self: Consumer, timeout: float | None = None) -> Any:
        raise ConsumerFenced("a newer activation registered", epoch=1, newer_epoch=2)

    monkeypatch.setattr(Consumer, "receive", fenced)
    # Not ConsumerFenced: it waits for its next turn.
    with (
        caplog.at_level(logging.WARNING, "pykka_delivery.coordinator.consumer"),
        pytest.raises(DeliveryTimeout),
    ):
        consumer.receive(timeout=SHORT)

    assert not consumer.is_consuming
    assert consumer.epoch == 0
    assert [(i.epoch, i.end is not None) for i in consumer.intervals()] == [(1, True)]
    assert client.answers == []
    assert any("fenced" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
    monkeypatch.setattr(Consumer, "receive", real_receive)
    client.on_update(active(3))
    start_consuming(consumer)
    assert [i.epoch for i in consumer.intervals()] == [1, 3]


def test_a_confirmation_refused_as_fenced_stops_the_activation_without_raising(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    producer = Producer("orders")
    client = _FakeClient()
    consumer = CoordinatedConsumer(
        cast(CoordinatorClient, client), *GROUP_FIELDS, producer.ref, subscription_id=1
    )
    try:
        assert client.on_update is not None
        client.on_update(active(2))
        sender = threading.Thread(target=producer.send, args=("m",), kwargs={"timeout": WAIT})
        sender.start()
        held = consumer.receive(timeout=WAIT)
        sender.join(WAIT)
        confirm = Delivery.confirm

        def refused_inside(self: Delivery) -> None:
            if isinstance(self.confirm_to, ConfirmTo):  # the application's copy
                confirm(self)
            else:  # the Consumer's own delivery: its store refused the position
                raise ConsumerFenced("a newer activation wrote", epoch=2, newer_epoch=3)

        monkeypatch.setattr(Delivery, "confirm", refused_inside)
        held.confirm()  # does not raise

        assert (consumer.is_consuming, consumer.confirmed, client.answers) == (False, 0, [])
        assert [(i.epoch, i.end is not None) for i in consumer.intervals()] == [(2, True)]
    finally:
        consumer.close(unregister=False)
        producer.close()


def test_an_activation_whose_store_holds_a_newer_epoch_never_starts_and_waits_for_the_next(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = _FakeClient()
    consumer = CoordinatedConsumer(
        cast(CoordinatorClient, client),
        *GROUP_FIELDS,
        _NoProducer(),
        subscription_id=1,
        dedup_store=lambda: MemoryDedupStore(epoch=9),  # a later activation wrote here
    )
    try:
        assert client.on_update is not None
        client.on_update(active(3))

        with (
            caplog.at_level(logging.WARNING, "pykka_delivery.coordinator.consumer"),
            pytest.raises(DeliveryTimeout),  # not ConsumerFenced: it waits for its turn
        ):
            consumer.receive(timeout=SHORT)

        assert consumer.intervals() == ()
        assert (consumer.is_consuming, consumer.epoch, client.answers) == (False, 0, [])
        assert any("fenced" in r.getMessage() for r in caplog.records)
    finally:
        consumer.close(unregister=False)


def test_epochs_travel_from_the_coordinator_to_the_consumer_and_its_listing() -> None:
    with served(disconnected_timeout=30.0) as server:
        clients = Clients(server)
        try:
            first = CoordinatedConsumer(clients(), *GROUP_FIELDS, _NoProducer(), timeout=WAIT)
            second_client = clients()
            second = CoordinatedConsumer(second_client, *GROUP_FIELDS, _NoProducer(), timeout=WAIT)
            assert (first.registered.epoch, second.registered.epoch) == (1, 0)
            start_consuming(first)
            first.close(timeout=WAIT)  # the group hands over to the second: epoch 2

            wait_until(lambda: second.epoch > 0, "the second made active")
            start_consuming(second)
            [info] = second_client.list_groups(timeout=WAIT)

            assert [i.epoch for i in first.intervals()] == [1]
            assert [i.epoch for i in second.intervals()] == [2]
            assert [c.epoch for c in info.consumers] == [2]
            second.close(timeout=WAIT)
        finally:
            clients.close_all()
