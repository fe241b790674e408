"""Named producers found through the coordinator's stream catalog, in one process.

Every producer and member has a transport node of its own (members reach the producers
through gRPC, as across hosts) and a coordinator client of its own; the members are given
only their client and node: no producer address anywhere. Checked: every producer of a
stream is consumed on every partition; producers join and leave without a rebalance (no
new activation); a leave drains; a growth pushed by the coordinator is followed by the
producers and the members on their own; a `GroupConsumer` picks up a stream created later
that matches its pattern. No original scenario (Pekko has one producer per
ProducerController; see docs/partitions.md, "Several producers per stream").
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from pykka_delivery.coordinator import (
    CoordinatorActor,
    CoordinatorClient,
    CoordinatorRefused,
    CoordinatorServer,
    CoordinatorServerSettings,
    CoordinatorSettings,
)
from pykka_delivery.partitions import (
    GroupConsumer,
    GroupDelivery,
    GroupMember,
    PartitionedProducer,
    producer_id,
)
from pykka_delivery.transport import Node
from tests.partitions.test_streams_from_coordinator import (
    FAST_CLIENT,
    MEMBER_SETTINGS,
    WAIT,
)
from tests.partitions.test_streams_from_coordinator import (
    PRODUCER_SETTINGS as UNNAMED_PRODUCER,
)

STREAM = "clicks"
GROUP = "totals"
PRODUCER_SETTINGS = dataclasses.replace(
    UNNAMED_PRODUCER,
    leave_timeout=WAIT,
    name_wait=0.5,
    retry_backoff_min=0.01,
    retry_backoff_max=0.1,
)


class Handled:
    """What a member's handler saw, in order."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.deliveries: list[GroupDelivery] = []

    def __call__(self, delivery: GroupDelivery) -> None:
        with self.lock:
            self.deliveries.append(delivery)

    def messages(self) -> list[object]:
        with self.lock:
            return [d.message for d in self.deliveries]

    def wait_for(self, count: int) -> None:
        wait_until(lambda: len(self.messages()) >= count, f"{count} messages handled")


def wait_until(condition: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.01)


class World:
    """A coordinator server; clients and nodes made on demand, all closed at the end."""

    def __init__(self) -> None:
        self.actor = CoordinatorActor.start(settings=CoordinatorSettings(max_partitions=64))
        self.server = CoordinatorServer(self.actor, CoordinatorServerSettings()).start()
        self._closers: list[Callable[[], None]] = []

    def client(self) -> CoordinatorClient:
        client = CoordinatorClient(self.server.address, settings=FAST_CLIENT)
        self._closers.append(client.close)
        return client

    def node(self) -> Node:
        node = Node().start()
        self._closers.append(node.stop)
        return node

    def producer(self, name: str, partitions: int = 4, **kwargs: object) -> PartitionedProducer:
        producer = PartitionedProducer.from_coordinator(
            self.client(),
            STREAM,
            [GROUP],
            name=name,
            node=self.node(),
            create_with=partitions,
            settings=PRODUCER_SETTINGS,
            **kwargs,  # type: ignore[arg-type]
        )
        self._closers.append(producer.close)
        return producer

    def member(self, handler: Callable[[GroupDelivery], None]) -> GroupMember:
        member = GroupMember.from_coordinator(
            self.client(),
            STREAM,
            GROUP,
            handler=handler,
            node=self.node(),
            settings=MEMBER_SETTINGS,
        )
        self._closers.append(lambda: member.close(grace=1.0))
        return member

    def close(self) -> None:
        for close in reversed(self._closers):
            close()
        self.server.stop()
        self.actor.stop()


@pytest.fixture
def world() -> Iterator[World]:
    made = World()
    try:
        yield made
    finally:
        made.close()


def send_all(producer: PartitionedProducer, count: int, keys: int = 8) -> list[dict[str, object]]:
    sent = []
    for n in range(count):
        message = {"producer": producer.name, "key": f"k{n % keys}", "n": n}
        producer.send(message, key=str(message["key"]), timeout=WAIT)
        sent.append(message)
    return sent


