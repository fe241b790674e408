"""The coordinator's service directory: the pure bookkeeping, the actor's rules (who is
sent which listing, when entries leave), and the service and client end to end.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from typing import Any

import pykka
import pytest

from pykka_delivery.coordinator import (
    OK,
    CoordinatorActor,
    CoordinatorClient,
    CoordinatorServer,
    CoordinatorServerSettings,
    CoordinatorSettings,
)
from pykka_delivery.coordinator.actor import (
    Attach,
    DeregisterService,
    Detach,
    RegisterService,
    UnwatchService,
    WatchService,
)
from pykka_delivery.coordinator.directory import ServiceDirectory, ServiceEntry, ServiceKey
from pykka_delivery.coordinator.effects import SendConsumerUpdate
from tests.coordinator.servers import FAST

WAIT = 10.0
TIMEOUT = 0.3  # the coordinator's disconnected timeout here, seconds
KEY = ServiceKey("ns", "resize")
OTHER = ServiceKey("ns", "encode")


def entry(connection: str, registration_id: int = 1, address: str = "") -> ServiceEntry:
    return ServiceEntry(
        address or f"127.0.0.1:1/{connection}-{registration_id}", connection, registration_id
    )


# --- the pure directory -----------------------------------------------------------------


def test_entries_are_listed_in_registration_order_and_replaced_by_identity() -> None:
    d = ServiceDirectory()
    assert d.register(KEY, entry("a")) is True
    assert d.register(KEY, entry("b")) is True
    assert d.register(KEY, entry("a")) is False, "the same entry again changes nothing"
    assert d.register(KEY, entry("a", address="127.0.0.1:2/moved")) is True
    assert [(e.connection, e.address) for e in d.listing(KEY)] == [
        ("a", "127.0.0.1:2/moved"),
        ("b", "127.0.0.1:1/b-1"),
    ]
    assert d.listing(OTHER) == ()


def test_deregister_and_dropping_a_connection_report_the_keys_that_changed() -> None:
    d = ServiceDirectory()
    d.register(KEY, entry("a", 1))
    d.register(KEY, entry("a", 2))
    d.register(OTHER, entry("a", 3))
    d.register(OTHER, entry("b", 1))
    assert d.deregister(KEY, "a", 9) is False
    assert d.deregister(KEY, "a", 2) is True
    assert d.has_entries("a") and d.has_entries("b") and not d.has_entries("c")

    assert d.drop_entries("a") == [OTHER, KEY]
    assert d.listing(KEY) == ()
    assert [e.connection for e in d.listing(OTHER)] == ["b"]
    assert d.drop_entries("a") == []


def test_watches_belong_to_connections() -> None:
    d = ServiceDirectory()
    d.watch(KEY, "w1")
    d.watch(KEY, "w2")
    d.watch(OTHER, "w1")
    assert d.watchers(KEY) == {"w1", "w2"}
    assert d.watched_by("w1") == [OTHER, KEY]
    d.drop_watches("w1")
    assert d.watchers(KEY) == {"w2"} and d.watchers(OTHER) == frozenset()
    d.unwatch(KEY, "w2")
    d.unwatch(KEY, "w2")
    assert d.watchers(KEY) == frozenset()


def test_bad_keys_and_entries_are_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match="service key is empty"):
        ServiceKey("ns", "")
    with pytest.raises(ValueError, match="address is empty"):
        ServiceEntry("", "a", 1)
    with pytest.raises(ValueError, match="registration_id"):
        ServiceEntry("x", "a", -1)


# --- the actor ----------------------------------------------------------------------------


class ListingSink:
    """A `ConnectionSink` that queues the listings it is sent."""

    def __init__(self) -> None:
        self.listings: queue.Queue[tuple[ServiceKey, tuple[str, ...]]] = queue.Queue()

    def send_update(self, update: SendConsumerUpdate) -> None:
        pass

    def send_listing(self, key: ServiceKey, entries: tuple[ServiceEntry, ...]) -> None:
        self.listings.put((key, tuple(e.connection for e in entries)))

    def next(self) -> tuple[ServiceKey, tuple[str, ...]]:
        return self.listings.get(timeout=WAIT)


@pytest.fixture
def coordinator() -> Iterator[pykka.ActorRef[Any]]:
    settings = CoordinatorSettings(disconnected_timeout=TIMEOUT, recovery_min_delay=TIMEOUT)
    ref = CoordinatorActor.start(settings=settings)
    yield ref
    ref.stop()


def test_a_watcher_is_sent_the_listing_at_once_and_after_each_change(
    coordinator: pykka.ActorRef[Any],
) -> None:
    watcher = ListingSink()
    coordinator.ask(Attach("w", watcher))
    for name in ("a", "b"):
        coordinator.ask(Attach(name, ListingSink()))

    assert coordinator.ask(WatchService(KEY, "w")) is OK
    assert watcher.next() == (KEY, ())
    coordinator.ask(RegisterService(KEY, entry("a")))
    assert watcher.next() == (KEY, ("a",))
    coordinator.ask(RegisterService(KEY, entry("a")))  # no change: no listing
    coordinator.ask(RegisterService(OTHER, entry("b")))  # not watched
    coordinator.ask(RegisterService(KEY, entry("b")))
    assert watcher.next() == (KEY, ("a", "b"))
    coordinator.ask(DeregisterService(KEY, "a", 1))
    assert watcher.next() == (KEY, ("b",))
    coordinator.ask(UnwatchService(KEY, "w"))
    coordinator.ask(DeregisterService(KEY, "b", 1))
    coordinator.ask(WatchService(OTHER, "w"))
    assert watcher.next() == (OTHER, ("b",)), "nothing came for the unwatched key meanwhile"


def test_a_goodbye_removes_entries_at_once_a_lost_connection_after_the_timeout(
    coordinator: pykka.ActorRef[Any],
) -> None:
    watcher = ListingSink()
    coordinator.ask(Attach("w", watcher))
    a, b = ListingSink(), ListingSink()
    coordinator.ask(Attach("a", a))
    coordinator.ask(Attach("b", b))
    coordinator.ask(RegisterService(KEY, entry("a")))
    coordinator.ask(RegisterService(KEY, entry("b")))
    coordinator.ask(WatchService(KEY, "w"))
    assert watcher.next() == (KEY, ("a", "b"))

    coordinator.ask(Detach("a", a, lost=False))
    assert watcher.next() == (KEY, ("b",)), "goodbye: at once"

    lost_at = time.monotonic()
    coordinator.ask(Detach("b", b, lost=True))
    assert watcher.next() == (KEY, ())
    assert time.monotonic() - lost_at >= TIMEOUT, "lost: only after disconnected_timeout"


def test_a_lost_connection_that_comes_back_in_time_keeps_its_entries(
    coordinator: pykka.ActorRef[Any],
) -> None:
    watcher = ListingSink()
    coordinator.ask(Attach("w", watcher))
    a = ListingSink()
    coordinator.ask(Attach("a", a))
    coordinator.ask(RegisterService(KEY, entry("a")))
    coordinator.ask(WatchService(KEY, "w"))
    assert watcher.next() == (KEY, ("a",))

    coordinator.ask(Detach("a", a, lost=True))
    coordinator.ask(Attach("a", ListingSink()))
    time.sleep(TIMEOUT * 2)
    assert watcher.listings.empty(), "the entry never left"


def test_a_watcher_that_attaches_again_is_sent_its_listings_again(
    coordinator: pykka.ActorRef[Any],
) -> None:
    first = ListingSink()
    coordinator.ask(Attach("w", first))
    coordinator.ask(WatchService(KEY, "w"))
    assert first.next() == (KEY, ())
    coordinator.ask(Detach("w", first, lost=True))
    coordinator.ask(Attach("x", ListingSink()))
    coordinator.ask(RegisterService(KEY, entry("x")))  # while w has no sink

    second = ListingSink()
    coordinator.ask(Attach("w", second))
    assert second.next() == (KEY, ("x",))


# --- service and client -----------------------------------------------------------------


@pytest.fixture
def server() -> Iterator[CoordinatorServer]:
    settings = CoordinatorSettings(disconnected_timeout=TIMEOUT, recovery_min_delay=TIMEOUT)
    actor = CoordinatorActor.start(settings=settings)
    server = CoordinatorServer(actor, CoordinatorServerSettings()).start()
    yield server
    server.stop()
    actor.stop()


class Listings:
    """The listings a client's watch is sent, as sorted address tuples."""

    def __init__(self) -> None:
        self.queue: queue.Queue[tuple[str, ...]] = queue.Queue()

    def __call__(self, entries: tuple[ServiceEntry, ...]) -> None:
        self.queue.put(tuple(sorted(e.address for e in entries)))

    def until(self, expected: tuple[str, ...]) -> None:
        """Wait for ``expected`` (earlier listings may differ: changes come in order)."""
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
        pytest.fail(f"listing {expected} never came; got {seen}")


