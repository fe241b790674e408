"""Producers in the stream catalog and watches of it, through a real `CoordinatorServer`
and `CoordinatorClient`s: pushes on every change, refusals, the rules for connections
that leave, and registrations and watches sent again to a restarted coordinator."""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pykka_delivery.coordinator import (
    CatalogStream,
    CoordinatorActor,
    CoordinatorClient,
    CoordinatorRefused,
    CoordinatorServer,
    CoordinatorServerSettings,
    CoordinatorSettings,
    SqliteCommandLog,
)
from pykka_delivery.testing import TcpProxy
from tests.coordinator.servers import FAST

WAIT = 10.0
TIMEOUT = 0.3  # the coordinator's disconnected timeout here, seconds
NS = "shop"

# What a watch is sent, made comparable: (stream, partitions, ((name, address, count), ...)).
Seen = tuple[tuple[str, int, tuple[tuple[str, str, int], ...]], ...]


class Catalogs:
    """The catalogs a client's watch is sent, in order."""

    def __init__(self) -> None:
        self.queue: queue.Queue[Seen] = queue.Queue()

    def __call__(self, streams: tuple[CatalogStream, ...]) -> None:
        self.queue.put(
            tuple(
                (
                    s.name,
                    s.partitions,
                    tuple((p.name, p.address, p.partitions) for p in s.producers),
                )
                for s in streams
            )
        )

    def until(self, expected: Seen) -> None:
        """Wait for ``expected`` (earlier catalogs may differ: changes come in order)."""
        deadline = time.monotonic() + WAIT
        seen = []
        while time.monotonic() < deadline:
            try:
                got = self.queue.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            if got == expected:
                return
            seen.append(got)
        pytest.fail(f"catalog {expected} never came; got {seen}")


def take_over(client: CoordinatorClient, stream: str, name: str, address: str) -> None:
    """Register ``name`` with ``client``, again while it is refused as held by a connected
    client: the coordinator sees the old holder's stream end a moment after it broke."""
    deadline = time.monotonic() + WAIT
    while True:
        try:
            client.register_producer(stream, name, address, 2, namespace=NS)
            return
        except CoordinatorRefused as refused:
            assert refused.reason == "producer_conflict", refused
            assert time.monotonic() < deadline, "the name was never taken over"
            time.sleep(0.02)


def serve(
    log: SqliteCommandLog | None = None, port: int = 0, timeout: float = TIMEOUT
) -> tuple[CoordinatorServer, object]:
    settings = CoordinatorSettings(disconnected_timeout=timeout, recovery_min_delay=timeout)
    actor = CoordinatorActor.start(log, settings=settings)
    try:
        server = CoordinatorServer(actor, CoordinatorServerSettings(port=port)).start()
    except BaseException:
        actor.stop()
        raise
    return server, actor


@pytest.fixture
def server() -> Iterator[CoordinatorServer]:
    server, actor = serve()
    yield server
    server.stop()
    actor.stop()  # type: ignore[attr-defined]


@pytest.fixture
def patient_server() -> Iterator[CoordinatorServer]:
    """A coordinator that waits a minute for a lost connection: what happens sooner is
    not its timeout."""
    server, actor = serve(timeout=60.0)
    yield server
    server.stop()
    actor.stop()  # type: ignore[attr-defined]


@pytest.fixture
def clients(server: CoordinatorServer) -> Iterator[list[CoordinatorClient]]:
    """Opens 4 clients of ``server``, connected; all closed at the end (again: harmless).
    Connected first: a client closed while it still connects may wait out its close bound
    (a known client issue, about 25 s), which a test that sends nothing would hit."""
    opened = [CoordinatorClient(server.address, settings=FAST) for _ in range(4)]
    for client in opened:
        assert client.wait_connected(10.0)
    yield opened
    for client in opened:
        client.close()


def test_a_watcher_is_sent_the_matching_streams_at_once(clients: list[CoordinatorClient]) -> None:
    watcher, admin, *_ = clients
    admin.create_stream("orders.eu", 2, namespace=NS)
    admin.create_stream("ordersx", 2, namespace=NS)
    catalogs = Catalogs()
    watcher.watch_streams("orders.*", catalogs, namespace=NS)
    catalogs.until((("orders.eu", 2, ()),))


