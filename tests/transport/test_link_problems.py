"""A handle's timeout names why its link does not work (issue 19, defect 3): a consumer
pointed at a port where nothing listens, a producer whose consumer's node refuses its
token, and a handle pointed at a name nothing is exposed under (the node at the other end
says so on the link) each say so in their `DeliveryTimeout` instead of only "nothing
delivered" or "no demand to send". Two nodes on 127.0.0.1; every wait is bounded."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from pykka_delivery import (
    Consumer,
    ConsumerControllerSettings,
    DeliveryTimeout,
    Producer,
)
from pykka_delivery.transport import Node, NodeSettings
from tests.harness import wait_until
from tests.transport.test_node import Sink, free_port, start

FAST = ConsumerControllerSettings(resend_interval_min=0.05, resend_interval_max=0.1)
QUICK_DIAL = NodeSettings(connect_timeout=0.2, reconnect_backoff_min=0.05)


class Collector:
    """A ref that keeps what it is told (link events aside)."""

    def __init__(self, into: list[object]) -> None:
        self.into = into

    def tell(self, message: Any) -> None:
        if isinstance(message, str):
            self.into.append(message)


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


def test_a_consumer_registered_to_a_wrong_name_times_out_naming_it(nodes: list[Node]) -> None:
    producer_node, consumer_node = start(nodes, QUICK_DIAL), start(nodes, QUICK_DIAL)
    producer = Producer("orders", self_ref_factory=producer_node.expose("orders"))
    consumer = Consumer(FAST, self_ref_factory=consumer_node.expose("c"))
    consumer.register_to(consumer_node.ref(f"{producer_node.address}/ordres"))

    with pytest.raises(DeliveryTimeout) as timed_out:
        consumer.receive(timeout=2.0)

    assert str(timed_out.value) == (
        "Consumer: nothing delivered within 2.0 s; no target 'ordres' on node "
        f"{producer_node.address}: nothing is exposed under that name; check the name or "
        "expose it first"
    )
    producer.close()
    consumer.close()


def test_a_producer_pointed_at_a_wrong_consumer_name_times_out_naming_it(
    nodes: list[Node],
) -> None:
    producer_node, consumer_node = start(nodes, QUICK_DIAL), start(nodes, QUICK_DIAL)
    consumer = Consumer(FAST, self_ref_factory=consumer_node.expose("c"))
    producer = Producer("orders", self_ref_factory=producer_node.expose("orders"))
    producer.register_consumer(producer_node.ref(f"{consumer_node.address}/nobody"))

    with pytest.raises(DeliveryTimeout) as timed_out:
        for n in range(3):  # the first goes unrequested; the next wait for demand
            producer.send(n, timeout=2.0)

    message = str(timed_out.value)
    assert "no demand to send within 2.0 s" in message
    assert f"no target 'nobody' on node {consumer_node.address}" in message
    producer.close()
    consumer.close()


def test_a_name_exposed_after_it_was_reported_unknown_is_no_longer_named(
    nodes: list[Node],
) -> None:
    sender, receiver = start(nodes, QUICK_DIAL), start(nodes, QUICK_DIAL)
    ref = sender.ref(f"{receiver.address}/late")
    ref.tell("early")
    wait_until(lambda: ref.link_problem() is not None)

    got: list[object] = []
    receiver.register("late", Collector(got))

    wait_until(lambda: ref.link_problem() is None)
    ref.tell("on time")
    wait_until(lambda: got == ["on time"])


def test_a_wrong_name_is_reported_once_per_interval_not_per_message(
    nodes: list[Node], caplog: pytest.LogCaptureFixture
) -> None:
    sender = start(nodes, QUICK_DIAL)
    receiver = start(nodes, NodeSettings(unknown_target_report_interval=60.0))
    ref = sender.ref(f"{receiver.address}/nobody")
    caplog.set_level(logging.WARNING, logger="pykka_delivery.transport")

    for n in range(5):  # one frame each: each waits for the one before to arrive
        ref.tell(n)
        wait_until(lambda n=n: receiver.statistics().unknown_target == n + 1)
    wait_until(lambda: ref.link_problem() is not None)
    # The link is ordered: once a frame sent after the five arrived, every notice did.
    sink = Sink()
    sender.register("sink", sink)
    receiver.ref(f"{sender.address}/sink").tell("after")
    sink.wait(1)

    told = [r for r in caplog.records if "are dropped there" in r.getMessage()]
    assert len(told) == 1
    assert sender.statistics().frames_received == 2  # the one notice, then "after"


def test_a_name_unknown_on_this_very_node_is_named_too(nodes: list[Node]) -> None:
    node = start(nodes, QUICK_DIAL)

    ref = node.ref(f"{node.address}/nobody")

    assert ref.link_problem() == (
        f"no target 'nobody' on node {node.address}: nothing is exposed under that name; "
        "check the name or expose it first"
    )
