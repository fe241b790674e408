"""Lag as data end to end, in one process: a real `CoordinatorServer`, a
`PartitionedProducer` reporting through one `CoordinatorClient` and a `GroupMember`
(its `CoordinatedConsumer`s) reporting through another. A handler that holds one message
keeps a partition behind; `client.lag()` must show it per partition and producer.
Waits poll with a bound; the report interval is short so that they end quickly."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator

import pytest

from pykka_delivery import ConsumerControllerSettings
from pykka_delivery.coordinator import (
    CoordinatorActor,
    CoordinatorClient,
    CoordinatorClientSettings,
    CoordinatorServer,
    LagInfo,
)
from pykka_delivery.partitions import (
    GroupDelivery,
    GroupMember,
    GroupMemberSettings,
    PartitionedProducer,
    partition_for_key,
)
from tests.harness import wait_until

WAIT = 20.0
NAMESPACE = "test"
STREAM = "orders"
GROUP = "billing"
HOLD = 3  # partition 0's handler holds its 3rd message
CLIENT = CoordinatorClientSettings(
    reconnect_backoff_min=0.01,
    reconnect_backoff_max=0.1,
    request_timeout=WAIT,
    report_interval=0.02,
)
MEMBER = GroupMemberSettings(
    consumer=ConsumerControllerSettings(flow_control_window=20), registration_timeout=WAIT
)


@pytest.fixture
def server() -> Iterator[CoordinatorServer]:
    actor = CoordinatorActor.start()
    server = CoordinatorServer(actor).start()
    yield server
    server.stop()
    actor.stop()


@pytest.fixture
def clients(server: CoordinatorServer) -> Iterator[tuple[CoordinatorClient, CoordinatorClient]]:
    """The producer's client and the member's."""
    producing = CoordinatorClient(server.address, owner="producer", settings=CLIENT)
    consuming = CoordinatorClient(server.address, owner="member", settings=CLIENT)
    yield producing, consuming
    consuming.close()
    producing.close()


def key_of(partition: int) -> str:
    """A key of ``partition`` of a 2-partition stream."""
    return next(
        k for k in (f"k{i}" for i in itertools.count()) if partition_for_key(k, 2) == partition
    )


def figures(rows: tuple[LagInfo, ...]) -> list[tuple[str, str, int, str, int, int, int]]:
    return [
        (r.stream, r.group, r.partition_index, r.producer_id, r.sent, r.confirmed, r.in_flight)
        for r in rows
    ]


class Holder:
    """The member's handler: holds partition 0's message number `HOLD` until released."""

    def __init__(self) -> None:
        self.held = threading.Event()
        self.release = threading.Event()

    def __call__(self, delivery: GroupDelivery) -> None:
        if delivery.partition == 0 and delivery.message == {"n": HOLD}:
            self.held.set()
            assert self.release.wait(WAIT)


def test_lag_shows_per_partition_what_was_sent_confirmed_and_in_flight_until_goodbyes(
    clients: tuple[CoordinatorClient, CoordinatorClient],
) -> None:
    producing, consuming = clients
    holder = Holder()
    caught_up = [
        ("orders-0", GROUP, 0, "orders-0:billing", 6, 6, 0),
        ("orders-1", GROUP, 1, "orders-1:billing", 4, 4, 0),
    ]
    producer = PartitionedProducer(STREAM, 2, [GROUP], coordinator=producing, namespace=NAMESPACE)
    member = GroupMember(
        consuming,
        STREAM,
        2,
        GROUP,
        producer=lambda p: producer.ref(GROUP, p),
        handler=holder,
        namespace=NAMESPACE,
        settings=MEMBER,
    )
    try:
        for n in range(1, 7):
            producer.send({"n": n}, key=key_of(0), timeout=WAIT)
        for n in range(1, 5):
            producer.send({"n": n}, key=key_of(1), timeout=WAIT)
        assert holder.held.wait(WAIT)

        behind = [
            ("orders-0", GROUP, 0, "orders-0:billing", 6, HOLD - 1, 7 - HOLD),
            ("orders-1", GROUP, 1, "orders-1:billing", 4, 4, 0),
        ]
        wait_until(lambda: figures(producing.lag(NAMESPACE)) == behind, "partition 0 behind")
        wait_until(
            lambda: consuming.lag(NAMESPACE)[0].oldest_unconfirmed_age > 0,
            "the held message ageing",
        )

        holder.release.set()
        wait_until(lambda: figures(producing.lag(NAMESPACE)) == caught_up, "partition 0 caught up")
        assert [r.oldest_unconfirmed_age for r in producing.lag(NAMESPACE)] == [0.0, 0.0]
    finally:
        holder.release.set()
        member.close()
        consuming.close()  # goodbye: the consumers' positions go

    # The producer's rows stay, with the group it sends to and its own figures.
    wait_until(lambda: figures(producing.lag(NAMESPACE)) == caught_up, "the producer's rows")
    producer.close()
    producing.close()  # goodbye: the producer's positions go

    with CoordinatorClient(producing.address, settings=CLIENT) as reader:
        # Attached before it closes: closing a client whose stream is still attaching
        # can stall in grpc for the whole close bound.
        assert reader.wait_connected(WAIT)
        assert reader.lag() == ()


def test_a_producer_made_from_the_coordinator_reports_through_its_client(
    clients: tuple[CoordinatorClient, CoordinatorClient],
) -> None:
    producing, _ = clients

    with PartitionedProducer.from_coordinator(
        producing, "payments", ["audit"], create_with=1, namespace=NAMESPACE
    ):
        wait_until(lambda: bool(producing.lag(stream="payments")), "the producer's row")

        (row,) = producing.lag(stream="payments")
        assert (row.namespace, row.stream, row.group, row.partition_index) == (
            NAMESPACE,
            "payments-0",
            "audit",
            0,
        )
        assert (row.sent, row.confirmed, row.in_flight) == (0, 0, 0)


def test_a_partitioned_producer_needs_a_valid_namespace_to_report_under() -> None:
    with pytest.raises(ValueError, match="namespace"):
        PartitionedProducer(STREAM, 1, [GROUP], namespace="")
