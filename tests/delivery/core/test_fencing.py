"""Fencing epochs in the pure cores (issue 21): the producer core serves only the highest
epoch registered and tells the ones it shuts out `Fenced`; a consumer core sends its epoch
with everything it sends and stops on a `Fenced` of a newer epoch.

The producer core is driven as in test_producer_core.py: probes play the consumer
controllers (each registered with its own epoch) and the producer; the consumer core as in
test_consumer_core.py. Timers run on a `FakeClock`.
"""

from __future__ import annotations

from typing import Any

import pytest

from pykka_delivery.delivery.core.consumer import RETRY, ConsumerCore, ConsumerPhase
from pykka_delivery.delivery.core.effects import Send, Stop
from pykka_delivery.delivery.core.producer import ProducerCore
from pykka_delivery.delivery.core.settings import ConsumerControllerSettings
from pykka_delivery.delivery.messages import (
    CONFIRMED,
    ConsumerStart,
    ProducerStart,
    RegisterToProducerController,
    RequestNext,
)
from pykka_delivery.errors import ConsumerFenced
from pykka_delivery.protocol.messages import (
    Ack,
    Fenced,
    RegisterConsumer,
    Request,
    SequencedMessage,
)
from tests.harness import Driver, FakeClock, Probe, SelfRef, consumer_driver, producer_driver

PRODUCER_ID = "p-1"


def seq(n: int, pc: Any, first: bool = False) -> SequencedMessage:
    return SequencedMessage(PRODUCER_ID, n, f"msg-{n}", first, False, pc)


class ProducerRig:
    """A producer core with a producer probe, its stream sent up to msg-3 to ``old`` (a
    consumer controller probe of epoch 1), which confirmed msg-1 and opened the window."""

    def __init__(self, old_epoch: int = 1) -> None:
        self.clock = FakeClock()
        self.driver, self.pc, self.producer = producer_driver(self.clock, PRODUCER_ID)
        self.old = Probe("cc-epoch-old")
        self.driver.feed(ProducerStart(self.producer))
        self.driver.feed(RegisterConsumer(self.old, old_epoch))
        self.send_next("msg-1")
        self.driver.feed(Request(1, 10, True, False, old_epoch))
        self.send_next("msg-2")
        self.send_next("msg-3")
        self.old.drain()

    @property
    def core(self) -> ProducerCore:
        core = self.driver.core
        assert isinstance(core, ProducerCore)
        return core

    def send_next(self, message: str) -> None:
        self.producer.expect_type(RequestNext).send_next_to.tell(message)

    def feed(self, message: object) -> list[Any]:
        return self.driver.feed(message)


# --- the producer core ------------------------------------------------------------------


def test_a_lower_epoch_registration_is_refused_and_answered_fenced() -> None:
    rig = ProducerRig(old_epoch=2)
    stale = Probe("cc-epoch-1")

    rig.feed(RegisterConsumer(stale, 1))

    assert stale.drain() == [Fenced(2, PRODUCER_ID)]
    assert rig.core.consumer is rig.old
    assert rig.core.snapshot().epoch == 2


def test_the_current_consumer_keeps_the_stream_after_a_lower_epoch_registered() -> None:
    rig = ProducerRig(old_epoch=2)
    rig.feed(RegisterConsumer(Probe("cc-epoch-1"), 1))

    rig.send_next("msg-4")

    assert rig.old.drain() == [seq(4, rig.pc)]
    assert rig.core.snapshot().first_seq_nr == 1  # no new session began


def test_a_higher_epoch_takes_over_with_a_resend_from_the_first_unconfirmed() -> None:
    rig = ProducerRig(old_epoch=1)
    new = Probe("cc-epoch-2")

    rig.feed(RegisterConsumer(new, 2))

    assert new.drain() == [seq(2, rig.pc, first=True)]
    assert rig.core.consumer is new
    assert rig.core.snapshot().epoch == 2


def test_the_consumer_a_higher_epoch_replaces_is_told_fenced_at_once() -> None:
    rig = ProducerRig(old_epoch=1)

    rig.feed(RegisterConsumer(Probe("cc-epoch-2"), 2))

    assert rig.old.drain() == [Fenced(2, PRODUCER_ID)]


