"""The metrics endpoint, scraped with a real HTTP GET and parsed as Prometheus text: what
real nodes, handles and a coordinator server counted shows under the documented names.

Every test serves a registry of its own (port 0), and reads only the series labelled with
names it made up, since the objects of other tests may still be alive in the process.
"""

from __future__ import annotations

import asyncio
import threading
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from pykka_delivery import AsyncConsumer, AsyncProducer, Consumer, Producer, metrics
from pykka_delivery.coordinator import (
    CoordinatorActor,
    CoordinatorClient,
    CoordinatorClientSettings,
    CoordinatorServer,
    GroupId,
    ProducerPosition,
)
from pykka_delivery.testing import TcpProxy
from pykka_delivery.transport import Node, NodeSettings
from tests.harness import wait_until
from tests.transport.test_node import Sink, free_port

WAIT = 20.0

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(server: metrics.MetricsServer) -> Samples:
    """Every sample of ``server``'s page: (sample name, labels) -> value."""
    with urllib.request.urlopen(server.url, timeout=WAIT) as response:
        assert response.status == 200
        text = response.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


@pytest.fixture
def endpoint() -> Iterator[metrics.MetricsServer]:
    with metrics.serve(port=0, registry=CollectorRegistry()) as server:
        yield server


@pytest.fixture
def nodes() -> Iterator[tuple[Node, Node]]:
    with Node() as a, Node() as b:
        yield a, b


def send_and_consume(producer: Producer, consumer: Consumer, count: int) -> None:
    """``count`` messages from ``producer`` to ``consumer``, each confirmed."""
    sender = threading.Thread(
        target=lambda: [producer.send({"n": n}, timeout=WAIT) for n in range(count)], daemon=True
    )
    sender.start()
    for _ in range(count):
        consumer.receive(timeout=WAIT).confirm()
    sender.join(WAIT)


def test_a_scrape_shows_the_messages_a_producer_sent_and_a_consumer_confirmed(
    endpoint: metrics.MetricsServer, nodes: tuple[Node, Node]
) -> None:
    a, b = nodes
    producer = Producer("scrape-orders", self_ref_factory=a.expose("scrape-orders"))
    consumer = Consumer(self_ref_factory=b.expose("scrape-consumer"))
    consumer.register_to(b.ref(f"{a.address}/scrape-orders"))

    send_and_consume(producer, consumer, 25)

    samples = scrape(endpoint)
    assert value(samples, "pykka_delivery_messages_sent_total", producer_id="scrape-orders") == 25
    labels = {"consumer": f"{b.address}/scrape-consumer", "producer_id": "scrape-orders"}
    assert value(samples, "pykka_delivery_messages_delivered_total", **labels) == 25
    assert value(samples, "pykka_delivery_messages_confirmed_total", **labels) == 25
    assert value(samples, "pykka_delivery_consumer_in_flight", **labels) == 0
    consumer.close()
    producer.close()


def test_a_scrape_counts_the_registrations_a_producer_refused_for_an_older_epoch(
    endpoint: metrics.MetricsServer, nodes: tuple[Node, Node]
) -> None:
    a, b = nodes
    producer = Producer("scrape-fenced", self_ref_factory=a.expose("scrape-fenced"))
    newer = Consumer(self_ref_factory=b.expose("scrape-newer"), epoch=2)
    newer.register_to(b.ref(f"{a.address}/scrape-fenced"))
    wait_until(lambda: producer.snapshot().epoch == 2, "the epoch-2 registration", WAIT)
    older = Consumer(self_ref_factory=b.expose("scrape-older"), epoch=1)
    older.register_to(b.ref(f"{a.address}/scrape-fenced"))

    wait_until(
        lambda: (
            value(
                scrape(endpoint),
                "pykka_delivery_producer_fenced_total",
                producer_id="scrape-fenced",
            )
            == 1
        ),
        "the refused epoch-1 registration counted",
        WAIT,
    )
    older.close()
    newer.close()
    producer.close()


