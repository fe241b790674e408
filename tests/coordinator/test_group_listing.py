"""What an operator reads about groups: `CoordinatorClient.list_groups` over gRPC (who
is active, who waits, who is disconnected since when and until when, the last hand-over
and why) and `CoordinatorServer.statistics` (gauges, rebalances, hand-over durations).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from pykka_delivery.coordinator import (
    SIMPLE,
    Activity,
    Connectivity,
    Consumer,
    ConsumerId,
    CoordinatorActor,
    CoordinatorClient,
    CoordinatorServer,
    CoordinatorServerSettings,
    CoordinatorSettings,
    GroupId,
    GroupInfo,
    Handover,
    HandoverReason,
    SendConsumerUpdate,
    wire,
)
from tests.coordinator.servers import FAST

WAIT = 10.0
TIMEOUT = 30.0  # long: nobody is presumed down while a test runs
GROUP = GroupId("test", "orders", "billing")


@pytest.fixture
def server() -> Iterator[CoordinatorServer]:
    settings = CoordinatorSettings(disconnected_timeout=TIMEOUT)
    actor = CoordinatorActor.start(settings=settings)
    server = CoordinatorServer(actor, CoordinatorServerSettings()).start()
    yield server
    server.stop()
    actor.stop()


@pytest.fixture
def connect(server: CoordinatorServer) -> Iterator[Callable[[str], CoordinatorClient]]:
    opened: list[CoordinatorClient] = []

    def open_client(owner: str) -> CoordinatorClient:
        client = CoordinatorClient(server.address, owner=owner, settings=FAST)
        opened.append(client)
        return client

    yield open_client
    for client in opened:
        client.close()


def ignore(update: SendConsumerUpdate) -> None:
    pass


def listing(client: CoordinatorClient) -> GroupInfo:
    [info] = client.list_groups(timeout=WAIT)
    return info


def test_the_listing_carries_the_last_hand_over_from_whom_to_whom_and_why(
    connect: Callable[[str], CoordinatorClient],
) -> None:
    first, second = connect("worker-1"), connect("worker-2")
    first.register(GROUP, 1, ignore)
    second.register(GROUP, 2, ignore)

    first.unregister(GROUP, 1, timeout=WAIT)

    info = listing(second)
    assert info.last_handover is not None
    handover = info.last_handover
    assert (handover.from_consumer, handover.to_consumer, handover.reason) == (
        ConsumerId(first.connection_id, 1, "worker-1"),
        ConsumerId(second.connection_id, 2, "worker-2"),
        HandoverReason.UNREGISTERED,
    )
    assert 0 < handover.at <= info.listed_at


def test_the_listing_says_when_a_lost_consumer_was_disconnected_and_when_it_is_presumed_down(
    connect: Callable[[str], CoordinatorClient],
) -> None:
    lost, watcher = connect("worker-1"), connect("watcher")
    lost.register(GROUP, 1, ignore)

    lost.close(goodbye=False)

    deadline = time.monotonic() + WAIT
    while not (info := listing(watcher)).consumers[0].is_disconnected:
        assert time.monotonic() < deadline, "the server never saw the stream end"
        time.sleep(0.01)
    consumer = info.consumers[0]
    assert consumer.disconnected_at > 0
    assert info.disconnected_timeout == TIMEOUT
    waited = info.disconnected_for(consumer)
    left = info.presumed_down_in(consumer)
    assert waited is not None and left is not None
    assert waited + left == pytest.approx(TIMEOUT)


def test_server_statistics_include_the_coordinator_gauges_and_rebalances(
    server: CoordinatorServer, connect: Callable[[str], CoordinatorClient]
) -> None:
    first, second = connect("worker-1"), connect("worker-2")
    first.register(GROUP, 1, ignore)
    second.register(GROUP, 2, ignore)

    first.unregister(GROUP, 1, timeout=WAIT)

    stats = server.statistics().coordinator
    assert stats is not None
    assert (stats.groups, stats.consumers_active, stats.consumers_waiting) == (1, 1, 0)
    assert stats.rebalances == 2  # the first registration, then the hand-over
    assert stats.handover_seconds.count == 1


def test_server_statistics_without_an_answering_coordinator_have_no_coordinator_part(
    server: CoordinatorServer,
) -> None:
    server.coordinator.stop()

    stats = server.statistics()

    assert stats.coordinator is None
    assert stats.streams_attached == 0


def test_a_listing_survives_its_wire_form_with_every_field() -> None:
    lost = Consumer("c-1", 1, "node", "w1", Connectivity.DISCONNECTED, Activity.ACTIVE, 1000.5)
    waiting = Consumer("c-2", 2, "node", "w2")
    handover = Handover(990.0, None, ConsumerId("c-1", 1, "w1"), HandoverReason.REGISTERED, 0.0)
    info = GroupInfo(GROUP, SIMPLE, (lost, waiting), handover, 42.0, 1001.0)
    moved = Handover(
        995.0, ConsumerId("c-1", 1), ConsumerId("c-2", 2, "w2"), HandoverReason.REBALANCED, 0.25
    )
    other = GroupInfo(GroupId("test", "orders-1", "billing"), 1, (waiting,), moved, 42.0, 1001.0)

    back = wire.groups_from_message(wire.groups_message((info, other)))

    assert back == (info, other)
    for sent, got in zip((info, other), back, strict=True):
        assert got.consumers[0].disconnected_at == sent.consumers[0].disconnected_at
        assert (got.last_handover, got.disconnected_timeout, got.listed_at) == (
            sent.last_handover,
            sent.disconnected_timeout,
            sent.listed_at,
        )
