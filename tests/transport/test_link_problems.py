"""A handle's timeout names why its link does not work (issue 19, defect 3): a consumer
pointed at a port where nothing listens, and a producer whose consumer's node refuses its
token, each say so in their `DeliveryTimeout` instead of only "nothing delivered" or "no
demand to send". Two nodes on 127.0.0.1; every wait is bounded."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from pykka_delivery import (
    Consumer,
    ConsumerControllerSettings,
    DeliveryTimeout,
    Producer,
)
from pykka_delivery.transport import Node, NodeSettings

FAST = ConsumerControllerSettings(resend_interval_min=0.05, resend_interval_max=0.1)
QUICK_DIAL = NodeSettings(connect_timeout=0.2, reconnect_backoff_min=0.05)


@pytest.fixture
def nodes() -> Iterator[list[Node]]:
    started: list[Node] = []
    yield started
    for node in started:
        node.stop()


def start(nodes: list[Node], settings: NodeSettings) -> Node:
    node = Node(settings).start()
    nodes.append(node)
    return node


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_consumer_registered_where_nothing_listens_times_out_naming_the_address(
    nodes: list[Node],
) -> None:
    node = start(nodes, QUICK_DIAL)
    address = f"127.0.0.1:{free_port()}"
    consumer = Consumer(FAST, self_ref_factory=node.expose("c"))
    consumer.register_to(node.ref(f"{address}/orders"))

    with pytest.raises(DeliveryTimeout) as timed_out:
        consumer.receive(timeout=2.0)

    message = str(timed_out.value)
    assert message.startswith("Consumer: nothing delivered within 2.0 s")
    assert f"the link to {address} is down: no answer within connect_timeout" in message
    consumer.close()


def test_a_producer_whose_consumer_refuses_its_token_times_out_saying_so(
    nodes: list[Node],
) -> None:
    producer_node = start(
        nodes, NodeSettings(token="ours", connect_timeout=0.5, reconnect_backoff_min=0.05)
    )
    consumer_node = start(nodes, NodeSettings(token="theirs"))
    consumer = Consumer(FAST, self_ref_factory=consumer_node.expose("c"))
    producer = Producer("orders", self_ref_factory=producer_node.expose("orders"))
    producer.register_consumer(producer_node.ref(f"{consumer_node.address}/c"))

    with pytest.raises(DeliveryTimeout) as timed_out:
        for n in range(3):  # the first goes unrequested; the next wait for demand
            producer.send(n, timeout=2.0)

    message = str(timed_out.value)
    assert "no demand to send within 2.0 s" in message
    assert f"the link to {consumer_node.address} is down: refused (UNAUTHENTICATED)" in message
    assert "token" in message
    producer.close()
    consumer.close()


def test_a_timeout_while_the_link_works_names_no_link_problem(nodes: list[Node]) -> None:
    node_a, node_b = start(nodes, QUICK_DIAL), start(nodes, QUICK_DIAL)
    producer = Producer("orders", self_ref_factory=node_a.expose("orders"))
    consumer = Consumer(FAST, self_ref_factory=node_b.expose("c"))
    consumer.register_to(node_b.ref(f"{node_a.address}/orders"))
    producer.send("first", timeout=5.0)
    consumer.receive(timeout=5.0).confirm()

    with pytest.raises(DeliveryTimeout) as timed_out:
        consumer.receive(timeout=0.3)

    assert str(timed_out.value) == "Consumer: nothing delivered within 0.3 s"
    producer.close()
    consumer.close()
