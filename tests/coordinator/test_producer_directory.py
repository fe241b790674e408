"""Plain producers found through the service directory: `announce_producer` on the
producer's side, `DirectoryProducers` on the consumer's, against a real
`CoordinatorServer`, with the producers on a transport node of their own."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import pytest

from pykka_delivery.coordinator import (
    CoordinatedConsumer,
    CoordinatorClient,
    DirectoryProducers,
    GroupId,
    announce_producer,
)
from pykka_delivery.delivery.core.settings import (
    ConsumerControllerSettings,
    ProducerControllerSettings,
)
from pykka_delivery.delivery.handles.producer import Producer
from pykka_delivery.errors import ClosedError
from pykka_delivery.transport.node import Node
from tests.coordinator.servers import Clients
from tests.harness import wait_until

WAIT = 10.0
KEY = "orders"
GROUP = GroupId("test", "orders", "billing")
CONSUMER = ConsumerControllerSettings(
    flow_control_window=20, resend_interval_min=0.05, resend_interval_max=0.2
)


@pytest.fixture
def made() -> Iterator[list[Producer]]:
    producers: list[Producer] = []
    yield producers
    for producer in producers:
        producer.close()


def start_producer(
    node: Node, producer_id: str, count: int, made: list[Producer]
) -> tuple[Producer, threading.Thread]:
    """A producer exposed on ``node`` sending 0..count-1 from a thread."""
    producer = Producer(
        producer_id,
        ProducerControllerSettings(resend_first_interval=0.05),
        self_ref_factory=node.expose(producer_id),
    )
    made.append(producer)
    sender = threading.Thread(
        target=producer.send_many, args=(list(range(count)), WAIT * 3), daemon=True
    )
    sender.start()
    return producer, sender


def consume(consumer: CoordinatedConsumer, got: dict[str, list[int]]) -> threading.Thread:
    lock = threading.Lock()

    def run() -> None:
        with contextlib.suppress(ClosedError):
            for delivery in consumer:
                with lock:
                    got.setdefault(delivery.producer_id, []).append(delivery.message)
                delivery.confirm()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def ids(directory: DirectoryProducers) -> list[str]:
    return sorted(directory.producers.current())


def test_a_coordinated_consumer_consumes_producers_announced_before_and_after_it_started(
    clients: Clients, nodes: tuple[Node, Node], made: list[Producer]
) -> None:
    producer_node, consumer_node = nodes
    producer_client = clients()
    a, _ = start_producer(producer_node, "orders@web-a", 50, made)
    announce_producer(producer_client, KEY, producer_node, a.producer_id)
    directory = DirectoryProducers(clients(), KEY, consumer_node)
    consumer = CoordinatedConsumer(
        clients(),
        GROUP.namespace,
        GROUP.stream,
        GROUP.name,
        directory.producers,
        settings=CONSUMER,
        node=consumer_node,
    )
    got: dict[str, list[int]] = {}
    thread = consume(consumer, got)
    wait_until(lambda: len(got.get(a.producer_id, [])) == 50, "the first producer consumed")

    b, _ = start_producer(producer_node, "orders@web-b", 50, made)
    announce_producer(producer_client, KEY, producer_node, b.producer_id)
    wait_until(lambda: len(got.get(b.producer_id, [])) == 50, "the announced producer consumed")

    assert got == {a.producer_id: list(range(50)), b.producer_id: list(range(50))}
    assert len(consumer.intervals()) == 1  # followed in the same activation
    consumer.close()
    thread.join(WAIT)
    directory.close()


def test_a_deregistered_producer_leaves_the_set(clients: Clients, nodes: tuple[Node, Node]) -> None:
    producer_node, consumer_node = nodes
    producer_client = clients()
    first = announce_producer(producer_client, KEY, producer_node, "orders@web-a")
    announce_producer(producer_client, KEY, producer_node, "orders@web-b")
    directory = DirectoryProducers(clients(), KEY, consumer_node)
    wait_until(lambda: ids(directory) == ["orders@web-a", "orders@web-b"], "both producers")

    producer_client.deregister_service(KEY, first)

    wait_until(lambda: ids(directory) == ["orders@web-b"], "the deregistered one gone")
    directory.close()


def test_a_producer_leaves_the_set_with_its_clients_connection(
    clients: Clients, nodes: tuple[Node, Node]
) -> None:
    producer_node, consumer_node = nodes
    producer_client = clients()
    announce_producer(producer_client, KEY, producer_node, "orders@web-a")
    directory = DirectoryProducers(clients(), KEY, consumer_node)
    wait_until(lambda: ids(directory) == ["orders@web-a"], "the producer listed")

    producer_client.close()

    wait_until(lambda: ids(directory) == [], "the producer gone with its connection")
    directory.close()


def test_the_set_maps_each_producer_id_to_a_ref_of_its_address(
    clients: Clients, nodes: tuple[Node, Node]
) -> None:
    producer_node, consumer_node = nodes
    announce_producer(clients(), KEY, producer_node, "orders@web-a")
    directory = DirectoryProducers(clients(), KEY, consumer_node)
    wait_until(lambda: ids(directory) == ["orders@web-a"], "the producer listed")

    ref = directory.producers.current()["orders@web-a"]

    assert ref == consumer_node.ref(f"{producer_node.address}/orders@web-a")
    directory.close()


def test_a_listing_that_keeps_an_entry_keeps_its_ref(
    clients: Clients, nodes: tuple[Node, Node]
) -> None:
    producer_node, consumer_node = nodes
    producer_client = clients()
    announce_producer(producer_client, KEY, producer_node, "orders@web-a")
    directory = DirectoryProducers(clients(), KEY, consumer_node)
    wait_until(lambda: ids(directory) == ["orders@web-a"], "the first producer listed")
    before = directory.producers.current()["orders@web-a"]

    announce_producer(producer_client, KEY, producer_node, "orders@web-b")
    wait_until(lambda: len(ids(directory)) == 2, "the second producer listed")

    assert directory.producers.current()["orders@web-a"] is before
    directory.close()


def test_two_directory_producers_on_one_client_and_key_both_follow(
    clients: Clients, nodes: tuple[Node, Node]
) -> None:
    producer_node, consumer_node = nodes
    producer_client, consumer_client = clients(), clients()
    announce_producer(producer_client, KEY, producer_node, "orders@web-a")
    first = DirectoryProducers(consumer_client, KEY, consumer_node)
    wait_until(lambda: ids(first) == ["orders@web-a"], "the first one follows")
    second = DirectoryProducers(consumer_client, KEY, consumer_node)
    wait_until(lambda: ids(second) == ["orders@web-a"], "the second one follows")

    announce_producer(producer_client, KEY, producer_node, "orders@web-b")

    both = ["orders@web-a", "orders@web-b"]
    wait_until(lambda: ids(first) == both and ids(second) == both, "both follow the change")
    first.close()
    second.close()


def test_one_closed_leaves_the_other_on_the_same_client_following(
    clients: Clients, nodes: tuple[Node, Node]
) -> None:
    producer_node, consumer_node = nodes
    producer_client, consumer_client = clients(), clients()
    first = DirectoryProducers(consumer_client, KEY, consumer_node)
    second = DirectoryProducers(consumer_client, KEY, consumer_node)

    first.close()
    announce_producer(producer_client, KEY, producer_node, "orders@web-a")

    wait_until(lambda: ids(second) == ["orders@web-a"], "the other one still follows")
    assert ids(first) == []
    second.close()


def test_an_entry_that_is_not_a_producer_address_is_ignored(
    clients: Clients, nodes: tuple[Node, Node]
) -> None:
    producer_node, consumer_node = nodes
    producer_client = clients()
    producer_client.register_service(KEY, "not-an-address")
    announce_producer(producer_client, KEY, producer_node, "orders@web-a")

    directory = DirectoryProducers(clients(), KEY, consumer_node)

    wait_until(lambda: ids(directory) == ["orders@web-a"], "only the producer listed")
    directory.close()


@pytest.mark.parametrize("producer_id", ["", "a/b"])
def test_announcing_a_producer_id_that_is_no_name_is_refused(
    producer_id: str, clients: Clients, nodes: tuple[Node, Node]
) -> None:
    client = connected(clients)
    with pytest.raises(ValueError, match="without '/'"):
        announce_producer(client, KEY, nodes[0], producer_id)


def test_following_an_empty_key_is_refused(clients: Clients, nodes: tuple[Node, Node]) -> None:
    client = connected(clients)
    with pytest.raises(ValueError, match="service key is empty"):
        DirectoryProducers(client, "", nodes[1])


def connected(clients: Clients) -> CoordinatorClient:
    """A client whose stream is attached: one closed while it still connects can take
    close_timeout several times over to close (a client issue, not this module's)."""
    client = clients()
    assert client.wait_connected(WAIT)
    return client
