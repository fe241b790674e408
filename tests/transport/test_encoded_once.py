"""A payload sent to another process is encoded once (issue 19): the producer's check
encodes it when it is sent, and the node's frame builder writes those bytes.

It used to be encoded twice: by the check, bytes thrown away, and again by the frame
builder on the node's thread, which also meant that a payload mutated after ``send`` went
out as it was when the frame was built. Two nodes on 127.0.0.1 in this process, each with
its own `Serialization` and a user serializer registered through the public API; every
wait is bounded.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pykka
import pytest

from pykka_delivery import (
    Consumer,
    ConsumerController,
    Delivery,
    MessageWithConfirmation,
    Producer,
    ProducerController,
    ProducerControllerSettings,
    RegisterToProducerController,
    WorkPullingProducerController,
    WorkPullingSettings,
)
from pykka_delivery.delivery.registry import LocalServiceRegistry
from pykka_delivery.protocol import Serialization
from pykka_delivery.transport import Node
from tests.harness import wait_until
from tests.transport.test_unserializable import _Inbox, actors, arrivals

__all__ = ["actors"]

WAIT = 10.0


class Box:
    """A mutable payload of a user type."""

    def __init__(self, value: int) -> None:
        self.value = value


class BoxSerializer:
    """Writes a `Box` as its value in decimal; counts the writes. With ``hold``, a write
    on any thread but ``sender`` waits for it first (the frame builder's thread)."""

    serializer_id = 100

    def __init__(self, hold: threading.Event | None = None) -> None:
        self.writes = 0
        self.hold = hold
        self.sender = threading.get_ident()

    def manifest(self, obj: object) -> str:
        return ""

    def to_bytes(self, obj: object) -> bytes:
        assert isinstance(obj, Box)
        if self.hold is not None and threading.get_ident() != self.sender:
            self.hold.wait(WAIT)
        self.writes += 1
        return str(obj.value).encode()

    def from_bytes(self, data: bytes, manifest: str) -> object:
        return Box(int(data))


Start = Callable[[BoxSerializer], tuple[Node, Serialization]]


@pytest.fixture
def start() -> Iterator[Start]:
    """Starts a node whose serialization (returned with it) writes `Box` with the
    serializer given; every node started is stopped at the end."""
    started: list[Node] = []

    def start_node(serializer: BoxSerializer) -> tuple[Node, Serialization]:
        serialization = Serialization()
        serialization.register(serializer, for_types=(Box,))
        node = Node(serialization=serialization).start()
        started.append(node)
        return node, serialization

    yield start_node
    for node in reversed(started):
        node.stop()


def connected(a: Node, b: Node) -> tuple[Producer, Consumer]:
    """A producer on node ``a``, its consumer on node ``b``."""
    producer = Producer("orders", self_ref_factory=a.expose("orders"))
    consumer = Consumer(self_ref_factory=b.expose("c"))
    consumer.register_to(b.ref(f"{a.address}/orders"))
    return producer, consumer


def exchange(producer: Producer, consumer: Consumer, payloads: list[Any]) -> list[Any]:
    """Send ``payloads``; returns what arrived, in order. The first goes alone: the consumer
    handle asks for more once it took it."""
    producer.send(payloads[0], timeout=WAIT)
    got = arrivals(consumer, 1)
    for payload in payloads[1:]:
        producer.send(payload, timeout=WAIT)
    got += arrivals(consumer, len(payloads) - 1)
    return [message for _, message in got]


def test_a_user_serializer_writes_each_payload_sent_to_another_process_once(
    start: Start,
) -> None:
    serializer = BoxSerializer()
    (a, serialization), (b, _) = start(serializer), start(BoxSerializer())
    producer, consumer = connected(a, b)

    got = exchange(producer, consumer, [Box(i) for i in range(50)])

    assert [box.value for box in got] == list(range(50))
    # A resend (none is expected on this link) encodes its payload again.
    wait_until(
        lambda: serializer.writes == 50 + producer.statistics().resent,
        "one write per message sent, plus one per resend",
    )
    assert serialization.check_memo_count == 0
    producer.close()
    consumer.close()


def test_a_payload_mutated_after_send_arrives_as_it_was_sent(
    start: Start,
) -> None:
    mutated = threading.Event()
    (a, _), (b, _) = start(BoxSerializer(hold=mutated)), start(BoxSerializer())
    producer, consumer = connected(a, b)
    box = Box(1)

    producer.send(box, timeout=WAIT)
    box.value = 2
    mutated.set()

    assert [box.value for _, box in arrivals(consumer, 1)] == [1]
    producer.close()
    consumer.close()


def test_bytes_payloads_sent_to_another_process_leave_nothing_in_the_memo(
    start: Start,
) -> None:
    (a, serialization), (b, _) = start(BoxSerializer()), start(BoxSerializer())
    producer, consumer = connected(a, b)

    payloads = [b"payload %d" % i for i in range(20)]

    got = exchange(producer, consumer, payloads)

    assert got == payloads
    assert serialization.check_memo_count == 0
    producer.close()
    consumer.close()


def test_a_payload_for_a_consumer_on_the_same_node_is_never_written(
    start: Start,
) -> None:
    serializer = BoxSerializer()
    a, serialization = start(serializer)
    producer, consumer = connected(a, a)
    box = Box(1)

    producer.send(box, timeout=WAIT)

    assert [message for _, message in arrivals(consumer, 1)] == [box]
    assert serializer.writes == 0
    assert serialization.check_memo_count == 0
    producer.close()
    consumer.close()


def test_the_actors_send_next_to_and_ask_next_to_write_each_payload_once(
    start: Start, actors: list[pykka.ActorRef[Any]]
) -> None:
    # The adapter checks the payload in the producer's thread; the controller must not
    # check (encode) it again in its own.
    serializer = BoxSerializer()
    (a, serialization), (b, _) = start(serializer), start(BoxSerializer())
    requests: list[Any] = []
    deliveries: list[Any] = []
    producer, consumer = _Inbox.start(requests), _Inbox.start(deliveries)
    pc = ProducerController.start(
        "orders", self_ref_factory=a.expose("orders"), serialization=serialization
    )
    cc = ConsumerController.start(self_ref_factory=b.expose("c"))
    actors += [producer, consumer, pc, cc]
    cc.tell(ConsumerController.Start(consumer))
    pc.tell(ProducerController.Start(producer))
    cc.tell(RegisterToProducerController(b.ref(f"{a.address}/orders")))

    wait_until(lambda: len(requests) >= 1, "the first RequestNext")
    requests[0].send_next_to.tell(Box(1))
    wait_until(lambda: len(requests) >= 2, "the second RequestNext")
    requests[1].ask_next_to.tell(MessageWithConfirmation(Box(2), producer))
    wait_until(lambda: len(deliveries) >= 1, "the first delivery")
    deliveries[0].confirm()
    wait_until(lambda: len(deliveries) >= 2, "the second delivery")

    got = [m.message.value for m in deliveries if type(m) is Delivery]
    assert got == [1, 2]
    resent = pc.proxy().statistics().get(timeout=WAIT).resent
    assert serializer.writes == 2 + resent
    assert serialization.check_memo_count == 0


def test_the_work_pulling_actors_send_next_to_writes_each_payload_once(
    start: Start, actors: list[pykka.ActorRef[Any]]
) -> None:
    serializer = BoxSerializer()
    (a, serialization), (b, _) = start(serializer), start(BoxSerializer())
    registry = LocalServiceRegistry()
    requests: list[Any] = []
    producer = _Inbox.start(requests)
    worker = Consumer(self_ref_factory=b.expose("w"))
    registry.register("jobs", a.ref(f"{b.address}/w"))
    # No first-message resend within the test: the work-pulling stats do not count them.
    no_resend = ProducerControllerSettings(resend_first_interval=60.0)
    wppc = WorkPullingProducerController.start(
        "jobs-producer",
        "jobs",
        WorkPullingSettings(producer_controller_settings=no_resend),
        registry=registry,
        worker_ref_factory=lambda ref, worker_id: a.register(f"jobs-{worker_id}", ref),
    )
    actors += [producer, wppc]
    wppc.tell(WorkPullingProducerController.Start(producer))

    wait_until(lambda: len(requests) >= 1, "a RequestNext")
    requests[0].send_next_to.tell(Box(1))

    delivery = worker.receive(timeout=WAIT)
    assert delivery.message.value == 1
    delivery.confirm()
    assert serializer.writes == 1
    assert serialization.check_memo_count == 0
    worker.close()