def test_workers_register_and_a_watcher_follows_them_over_grpc(server: CoordinatorServer) -> None:
    with (
        CoordinatorClient(server.address, settings=FAST) as watcher,
        CoordinatorClient(server.address, settings=FAST) as worker1,
        CoordinatorClient(server.address, settings=FAST) as worker2,
    ):
        listings = Listings()
        watcher.watch_service("resize", listings, namespace="ns")
        listings.until(())
        r1 = worker1.register_service("resize", "127.0.0.1:1/w1", namespace="ns")
        listings.until(("127.0.0.1:1/w1",))
        worker2.register_service("resize", "127.0.0.1:2/w2", namespace="ns")
        listings.until(("127.0.0.1:1/w1", "127.0.0.1:2/w2"))
        worker1.deregister_service("resize", r1, namespace="ns")
        listings.until(("127.0.0.1:2/w2",))
        worker2.close()  # goodbye
        listings.until(())


def test_entries_of_a_client_gone_without_goodbye_leave_after_the_timeout(
    server: CoordinatorServer,
) -> None:
    with CoordinatorClient(server.address, settings=FAST) as watcher:
        listings = Listings()
        watcher.watch_service("resize", listings)
        worker = CoordinatorClient(server.address, settings=FAST)
        worker.register_service("resize", "127.0.0.1:1/w1")
        listings.until(("127.0.0.1:1/w1",))
        worker.close(goodbye=False)
        listings.until(())