def test_a_watcher_is_pushed_each_producer_registered_changed_and_deregistered(
    clients: list[CoordinatorClient],
) -> None:
    watcher, p1, p2, _ = clients
    p1.create_stream("clicks", 4, namespace=NS)
    catalogs = Catalogs()
    watcher.watch_streams("clicks", catalogs, namespace=NS)
    catalogs.until((("clicks", 4, ()),))

    r1 = p1.register_producer("clicks", "web-1", "10.0.0.1:7001", 2, namespace=NS)
    catalogs.until((("clicks", 4, (("web-1", "10.0.0.1:7001", 2),)),))
    p2.register_producer("clicks", "web-2", "10.0.0.2:7001", 4, namespace=NS)
    catalogs.until((("clicks", 4, (("web-1", "10.0.0.1:7001", 2), ("web-2", "10.0.0.2:7001", 4))),))
    p1.register_producer(
        "clicks", "web-1", "10.0.0.1:7001", 4, namespace=NS, registration_id=r1
    )  # grown
    catalogs.until((("clicks", 4, (("web-1", "10.0.0.1:7001", 4), ("web-2", "10.0.0.2:7001", 4))),))
    p1.deregister_producer("clicks", r1, namespace=NS)
    catalogs.until((("clicks", 4, (("web-2", "10.0.0.2:7001", 4),)),))


def test_a_producer_leaves_at_once_when_its_client_says_goodbye(
    clients: list[CoordinatorClient],
) -> None:
    watcher, producer, *_ = clients
    producer.create_stream("clicks", 2, namespace=NS)
    producer.register_producer("clicks", "web-1", "10.0.0.1:7001", 2, namespace=NS)
    catalogs = Catalogs()
    watcher.watch_streams("clicks", catalogs, namespace=NS)
    catalogs.until((("clicks", 2, (("web-1", "10.0.0.1:7001", 2),)),))

    producer.close()
    catalogs.until((("clicks", 2, ()),))


def test_a_producer_whose_connection_is_lost_leaves_after_the_disconnected_timeout(
    clients: list[CoordinatorClient],
) -> None:
    watcher, producer, *_ = clients
    producer.create_stream("clicks", 2, namespace=NS)
    producer.register_producer("clicks", "web-1", "10.0.0.1:7001", 2, namespace=NS)
    catalogs = Catalogs()
    watcher.watch_streams("clicks", catalogs, namespace=NS)
    catalogs.until((("clicks", 2, (("web-1", "10.0.0.1:7001", 2),)),))

    producer.close(goodbye=False)
    catalogs.until((("clicks", 2, ()),))


def test_a_stream_grown_by_create_stream_is_pushed(clients: list[CoordinatorClient]) -> None:
    watcher, admin, *_ = clients
    admin.create_stream("clicks", 2, namespace=NS)
    catalogs = Catalogs()
    watcher.watch_streams("clicks", catalogs, namespace=NS)
    catalogs.until((("clicks", 2, ()),))

    admin.create_stream("clicks", 6, namespace=NS)
    catalogs.until((("clicks", 6, ()),))


def test_a_stream_created_later_that_matches_the_pattern_is_pushed(
    clients: list[CoordinatorClient],
) -> None:
    watcher, admin, *_ = clients
    catalogs = Catalogs()
    watcher.watch_streams("orders.*", catalogs, namespace=NS)
    catalogs.until(())

    admin.create_stream("orders.us", 3, namespace=NS)
    catalogs.until((("orders.us", 3, ()),))


def test_the_registration_of_a_stream_not_in_the_catalog_is_refused(
    clients: list[CoordinatorClient],
) -> None:
    producer = clients[0]
    with pytest.raises(CoordinatorRefused) as caught:
        producer.register_producer("nope", "web-1", "10.0.0.1:7001", 1, namespace=NS)
    assert caught.value.reason == "stream_not_found"
    assert "create_stream" in caught.value.message


def test_a_second_connected_client_registering_the_same_name_is_refused(
    clients: list[CoordinatorClient],
) -> None:
    first, second, *_ = clients
    first.create_stream("clicks", 2, namespace=NS)
    first.register_producer("clicks", "web-1", "10.0.0.1:7001", 2, namespace=NS)
    with pytest.raises(CoordinatorRefused) as caught:
        second.register_producer("clicks", "web-1", "10.0.0.2:7001", 2, namespace=NS)
    assert caught.value.reason == "producer_conflict"
    assert "its own name" in caught.value.message


def test_a_restarted_producer_takes_its_name_over_from_its_lost_connection(
    patient_server: CoordinatorServer,
) -> None:
    server = patient_server
    with (
        CoordinatorClient(server.address, settings=FAST) as watcher,
        CoordinatorClient(server.address, settings=FAST) as crashed,
    ):
        take_name_over(server, watcher, crashed)


def take_name_over(
    server: CoordinatorServer, watcher: CoordinatorClient, crashed: CoordinatorClient
) -> None:
    crashed.create_stream("clicks", 2, namespace=NS)
    crashed.register_producer("clicks", "web-1", "10.0.0.1:7001", 2, namespace=NS)
    catalogs = Catalogs()
    watcher.watch_streams("clicks", catalogs, namespace=NS)
    catalogs.until((("clicks", 2, (("web-1", "10.0.0.1:7001", 2),)),))
    crashed.close(goodbye=False)

    with CoordinatorClient(server.address, settings=FAST) as restarted:
        take_over(restarted, "clicks", "web-1", "10.0.0.9:7001")
        catalogs.until((("clicks", 2, (("web-1", "10.0.0.9:7001", 2),)),))