def test_a_member_given_only_the_coordinator_consumes_every_producer_of_the_stream(
    world: World,
) -> None:
    handled = Handled()
    web, mobile = world.producer("web"), world.producer("mobile")
    member = world.member(handled)
    sent = send_all(web, 40) + send_all(mobile, 40)
    handled.wait_for(len(sent))

    assert sorted(member.producers()) == ["mobile", "web"]
    assert sorted(map(repr, handled.messages())) == sorted(map(repr, sent))
    for delivery in handled.deliveries:  # each from its own producer's stream
        name = delivery.message["producer"]  # type: ignore[index]
        assert delivery.producer_id == producer_id(STREAM, delivery.partition, GROUP, name)
    for name in ("web", "mobile"):  # per key, in the order that producer sent
        for key in {m["key"] for m in sent}:
            ns = [
                m["n"]  # type: ignore[index]
                for m in handled.messages()
                if m["producer"] == name and m["key"] == key  # type: ignore[index]
            ]
            assert ns == sorted(ns)


def test_a_producer_that_joins_is_consumed_without_a_rebalance(world: World) -> None:
    handled = Handled()
    web = world.producer("web")
    member = world.member(handled)
    first = send_all(web, 20)
    handled.wait_for(len(first))
    activations = member.statistics().activations

    late = world.producer("late")
    wait_until(lambda: "late" in member.producers(), "the member learns of the new producer")
    more = send_all(late, 20)
    handled.wait_for(len(first) + len(more))

    assert member.statistics().activations == activations  # no partition moved or restarted
    assert sorted(map(repr, handled.messages())) == sorted(map(repr, first + more))


def test_a_producer_that_leaves_drains_first_and_is_forgotten(world: World) -> None:
    handled = Handled()
    web, mobile = world.producer("web"), world.producer("mobile")
    member = world.member(handled)
    wait_until(lambda: len(member.producers()) == 2, "both producers listed")
    sent = send_all(mobile, 30)
    mobile.close()  # returns once every message was confirmed, then leaves the catalog

    assert len(handled.messages()) >= len(sent)  # drained before it left
    wait_until(lambda: member.producers() == ("web",), "the member forgets the producer")
    stats = mobile.statistics().producers.values()
    assert sum(s.sent for s in stats) == len(sent)
    assert all(s.lost_on_close == 0 for s in stats)  # nothing was unconfirmed when it left
    after = send_all(web, 10)
    handled.wait_for(len(sent) + len(after))


def test_a_growth_pushed_by_the_coordinator_is_followed_by_producers_and_members(
    world: World,
) -> None:
    handled = Handled()
    web = world.producer("web", partitions=2)
    member = world.member(handled)
    first = send_all(web, 10)
    handled.wait_for(len(first))

    world.client().create_stream(STREAM, 4)  # anyone may grow it: nobody calls grow
    wait_until(lambda: web.partitions == 4 and member.partitions == 4, "both grew to 4")
    more = send_all(web, 40)
    handled.wait_for(len(first) + len(more))

    partitions = {d.partition for d in handled.deliveries[len(first) :]}
    assert partitions & {2, 3}  # the new partitions carry messages, and are consumed
    assert sorted(map(repr, handled.messages())) == sorted(map(repr, first + more))


def test_a_second_live_producer_with_the_same_name_is_refused(world: World) -> None:
    world.producer("web")
    with pytest.raises(CoordinatorRefused) as refused:
        world.producer("web")
    assert "web" in str(refused.value)


def test_a_group_consumer_follows_a_pattern_and_picks_up_streams_created_later(
    world: World,
) -> None:
    handled = Handled()
    admin = world.client()
    admin.create_stream("orders.eu", 2)
    consumer = GroupConsumer(
        world.client(),
        GROUP,
        "orders.*",
        handler=handled,
        node=world.node(),
        settings=MEMBER_SETTINGS,
    )
    try:
        consumer.wait_for_streams(["orders.eu"], WAIT)
        admin.create_stream("orders.us", 2)  # created after the consumer started
        admin.create_stream("ordersx", 2)  # does not match
        consumer.wait_for_streams(["orders.us"], WAIT)
        producers = [
            PartitionedProducer.from_coordinator(
                world.client(),
                stream,
                [GROUP],
                name="svc",
                node=world.node(),
                settings=PRODUCER_SETTINGS,
            )
            for stream in ("orders.eu", "orders.us")
        ]
        for producer in producers:
            for n in range(5):
                producer.send({"stream": producer.stream, "n": n}, key=str(n), timeout=WAIT)
        handled.wait_for(10)
        for producer in producers:
            producer.close()
        assert consumer.streams() == ("orders.eu", "orders.us")
        assert {d.stream for d in handled.deliveries} == {"orders.eu", "orders.us"}
    finally:
        consumer.close(grace=1.0)