def test_an_equal_epoch_registration_is_accepted_as_today() -> None:
    rig = ProducerRig(old_epoch=3)
    again = Probe("cc-epoch-3-again")

    rig.feed(RegisterConsumer(again, 3))

    assert again.drain() == [seq(2, rig.pc, first=True)]
    assert rig.old.drain() == []


def test_a_lower_epoch_request_neither_confirms_nor_opens_the_window() -> None:
    rig = ProducerRig(old_epoch=1)
    rig.feed(RegisterConsumer(Probe("cc-epoch-2"), 2))
    before = rig.core.snapshot()

    rig.feed(Request(3, 50, True, False, 1))

    assert rig.core.snapshot() == before
    assert rig.core.snapshot().unconfirmed == (2, 3)
    assert rig.core.statistics().fenced == 1


def test_a_lower_epoch_ack_confirms_nothing() -> None:
    rig = ProducerRig(old_epoch=1)
    rig.feed(RegisterConsumer(Probe("cc-epoch-2"), 2))
    before = rig.core.snapshot()

    rig.feed(Ack(3, 1))

    assert rig.core.snapshot() == before
    assert rig.core.statistics().fenced == 1


def test_a_lower_epoch_retry_request_is_answered_fenced_again() -> None:
    rig = ProducerRig(old_epoch=1)
    rig.feed(RegisterConsumer(Probe("cc-epoch-2"), 2))
    rig.old.drain()  # the Fenced of the take-over

    rig.feed(Request(1, 10, True, True, 1))

    assert rig.old.drain() == [Fenced(2, PRODUCER_ID)]


def test_a_lower_epoch_request_not_a_retry_is_not_answered_again() -> None:
    rig = ProducerRig(old_epoch=1)
    rig.feed(RegisterConsumer(Probe("cc-epoch-2"), 2))
    rig.old.drain()

    rig.feed(Request(3, 12, True, False, 1))
    rig.feed(Ack(3, 1))

    assert rig.old.drain() == []


def test_the_current_epochs_request_still_confirms_after_a_fenced_one() -> None:
    rig = ProducerRig(old_epoch=1)
    new = Probe("cc-epoch-2")
    rig.feed(RegisterConsumer(new, 2))
    rig.feed(Request(3, 12, True, False, 1))

    rig.feed(Request(2, 12, True, False, 2))

    assert rig.core.snapshot().confirmed_seq_nr == 2


def test_epoch_zero_everywhere_changes_nothing() -> None:
    rig = ProducerRig(old_epoch=0)
    new = Probe("cc-unfenced")

    rig.feed(RegisterConsumer(new, 0))
    rig.feed(Request(2, 12, True, False, 0))

    assert rig.old.drain() == []
    assert rig.core.snapshot().epoch == 0
    assert rig.core.snapshot().confirmed_seq_nr == 2
    assert rig.core.statistics().fenced == 0


# --- the consumer core ------------------------------------------------------------------


def consumer_rig(epoch: int) -> tuple[Driver, SelfRef, Probe, Probe]:
    """A started consumer core of ``epoch`` registered to a producer-controller probe."""
    clock = FakeClock()
    settings = ConsumerControllerSettings(flow_control_window=20)
    driver, cc = consumer_driver(clock, settings=settings, epoch=epoch)
    pc, consumer = Probe("pc"), Probe("consumer")
    driver.feed(ConsumerStart(consumer))
    driver.feed(RegisterToProducerController(pc))
    return driver, cc, pc, consumer


def test_a_consumer_sends_its_epoch_in_registration_request_and_ack() -> None:
    driver, _, pc, consumer = consumer_rig(epoch=7)
    driver.feed(seq(1, pc, first=True))
    consumer.drain()
    driver.feed(CONFIRMED)
    driver.feed(SequencedMessage(PRODUCER_ID, 2, "msg-2", False, True, pc))
    driver.feed(CONFIRMED)

    sent = pc.drain()

    assert [type(m) for m in sent] == [RegisterConsumer, Request, Request, Ack]
    assert {m.epoch for m in sent} == {7}