def test_more_partitions_than_the_stream_has_are_refused_as_invalid(
    clients: list[CoordinatorClient],
) -> None:
    producer = clients[0]
    producer.create_stream("clicks", 2, namespace=NS)
    with pytest.raises(CoordinatorRefused) as caught:
        producer.register_producer("clicks", "web-1", "10.0.0.1:7001", 3, namespace=NS)
    assert caught.value.reason == "invalid_request"


def test_an_invalid_pattern_is_refused_before_anything_is_sent(
    clients: list[CoordinatorClient],
) -> None:
    with pytest.raises(ValueError, match=r"orders\.\*"):
        clients[0].watch_streams("orders/*", lambda _streams: None)


def test_list_streams_shows_the_producers_of_each_stream(
    clients: list[CoordinatorClient],
) -> None:
    producer = clients[0]
    producer.create_stream("clicks", 2, namespace=NS)
    producer.register_producer("clicks", "web-1", "10.0.0.1:7001", 2, namespace=NS)

    [info] = producer.list_streams(NS)
    assert [(p.name, p.address, p.partitions, p.connection) for p in info.producers] == [
        ("web-1", "10.0.0.1:7001", 2, producer.connection_id)
    ]


def test_registrations_and_watches_are_sent_again_to_a_restarted_coordinator(
    tmp_path: Path,
) -> None:
    """Not stored: the clients register and watch again on their new streams."""
    path = tmp_path / "coordinator.db"
    server, actor = serve(SqliteCommandLog(path))
    port = int(server.address.rsplit(":", 1)[1])
    try:
        with (
            CoordinatorClient(server.address, settings=FAST) as watcher,
            CoordinatorClient(server.address, settings=FAST) as producer,
        ):
            producer.create_stream("clicks", 2, namespace=NS)
            producer.register_producer("clicks", "web-1", "10.0.0.1:7001", 2, namespace=NS)
            catalogs = Catalogs()
            watcher.watch_streams("clicks", catalogs, namespace=NS)
            catalogs.until((("clicks", 2, (("web-1", "10.0.0.1:7001", 2),)),))

            server.stop()
            actor.stop()  # type: ignore[attr-defined]
            catalogs.queue = queue.Queue()  # only what the restarted coordinator sends
            server, actor = serve(SqliteCommandLog(path), port)

            catalogs.until((("clicks", 2, (("web-1", "10.0.0.1:7001", 2),)),))
    finally:
        server.stop()
        actor.stop()  # type: ignore[attr-defined]


def test_a_client_back_after_its_name_was_taken_over_drops_its_registration(
    patient_server: CoordinatorServer, caplog: pytest.LogCaptureFixture
) -> None:
    server = patient_server
    with (
        CoordinatorClient(server.address, settings=FAST) as watcher,
        CoordinatorClient(server.address, settings=FAST) as restarted,
    ):
        come_back(server, watcher, restarted, caplog)


def come_back(
    server: CoordinatorServer,
    watcher: CoordinatorClient,
    restarted: CoordinatorClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    watcher.create_stream("clicks", 2, namespace=NS)
    catalogs = Catalogs()
    watcher.watch_streams("clicks", catalogs, namespace=NS)
    port = int(server.address.rsplit(":", 1)[1])
    with (
        TcpProxy(("127.0.0.1", port)) as proxy,
        CoordinatorClient(f"{proxy.address[0]}:{proxy.address[1]}", settings=FAST) as old,
    ):
        old.register_producer("clicks", "web-1", "10.0.0.1:7001", 2, namespace=NS)
        catalogs.until((("clicks", 2, (("web-1", "10.0.0.1:7001", 2),)),))
        proxy.refuse(True)
        proxy.cut()  # lost, not gone: the coordinator waits for it to come back

        take_over(restarted, "clicks", "web-1", "10.0.0.9:7001")
        catalogs.until((("clicks", 2, (("web-1", "10.0.0.9:7001", 2),)),))

        with caplog.at_level(logging.ERROR, "pykka_delivery.coordinator.client"):
            proxy.refuse(False)
            deadline = time.monotonic() + WAIT
            while "again was refused" not in caplog.text:
                assert time.monotonic() < deadline, "the replayed registration was not refused"
                time.sleep(0.02)
        [info] = watcher.list_streams(NS)
        assert [(p.name, p.address) for p in info.producers] == [("web-1", "10.0.0.9:7001")]
