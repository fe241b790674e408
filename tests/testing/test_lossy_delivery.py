"""The delivery protocol through `LossyRef`s that reorder (and drop) messages: everything
still arrives exactly once, in order. Real pykka controllers and the test actors of
tests/actor_kit.py, wired as in tests/delivery/actors/test_reliable_delivery_random_actors.py
(ReliableDeliveryRandomSpec), with reordering added on both directions."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pykka_delivery.delivery.actors.consumer_controller import ConsumerController
from pykka_delivery.delivery.actors.producer_controller import ProducerController
from pykka_delivery.delivery.core.settings import (
    ConsumerControllerSettings,
    ProducerControllerSettings,
)
from pykka_delivery.delivery.messages import RegisterToProducerController
from pykka_delivery.protocol.messages import RegisterConsumer, Request, Resend, SequencedMessage
from pykka_delivery.testing import LossyRef
from tests.actor_kit import (
    Recorder,
    TestConsumer,
    TestProducer,
    describe_controller,
    messages_until,
)

pytestmark = pytest.mark.slow  # fault injection: a second or two per run

NUMBER_OF_MESSAGES = 63
WAIT = 20.0


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    recorder = Recorder()
    yield recorder
    recorder.assert_no_violations()


def run(recorder: Recorder, *, seed: int, drop: float, reorder: float) -> tuple[LossyRef, ...]:
    """Wire both controllers behind reordering refs, run to seq_nr 63; the two refs."""
    cc = ConsumerController.start(
        ConsumerControllerSettings(
            flow_control_window=20, resend_interval_min=0.05, resend_interval_max=0.2
        ),
        self_ref_factory=lambda ref: LossyRef(
            ref,
            drop=drop,
            reorder=reorder,
            max_hold=3,
            types=(SequencedMessage,),
            seed=seed,
        ),
    )
    TestConsumer.start(cc, recorder, name="consumer", end_seq_nr=NUMBER_OF_MESSAGES, delay=0)
    pc = ProducerController.start(
        "p-1",
        ProducerControllerSettings(resend_first_interval=0.05),
        self_ref_factory=lambda ref: LossyRef(
            ref,
            drop=drop,
            reorder=reorder,
            max_hold=3,
            types=(Request, Resend, RegisterConsumer),
            seed=seed + 1,
        ),
    )
    TestProducer.start(pc, recorder, name="producer", delay=0)
    to_consumer: LossyRef = cc.proxy().self_ref.get()
    to_producer: LossyRef = pc.proxy().self_ref.get()
    cc.tell(RegisterToProducerController(to_producer))

    def context() -> str:
        return (
            f"seed {seed}: to consumer {to_consumer.reordered} reordered, "
            f"{to_consumer.dropped} dropped; to producer {to_producer.reordered} reordered, "
            f"{to_producer.dropped} dropped\n"
            f"  {describe_controller(pc)}\n  {describe_controller(cc)}"
        )

    recorder.wait_collected("consumer", timeout=WAIT, context=context)
    return to_consumer, to_producer


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_reordered_messages_are_delivered_once_each_in_order(seed: int, recorder: Recorder) -> None:
    to_consumer, _ = run(recorder, seed=seed, drop=0.0, reorder=0.3)

    assert recorder.deliveries("consumer") == messages_until(NUMBER_OF_MESSAGES, 0)
    assert to_consumer.reordered > 0


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_reordered_and_dropped_messages_are_delivered_once_each_in_order(
    seed: int, recorder: Recorder
) -> None:
    to_consumer, to_producer = run(recorder, seed=seed, drop=0.1, reorder=0.3)

    assert recorder.deliveries("consumer") == messages_until(NUMBER_OF_MESSAGES, 0)
    assert to_consumer.reordered > 0
    assert to_consumer.dropped + to_producer.dropped > 0