def test_a_scrape_shows_frames_and_bytes_per_link_between_two_nodes(
    endpoint: metrics.MetricsServer, nodes: tuple[Node, Node]
) -> None:
    a, b = nodes
    producer = Producer("scrape-links", self_ref_factory=a.expose("scrape-links"))
    consumer = Consumer(self_ref_factory=b.expose("scrape-links-consumer"))
    consumer.register_to(b.ref(f"{a.address}/scrape-links"))

    send_and_consume(producer, consumer, 10)

    samples = scrape(endpoint)
    link = {"node": a.address, "peer": b.address}
    frames = value(samples, "pykka_delivery_link_frames_sent_total", **link)
    assert frames is not None and frames > 0
    sent_bytes = value(samples, "pykka_delivery_link_bytes_sent_total", **link)
    assert sent_bytes is not None and sent_bytes > 10 * len('{"n": 0}')
    assert value(samples, "pykka_delivery_link_up", **link) == 1
    assert value(samples, "pykka_delivery_link_reconnects_total", **link) == 0
    received = value(
        samples, "pykka_delivery_link_frames_received_total", node=b.address, peer=a.address
    )
    assert received is not None and received >= frames
    node_frames = value(samples, "pykka_delivery_node_frames_sent_total", node=a.address)
    assert node_frames is not None and node_frames >= frames
    consumer.close()
    producer.close()


def test_a_link_cut_and_opened_again_counts_as_a_reconnect_of_that_peer(
    endpoint: metrics.MetricsServer,
) -> None:
    port = free_port()
    with TcpProxy(("127.0.0.1", port)) as proxy:
        via_proxy = f"{proxy.address[0]}:{proxy.address[1]}"
        settings = NodeSettings(reconnect_backoff_min=0.01, reconnect_backoff_max=0.1)
        with Node(settings) as a, Node(NodeSettings(port=port, advertised_address=via_proxy)) as b:
            sink = Sink()
            b.register("sink", sink)
            ref = a.ref(f"{via_proxy}/sink")
            ref.tell("before the cut")
            sink.wait(1)

            proxy.cut()
            wait_until(lambda: not a.is_linked(via_proxy), "the link seen down")
            ref.tell("after the cut")
            sink.wait(2)

            samples = scrape(endpoint)

    link = {"node": a.address, "peer": via_proxy}
    assert value(samples, "pykka_delivery_link_reconnects_total", **link) == 1
    assert value(samples, "pykka_delivery_link_losses_total", **link) == 1
    assert value(samples, "pykka_delivery_link_up", **link) == 1


def test_a_producer_waiting_for_confirmations_shows_them_in_flight_with_an_age(
    endpoint: metrics.MetricsServer,
) -> None:
    producer = Producer("scrape-in-flight")
    consumer = Consumer()
    consumer.register_to(producer.ref)
    sender = threading.Thread(
        target=lambda: [producer.send(n, timeout=WAIT) for n in range(3)], daemon=True
    )
    sender.start()
    consumer.receive(timeout=WAIT)  # never confirmed: its Request opens the window
    sender.join(WAIT)

    first = scrape(endpoint)
    wait_until(
        lambda: (
            (
                value(
                    scrape(endpoint),
                    "pykka_delivery_producer_oldest_unconfirmed_age_seconds",
                    producer_id="scrape-in-flight",
                )
                or 0
            )
            > 0
        ),
        "an age above 0 at a later scrape",
    )

    assert value(first, "pykka_delivery_producer_in_flight", producer_id="scrape-in-flight") == 3
    window = value(first, "pykka_delivery_producer_window", producer_id="scrape-in-flight")
    assert window == consumer.snapshot().requested_seq_nr
    consumer.close()
    producer.close()


def test_two_producers_of_one_id_show_as_one_series_adding_up(
    endpoint: metrics.MetricsServer,
) -> None:
    pairs = [(Producer("scrape-twice"), Consumer()) for _ in range(2)]
    for producer, consumer in pairs:
        consumer.register_to(producer.ref)
        send_and_consume(producer, consumer, 3)

    samples = scrape(endpoint)

    sent = [
        v
        for (name, labels), v in samples.items()
        if name == "pykka_delivery_messages_sent_total"
        and ("producer_id", "scrape-twice") in labels
    ]
    assert sent == [6]
    for producer, consumer in pairs:
        consumer.close()
        producer.close()