def test_a_fenced_of_a_newer_epoch_stops_the_consumer_without_an_ack() -> None:
    driver, _, pc, _ = consumer_rig(epoch=1)
    driver.feed(seq(1, pc, first=True))
    pc.drain()

    effects = driver.feed(Fenced(2, PRODUCER_ID))

    core = driver.core
    assert isinstance(core, ConsumerCore)
    assert effects == [Stop()]
    assert core.phase is ConsumerPhase.STOPPED
    assert core.on_stopped() == []
    assert pc.drain() == []


def test_a_fenced_consumer_delivers_nothing_more() -> None:
    driver, _, pc, consumer = consumer_rig(epoch=1)
    driver.feed(seq(1, pc, first=True))
    consumer.drain()
    driver.feed(Fenced(2, PRODUCER_ID))

    driver.feed(seq(2, pc))

    assert consumer.drain() == []


def test_a_fenced_consumer_retries_nothing() -> None:
    driver, _, pc, _ = consumer_rig(epoch=1)
    driver.feed(Fenced(2, PRODUCER_ID))
    pc.drain()

    core = driver.core
    assert isinstance(core, ConsumerCore)
    assert [e for e in core.on_timer(RETRY) if isinstance(e, Send)] == []


def test_a_fenced_of_an_epoch_not_above_the_consumers_is_ignored() -> None:
    driver, _, pc, consumer = consumer_rig(epoch=3)
    driver.feed(seq(1, pc, first=True))
    consumer.drain()

    assert driver.feed(Fenced(3, PRODUCER_ID)) == []
    assert driver.feed(Fenced(2, PRODUCER_ID)) == []

    core = driver.core
    assert isinstance(core, ConsumerCore)
    assert core.phase is ConsumerPhase.WAITING_FOR_CONFIRMATION
    assert core.fenced_error() is None


def test_a_fenced_consumer_names_both_epochs_in_its_error() -> None:
    driver, _, _, _ = consumer_rig(epoch=4)
    driver.feed(Fenced(9, PRODUCER_ID))

    core = driver.core
    assert isinstance(core, ConsumerCore)
    error = core.fenced_error()
    assert isinstance(error, ConsumerFenced)
    assert (error.epoch, error.newer_epoch) == (4, 9)
    assert "epoch 4" in str(error) and "epoch 9" in str(error) and "close it" in str(error)


@pytest.mark.parametrize("epoch", [-1, 1.0, "1", True, None])
def test_a_consumer_core_refuses_an_epoch_that_is_not_an_int_from_zero(epoch: Any) -> None:
    with pytest.raises((TypeError, ValueError), match="epoch must be"):
        ConsumerCore(Probe("cc"), epoch=epoch)


# --- both cores together ----------------------------------------------------------------


def test_the_older_consumer_core_stops_once_a_newer_one_registers() -> None:
    clock = FakeClock()
    pdriver, pc, producer = producer_driver(clock, PRODUCER_ID)
    old_driver, _ = consumer_driver(clock, "cc-1", epoch=1)
    new_driver, _ = consumer_driver(clock, "cc-2", epoch=2)
    old_consumer, new_consumer = Probe("consumer-1"), Probe("consumer-2")
    pdriver.feed(ProducerStart(producer))
    old_driver.feed(ConsumerStart(old_consumer))
    new_driver.feed(ConsumerStart(new_consumer))
    old_driver.feed(RegisterToProducerController(pc))
    producer.expect_type(RequestNext).send_next_to.tell("msg-1")
    old_consumer.drain()  # msg-1 awaits confirmation at the old consumer

    new_driver.feed(RegisterToProducerController(pc))

    assert old_driver.stopped
    assert [d.message for d in new_consumer.drain()] == ["msg-1"]
    core = pdriver.core
    assert isinstance(core, ProducerCore)
    assert core.snapshot().unconfirmed == (1,)  # msg-1 now awaits the new one's confirmation
