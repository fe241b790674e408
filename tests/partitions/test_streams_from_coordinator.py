"""A partitioned producer and a group member built from the coordinator's stream catalog.

`PartitionedProducer.from_coordinator` and `GroupMember.from_coordinator` take the
partition count from the catalog (creating the stream with ``create_with`` if it is
missing), so a producer and its members in different processes agree on it without a
shared config file. One process here: a coordinator server, a client, a producer and a
member reached through ``partitioned.ref``. No original scenario (Pekko has no
partitioned streams; see docs/partitions.md).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from pykka_delivery import ConsumerControllerSettings, ProducerControllerSettings
from pykka_delivery.coordinator import (
    CoordinatorActor,
    CoordinatorClient,
    CoordinatorClientSettings,
    CoordinatorRefused,
    CoordinatorServer,
    CoordinatorServerSettings,
    CoordinatorSettings,
    Refusal,
)
from pykka_delivery.partitions import (
    GroupDelivery,
    GroupMember,
    GroupMemberSettings,
    PartitionedProducer,
    PartitionedProducerSettings,
    partition_for_key,
)
from pykka_delivery.partitions.producer import catalog_partitions

WAIT = 20.0
STREAM = "orders"
GROUP = "billing"
FAST_CLIENT = CoordinatorClientSettings(
    reconnect_backoff_min=0.01, reconnect_backoff_max=0.1, request_timeout=WAIT
)
MEMBER_SETTINGS = GroupMemberSettings(
    consumer=ConsumerControllerSettings(
        flow_control_window=10, resend_interval_min=0.1, resend_interval_max=0.5
    ),
    close_grace=5.0,
    retry_backoff_min=0.01,
    retry_backoff_max=0.05,
    registration_timeout=WAIT,
)
PRODUCER_SETTINGS = PartitionedProducerSettings(
    producer=ProducerControllerSettings(resend_first_interval=0.1)
)


@pytest.fixture
def client() -> Iterator[CoordinatorClient]:
    actor = CoordinatorActor.start(settings=CoordinatorSettings(max_partitions=64))
    server = CoordinatorServer(actor, CoordinatorServerSettings()).start()
    client = CoordinatorClient(server.address, settings=FAST_CLIENT)
    try:
        yield client
    finally:
        client.close()
        server.stop()
        actor.stop()


def test_producer_and_member_from_the_catalog_deliver_keyed_messages(
    client: CoordinatorClient,
) -> None:
    handled: list[GroupDelivery] = []
    lock = threading.Lock()

    def handle(delivery: GroupDelivery) -> None:
        with lock:
            handled.append(delivery)

    producer = PartitionedProducer.from_coordinator(
        client,
        STREAM,
        [GROUP],
        catalog_namespace="shop",
        create_with=3,
        settings=PRODUCER_SETTINGS,
    )
    try:
        member = GroupMember.from_coordinator(
            client,
            STREAM,
            GROUP,
            producer=lambda p: producer.ref(GROUP, p),
            handler=handle,
            catalog_namespace="shop",
            settings=MEMBER_SETTINGS,
        )
        try:
            assert producer.partitions == member.partitions == 3
            assert client.stream_partitions(STREAM, namespace="shop") == 3
            keys = [f"customer-{n % 5}" for n in range(12)]
            for number, key in enumerate(keys):
                assert producer.send(number, key=key, timeout=WAIT) == partition_for_key(key, 3)
            deadline = time.monotonic() + WAIT
            while True:
                with lock:
                    if len(handled) >= len(keys):
                        break
                assert time.monotonic() < deadline, f"only {len(handled)} of {len(keys)} handled"
                time.sleep(0.01)
        finally:
            member.close(grace=1.0)
    finally:
        producer.close()

    assert sorted(d.message for d in handled) == list(range(12))
    for delivery in handled:
        assert delivery.key == keys[delivery.message]
        assert delivery.partition == partition_for_key(keys[delivery.message], 3)
    for partition in range(3):
        in_partition = [d.message for d in handled if d.partition == partition]
        assert in_partition == sorted(in_partition)  # per-partition (and per-key) order


def test_a_missing_stream_without_create_with_names_the_fix(client: CoordinatorClient) -> None:
    with pytest.raises(KeyError, match="create_with"):
        PartitionedProducer.from_coordinator(client, STREAM, [GROUP])
    with pytest.raises(KeyError, match=r"client\.create_stream"):
        GroupMember.from_coordinator(
            client,
            STREAM,
            GROUP,
            producer=lambda p: pytest.fail("not reached"),
            handler=lambda d: None,
        )
    assert client.list_streams() == ()


def test_create_with_keeps_the_count_of_an_existing_stream(client: CoordinatorClient) -> None:
    """A stream grown meanwhile keeps its larger count: create_with never shrinks it."""
    client.create_stream(STREAM, 2)
    client.create_stream(STREAM, 4)

    assert catalog_partitions(client, STREAM, create_with=2) == 4
    assert catalog_partitions(client, STREAM) == 4
    assert client.stream_partitions(STREAM) == 4


def test_create_with_above_the_coordinators_limit_is_refused(client: CoordinatorClient) -> None:
    with pytest.raises(CoordinatorRefused) as caught:
        PartitionedProducer.from_coordinator(client, STREAM, [GROUP], create_with=65)

    assert caught.value.refusal is Refusal.PARTITIONS_OVER_LIMIT
    assert client.list_streams() == ()