def test_a_scrape_shows_the_coordinators_groups_consumers_and_activations(
    endpoint: metrics.MetricsServer,
) -> None:
    actor = CoordinatorActor.start()
    server = CoordinatorServer(actor).start()
    client = CoordinatorClient(server.address)
    try:
        group = GroupId("scrape", "orders", "billing")
        client.register(group, client.next_subscription_id(), lambda update: None, timeout=WAIT)

        samples = scrape(endpoint)
    finally:
        client.close()
        server.stop()
        actor.stop()

    labels = {"coordinator": server.address}
    assert value(samples, "pykka_delivery_coordinator_groups", **labels) == 1
    consumers = "pykka_delivery_coordinator_consumers"
    assert value(samples, consumers, state="active", **labels) == 1
    assert value(samples, consumers, state="waiting", **labels) == 0
    assert value(samples, "pykka_delivery_coordinator_rebalances_total", **labels) == 1
    assert value(samples, "pykka_delivery_coordinator_streams_attached_total", **labels) == 1
    histogram = "pykka_delivery_coordinator_handover_duration_seconds_count"
    assert value(samples, histogram, **labels) == 0


def test_a_scrape_shows_the_lag_reported_to_a_coordinator(
    endpoint: metrics.MetricsServer,
) -> None:
    actor = CoordinatorActor.start()
    server = CoordinatorServer(actor).start()
    settings = CoordinatorClientSettings(report_interval=0.02)
    client = CoordinatorClient(server.address, settings=settings)
    try:
        position = ProducerPosition("scrape", "orders-0", 0, "orders-0:billing", 10, 4, 1.5)
        client.report_positions([position])
        wait_until(lambda: bool(server.lag()), "the reported position")

        samples = scrape(endpoint)
    finally:
        client.close()
        server.stop()
        actor.stop()

    row = {
        "coordinator": server.address,
        "namespace": "scrape",
        "stream": "orders-0",
        "group": "",
        "partition": "0",
        "producer_id": "orders-0:billing",
    }
    assert value(samples, "pykka_delivery_lag_in_flight", **row) == 6
    assert value(samples, "pykka_delivery_lag_oldest_unconfirmed_age_seconds", **row) == 1.5


def test_asyncio_handles_are_read_on_their_event_loop(
    endpoint: metrics.MetricsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    read_on: list[asyncio.AbstractEventLoop | None] = []
    statistics = AsyncProducer.statistics

    def recording(self: AsyncProducer) -> Any:
        try:
            read_on.append(asyncio.get_running_loop())
        except RuntimeError:  # read from a thread without a loop: the scrape's own
            read_on.append(None)
        return statistics(self)

    monkeypatch.setattr(AsyncProducer, "statistics", recording)

    async def run() -> tuple[Samples, asyncio.AbstractEventLoop]:
        producer = AsyncProducer("scrape-async")
        consumer = AsyncConsumer()
        consumer.register_to(producer.ref)
        for n in range(5):
            await producer.send(n, timeout=WAIT)
            (await consumer.receive(timeout=WAIT)).confirm()
        samples = await asyncio.to_thread(scrape, endpoint)  # the loop runs meanwhile
        consumer.close()
        producer.close()
        return samples, asyncio.get_running_loop()

    samples, loop = asyncio.run(run())

    assert read_on, "the producer's statistics were not read"
    assert set(read_on) == {loop}, "read off the handle's loop"

    assert value(samples, "pykka_delivery_messages_sent_total", producer_id="scrape-async") == 5
    delivered = value(
        samples, "pykka_delivery_messages_delivered_total", consumer="", producer_id="scrape-async"
    )
    assert delivered == 5


def test_a_handle_whose_loop_does_not_run_is_left_out_and_the_scrape_still_answers() -> None:
    loop = asyncio.new_event_loop()

    async def make() -> Any:
        return AsyncProducer("scrape-stalled-loop")

    producer = loop.run_until_complete(make())  # the loop stops here, not closed
    with metrics.serve(port=0, registry=CollectorRegistry(), read_timeout=0.05) as server:
        samples = scrape(server)
    loop.close()

    assert (
        value(samples, "pykka_delivery_messages_sent_total", producer_id="scrape-stalled-loop")
        is None
    )
    assert producer.producer_id == "scrape-stalled-loop"