def test_registrations_and_watches_are_replayed_to_a_restarted_coordinator() -> None:
    """The directory is not stored: the clients register and watch again."""
    settings = CoordinatorSettings(disconnected_timeout=TIMEOUT, recovery_min_delay=TIMEOUT)
    actor = CoordinatorActor.start(settings=settings)
    server = CoordinatorServer(actor, CoordinatorServerSettings()).start()
    port = int(server.address.rsplit(":", 1)[1])
    try:
        with (
            CoordinatorClient(server.address, settings=FAST) as watcher,
            CoordinatorClient(server.address, settings=FAST) as worker,
        ):
            listings = Listings()
            watcher.watch_service("resize", listings)
            worker.register_service("resize", "127.0.0.1:1/w1")
            listings.until(("127.0.0.1:1/w1",))

            server.stop()
            actor.stop()
            actor = CoordinatorActor.start(settings=settings)
            server = CoordinatorServer(actor, CoordinatorServerSettings(port=port)).start()

            listings.until(("127.0.0.1:1/w1",))
    finally:
        server.stop()
        actor.stop()


def test_an_empty_service_key_is_refused_before_anything_is_sent(
    server: CoordinatorServer,
) -> None:
    with CoordinatorClient(server.address, settings=FAST) as client:
        with pytest.raises(ValueError, match="service key is empty"):
            client.watch_service("", lambda _entries: None)
        with pytest.raises(ValueError, match="address is empty"):
            client.register_service("resize", "")
