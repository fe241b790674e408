"""A payload the transport cannot encode is refused when it is sent (issue 19, defect 1).

It used to be accepted and numbered: the node logged the encoding error on every resend,
the message never left, and every later message of the stream waited behind it. Now the
producer checks the payload with the node's serializers before numbering it: the send
raises the serializer's `SerializationError` (naming the type and the fix), nothing is
sent, and the next message takes the seq_nr. Two nodes on 127.0.0.1 in this process, for
each way of sending: `Producer` and `AsyncProducer` (the `flavour` fixture), their
`send_many`, `send_and_confirm` and `send_nowait`, the `WorkPullingProducer`, and the
actors' ``send_next_to`` / ``ask_next_to``. Every wait is bounded.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import pykka
import pytest

from pykka_delivery import (
    Consumer,
    ConsumerController,
    ConsumerControllerSettings,
    Delivery,
    MessageWithConfirmation,
    Producer,
    ProducerController,
    RegisterToProducerController,
    RequestNext,
    WorkPullingProducer,
    WorkPullingProducerController,
)
from pykka_delivery.delivery.registry import LocalServiceRegistry
from pykka_delivery.protocol import SerializationError
from pykka_delivery.transport import Node
from tests.delivery.handles.flavours import Flavour, flavour
from tests.harness import wait_until

__all__ = ["flavour"]

WAIT = 10.0
FAST = ConsumerControllerSettings(resend_interval_min=0.05, resend_interval_max=0.2)
NOT_JSON = "Object of type datetime is not JSON serializable"


def unencodable() -> dict[str, Any]:
    return {"when": datetime.datetime.now(tz=datetime.UTC)}


@pytest.fixture
def nodes() -> Iterator[tuple[Node, Node]]:
    a = Node().start()
    try:
        b = Node().start()
        try:
            yield a, b
        finally:
            b.stop()
    finally:
        a.stop()


def remote_pair(flavour: Flavour, nodes: tuple[Node, Node]) -> tuple[Any, Consumer]:
    """A producer of ``flavour`` on node a, a blocking consumer on node b, connected."""
    a, b = nodes
    producer = flavour.producer("orders", self_ref_factory=a.expose("orders"))
    consumer = Consumer(FAST, self_ref_factory=b.expose("c"))
    consumer.register_to(b.ref(f"{a.address}/orders"))
    return producer, consumer


def arrivals(consumer: Consumer, count: int) -> list[tuple[int, Any]]:
    """``count`` deliveries as ``(seq_nr, message)``, each confirmed."""
    got = []
    for _ in range(count):
        delivery = consumer.receive(timeout=WAIT)
        got.append((delivery.seq_nr, delivery.message))
        delivery.confirm()
    return got


def assert_refused_for_datetime(error: SerializationError) -> None:
    assert NOT_JSON in str(error)
    assert "register a serializer" in str(error)
    assert any("refused it before numbering it" in note for note in error.__notes__)


# --- the handles -------------------------------------------------------------------------


def test_the_first_message_of_a_stream_is_refused_and_the_next_takes_its_seq_nr(
    flavour: Flavour, nodes: tuple[Node, Node]
) -> None:
    producer, consumer = remote_pair(flavour, nodes)

    with pytest.raises(SerializationError) as refused:
        producer.send(unencodable(), timeout=WAIT)
    seq_nr = producer.send({"n": 3}, timeout=WAIT)

    assert_refused_for_datetime(refused.value)
    assert seq_nr == 1
    assert arrivals(consumer, 1) == [(1, {"n": 3})]
    assert producer.statistics().refused_payloads == 1
    producer.close()
    consumer.close()


def test_a_message_refused_in_the_steady_state_leaves_no_hole_in_the_stream(
    flavour: Flavour, nodes: tuple[Node, Node]
) -> None:
    producer, consumer = remote_pair(flavour, nodes)
    producer.send({"n": 1}, timeout=WAIT)
    assert arrivals(consumer, 1) == [(1, {"n": 1})]
    wait_until(lambda: producer.snapshot().requested_seq_nr > 1, "the consumer's Request")

    with pytest.raises(SerializationError) as refused:
        producer.send(unencodable(), timeout=WAIT)
    producer.send({"n": 3}, timeout=WAIT)

    assert_refused_for_datetime(refused.value)
    assert arrivals(consumer, 1) == [(2, {"n": 3})]
    assert producer.snapshot().unconfirmed in ((), (2,))
    producer.close()
    consumer.close()


def test_send_many_with_one_bad_payload_sends_none_of_them(
    flavour: Flavour, nodes: tuple[Node, Node]
) -> None:
    producer, consumer = remote_pair(flavour, nodes)
    producer.send({"n": 0}, timeout=WAIT)
    assert arrivals(consumer, 1) == [(1, {"n": 0})]
    wait_until(lambda: producer.snapshot().requested_seq_nr > 1, "the consumer's Request")

    with pytest.raises(SerializationError) as refused:
        producer.send_many([{"n": 1}, unencodable(), {"n": 3}], timeout=WAIT)
    seq_nrs = producer.send_many([{"n": 1}, {"n": 2}], timeout=WAIT)

    assert any("message 2 of 3" in note for note in refused.value.__notes__)
    assert seq_nrs == [2, 3]
    assert arrivals(consumer, 2) == [(2, {"n": 1}), (3, {"n": 2})]
    assert producer.statistics().sent == 3
    producer.close()
    consumer.close()


def test_send_and_confirm_and_send_nowait_refuse_a_bad_payload_too(
    flavour: Flavour, nodes: tuple[Node, Node]
) -> None:
    producer, consumer = remote_pair(flavour, nodes)

    with pytest.raises(SerializationError, match=NOT_JSON):
        producer.send_and_confirm(unencodable(), timeout=WAIT)
    producer.send({"n": 1}, timeout=WAIT)
    assert arrivals(consumer, 1) == [(1, {"n": 1})]
    wait_until(lambda: producer.snapshot().requested_seq_nr > 1, "the consumer's Request")
    with pytest.raises(SerializationError, match=NOT_JSON):
        producer.send_nowait(unencodable())

    assert producer.send_nowait({"n": 2}) == 2
    assert arrivals(consumer, 1) == [(2, {"n": 2})]
    producer.close()
    consumer.close()


def test_a_ref_to_the_nodes_own_address_takes_any_payload(nodes: tuple[Node, Node]) -> None:
    a, _ = nodes
    producer_ref = a.ref(f"{a.address}/orders")
    consumer = Consumer(FAST, self_ref_factory=a.expose("c"))
    producer = Producer("orders", self_ref_factory=a.expose("orders"))
    consumer.register_to(producer_ref)
    when = datetime.datetime.now(tz=datetime.UTC)

    producer.send({"when": when}, timeout=WAIT)

    assert arrivals(consumer, 1) == [(1, {"when": when})]
    producer.close()
    consumer.close()


def test_a_work_pulling_producer_refuses_a_payload_a_remote_worker_cannot_take(
    nodes: tuple[Node, Node],
) -> None:
    a, b = nodes
    registry = LocalServiceRegistry()
    worker = Consumer(FAST, self_ref_factory=b.expose("w"))
    registry.register("jobs", a.ref(f"{b.address}/w"))
    producer = WorkPullingProducer(
        "jobs-producer",
        "jobs",
        registry=registry,
        worker_ref_factory=lambda ref, worker_id: a.register(f"jobs-{worker_id}", ref),
    )

    with pytest.raises(SerializationError, match=NOT_JSON):
        producer.send(unencodable(), timeout=WAIT)
    seq_nr = producer.send({"n": 3}, timeout=WAIT)

    assert seq_nr == 1
    delivery = worker.receive(timeout=WAIT)
    assert delivery.message == {"n": 3}
    delivery.confirm()
    assert producer.statistics().refused_payloads == 1
    producer.close()
    worker.close()


# --- the actors ----------------------------------------------------------------------------


class _Inbox(pykka.ThreadingActor):
    """Keeps what it is told (a producer's `RequestNext`s, a consumer's deliveries)."""

    use_daemon_thread = True

    def __init__(self, received: list[Any]) -> None:
        super().__init__()
        self._received = received

    def on_receive(self, message: Any) -> None:
        self._received.append(message)


def first_of(received: list[Any], kind: type, what: str) -> Any:
    wait_until(lambda: any(type(m) is kind for m in received), what)
    return next(m for m in received if type(m) is kind)


@pytest.fixture
def actors() -> Iterator[list[pykka.ActorRef[Any]]]:
    started: list[pykka.ActorRef[Any]] = []
    yield started
    for ref in reversed(started):
        ref.stop()


def test_the_actors_send_next_to_raises_in_the_producers_thread_and_the_request_holds(
    nodes: tuple[Node, Node], actors: list[pykka.ActorRef[Any]]
) -> None:
    a, b = nodes
    requests: list[Any] = []
    deliveries: list[Any] = []
    producer = _Inbox.start(requests)
    consumer = _Inbox.start(deliveries)
    pc = ProducerController.start("orders", self_ref_factory=a.expose("orders"))
    cc = ConsumerController.start(FAST, self_ref_factory=b.expose("c"))
    actors += [producer, consumer, pc, cc]
    cc.tell(ConsumerController.Start(consumer))
    pc.tell(ProducerController.Start(producer))
    cc.tell(RegisterToProducerController(b.ref(f"{a.address}/orders")))
    request_next = first_of(requests, RequestNext, "a RequestNext")

    with pytest.raises(SerializationError, match=NOT_JSON):
        request_next.send_next_to.tell(unencodable())
    with pytest.raises(SerializationError, match=NOT_JSON):
        request_next.ask_next_to.tell(MessageWithConfirmation(unencodable(), producer))
    request_next.send_next_to.tell({"n": 3})

    delivery = first_of(deliveries, Delivery, "the delivery")
    assert (delivery.seq_nr, delivery.message) == (1, {"n": 3})
    assert pc.proxy().statistics().get(timeout=WAIT).refused_payloads == 2


def test_the_work_pulling_actors_send_next_to_raises_in_the_producers_thread(
    nodes: tuple[Node, Node], actors: list[pykka.ActorRef[Any]]
) -> None:
    a, b = nodes
    registry = LocalServiceRegistry()
    requests: list[Any] = []
    producer = _Inbox.start(requests)
    worker = Consumer(FAST, self_ref_factory=b.expose("w"))
    registry.register("jobs", a.ref(f"{b.address}/w"))
    wppc = WorkPullingProducerController.start(
        "jobs-producer",
        "jobs",
        registry=registry,
        worker_ref_factory=lambda ref, worker_id: a.register(f"jobs-{worker_id}", ref),
    )
    actors += [producer, wppc]
    wppc.tell(WorkPullingProducerController.Start(producer))
    request_next = first_of(requests, RequestNext, "a RequestNext")

    with pytest.raises(SerializationError, match=NOT_JSON):
        request_next.send_next_to.tell(unencodable())
    request_next.send_next_to.tell({"n": 3})

    delivery = worker.receive(timeout=WAIT)
    assert delivery.message == {"n": 3}
    delivery.confirm()
    assert wppc.proxy().statistics().get(timeout=WAIT).accepted == 1
    worker.close()
